//! Reporting for `rill-bench`: the JSON records it writes (and reads back), one SVG plot of
//! effective bandwidth per op, and a Markdown section spliced into a document such as
//! `docs/PERF.md`.
//!
//! Malformed input gives `Err`, odd records (NaN, empty shapes) are skipped or shown as gaps,
//! nothing panics.

use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::error::Error;
use std::fmt::Write as _;

/// One measurement, as one object of the benchmark's JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Kernel name, or "copy" for the device-to-device copy that is the ceiling.
    pub op: String,
    /// Element type: "f32", "f16", "bf16".
    pub dtype: String,
    /// `[n]` for elementwise ops, `[rows, cols]` for row ops; in the JSON a string such as
    /// "[49152, 1024]", the spelling the records have always had (older records: a number "len").
    #[serde(alias = "len", serialize_with = "write_shape", deserialize_with = "read_shape")]
    pub shape: Vec<usize>,
    /// How the kernel was launched (e.g. "warp path: ..."), or "-" where there is no choice
    /// (and in older records, which have none).
    #[serde(default = "no_path")]
    pub path: String,
    /// Median device time of one launch.
    #[serde(serialize_with = "rounded::<3, _>")]
    pub micros: f64,
    /// Effective bandwidth: bytes the op must move over `micros`.
    #[serde(serialize_with = "rounded::<1, _>")]
    pub gbps: f64,
    /// `gbps` over the copy's at the same shape and dtype (1 for the copy itself).
    #[serde(serialize_with = "rounded::<4, _>")]
    pub of_copy: f64,
    /// Whose kernel: [`RILL`], or a peer's name ("torch eager", "torch.compile", "Liger",
    /// "QuACK"), timed on rill's shapes and charged rill's byte count. Left out of the JSON
    /// for rill's own records, so earlier runs read back unchanged.
    #[serde(default = "rill", skip_serializing_if = "is_rill")]
    pub implementation: String,
}

/// The implementation name of rill's own records.
pub const RILL: &str = "rill";

fn rill() -> String {
    RILL.into()
}

fn is_rill(implementation: &str) -> bool {
    implementation == RILL
}

/// The op name of the ceiling rows.
pub const COPY: &str = "copy";

/// Dimensions before the last: empty for elementwise ops, `[rows]` for row ops.
fn leading(record: &Record) -> &[usize] {
    &record.shape[..record.shape.len().saturating_sub(1)]
}

/// The last dimension: n for elementwise ops, cols for row ops (0 for an empty shape).
fn extent(record: &Record) -> usize {
    record.shape.last().copied().unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// JSON
// ---------------------------------------------------------------------------------------------

/// Parses the JSON the benchmark writes: an array of objects with the fields of [`Record`].
/// Also reads the older format with a number "len" instead of "shape" and no "path" (taken as
/// "-"), so earlier runs stay readable. Unknown keys are ignored so a newer writer's extra
/// fields don't break an older reader; errors name the line and column.
pub fn parse(json: &str) -> serde_json::Result<Vec<Record>> {
    serde_json::from_str(json)
}

/// Serializes records one object per line, so runs diff line by line.
pub fn to_json(records: &[Record]) -> serde_json::Result<String> {
    let mut out = String::from("[\n");
    for (i, record) in records.iter().enumerate() {
        let comma = if i + 1 < records.len() { "," } else { "" };
        let _ = writeln!(out, "  {}{comma}", serde_json::to_string(record)?);
    }
    out.push_str("]\n");
    Ok(out)
}

fn no_path() -> String {
    "-".into()
}

/// "[49152, 1024]": the shape as the benchmark's JSON writes it.
fn write_shape<S: Serializer>(shape: &[usize], serializer: S) -> Result<S::Ok, S::Error> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    serializer.serialize_str(&format!("[{}]", dims.join(", ")))
}

/// The inverse of [`write_shape`], or an older record's "len".
fn read_shape<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<usize>, D::Error> {
    let value = serde_json::Value::deserialize(deserializer)?;
    let shape = match &value {
        serde_json::Value::String(text) => parse_shape(text),
        serde_json::Value::Number(len) => len.as_u64().and_then(|len| Some(vec![usize::try_from(len).ok()?])),
        _ => None,
    };
    shape.ok_or_else(|| D::Error::custom(format!("\"shape\" must be a string like \"[49152, 1024]\", not {value}")))
}

/// A shape as [`write_shape`] writes it; `None` unless it is a non-empty list of plain integers.
fn parse_shape(text: &str) -> Option<Vec<usize>> {
    let inner = text.trim().strip_prefix('[')?.strip_suffix(']')?;
    inner
        .split(',')
        .map(|dim| {
            let dim = dim.trim();
            let digits = !dim.is_empty() && dim.bytes().all(|b| b.is_ascii_digit());
            if digits { dim.parse().ok() } else { None }
        })
        .collect()
}

/// The value to `DECIMALS` decimals, the precision the records have always had (more digits
/// would be noise). Non-finite values, which no measurement produces, are written as `null`,
/// which `parse` rejects.
fn rounded<const DECIMALS: usize, S: Serializer>(value: &f64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(format!("{value:.DECIMALS$}").parse().unwrap_or(*value))
}

// ---------------------------------------------------------------------------------------------
// Grouping shared by the plots and the tables
// ---------------------------------------------------------------------------------------------

/// Distinct values in order of first appearance (the benchmark's order is meaningful: it
/// sweeps sizes upward and dtypes from f32 down).
fn distinct<T: PartialEq + Copy>(values: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut seen = Vec::new();
    for value in values {
        if !seen.contains(&value) {
            seen.push(value);
        }
    }
    seen
}

/// The leading dimensions (rows) most of the op's records share, earliest on a tie: the
/// records with them form one sweep over the last dimension. Empty for elementwise ops.
fn sweep_rows<'a>(records: &'a [Record], op: &str) -> &'a [usize] {
    let rows = || records.iter().filter(|r| r.op == op).map(leading);
    let count = |group: &[usize]| rows().filter(|rows| *rows == group).count();
    // `max_by_key` keeps the last of equal counts, so the groups are searched from the last.
    distinct(rows()).into_iter().rev().max_by_key(|group| count(group)).unwrap_or(&[])
}

/// Every op but the copy: elementwise ops first, then row ops, each in order of appearance.
fn ops(records: &[Record]) -> Vec<&str> {
    let all = distinct(records.iter().map(|r| r.op.as_str()).filter(|&op| op != COPY));
    let (elementwise, rows): (Vec<&str>, Vec<&str>) = all.iter().partition(|&&op| sweep_rows(records, op).is_empty());
    elementwise.into_iter().chain(rows).collect()
}

/// The implementations measured for `op`: rill first, then the peers in order of appearance.
fn implementations<'a>(records: &'a [Record], op: &str) -> Vec<&'a str> {
    let peers = records.iter().filter(|r| r.op == op && !is_rill(&r.implementation));
    std::iter::once(RILL).chain(distinct(peers.map(|r| r.implementation.as_str()))).collect()
}

/// "49152" or "8 × 4096": leading dimensions for a title.
fn rows_text(rows: &[usize]) -> String {
    let dims: Vec<String> = rows.iter().map(usize::to_string).collect();
    dims.join(" × ")
}

// ---------------------------------------------------------------------------------------------
// SVG plots
// ---------------------------------------------------------------------------------------------

const SIZE: (u32, u32) = (860, 500);
/// Room right of the plot area for the legend, outside the data.
const LEGEND_WIDTH: u32 = 180;
/// A generic family: the SVG names it and the viewer picks the font, so none is loaded here.
const FONT: &str = "sans-serif";

/// Colours by dtype, in order of the dtype's first appearance in the whole run, so a dtype
/// keeps its colour across plots (matplotlib's defaults: distinct, and readable when paled).
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// One SVG plot per op but the copy, named `<op>.svg`: effective GB/s against n (elementwise
/// ops) or cols (row ops, only the op's most common rows, so the line is one sweep), on a
/// log2 axis; a line with markers per dtype and that dtype's copy ceiling dashed and paler,
/// and a line per peer and dtype where peers were measured.
pub fn plots(records: &[Record], device: &str) -> Result<Vec<(String, String)>, Box<dyn Error>> {
    let dtypes = distinct(records.iter().map(|r| r.dtype.as_str()));
    ops(records).into_iter().map(|op| Ok((file_name(op), plot(records, op, &dtypes, device)?))).collect()
}

/// `<op>.svg`, any character that could leave the directory replaced.
fn file_name(op: &str) -> String {
    let safe: String =
        op.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    format!("{safe}.svg")
}

/// One implementation's curves in one dtype in one plot: (size, GB/s) of the op and, for
/// rill, of its copy ceiling, with the line and the paler dashes of the ceiling.
struct Series<'a> {
    /// The legend's name: the dtype, with the implementation where the op has peers.
    label: String,
    dtype: &'a str,
    points: Vec<(f64, f64)>,
    ceiling: Vec<(f64, f64)>,
    line: ShapeStyle,
    dashes: ShapeStyle,
}

/// The op's sweep by `implementation` in one dtype (for rill, with the copies at the same
/// shapes); `None` when it has no plottable point. Zero sizes and non-finite GB/s have no
/// place on a log axis and are left out.
fn series<'a>(
    records: &'a [Record],
    (op, rows): (&str, &[usize]),
    (implementation, dtype): (&str, &'a str),
    index: usize,
    with_peers: bool,
) -> Option<Series<'a>> {
    let plottable = |r: &&Record| r.dtype == dtype && leading(r) == rows && extent(r) > 0 && r.gbps.is_finite();
    let mine: Vec<&Record> =
        records.iter().filter(|r| r.op == op && r.implementation == implementation).filter(plottable).collect();
    if mine.is_empty() {
        return None;
    }
    let copies = records.iter().filter(|r| r.op == COPY && is_rill(&r.implementation)).filter(plottable);
    let ceiling = if is_rill(implementation) {
        curve(copies.filter(|copy| mine.iter().any(|r| r.shape == copy.shape)))
    } else {
        Vec::new()
    };
    let colour = PALETTE[index % PALETTE.len()];
    Some(Series {
        label: if with_peers { format!("{implementation} {dtype}") } else { dtype.to_string() },
        dtype,
        points: curve(mine),
        ceiling,
        line: colour.filled().stroke_width(2),
        dashes: colour.mix(0.5).stroke_width(2),
    })
}

/// (size, GB/s) of `records`, by size.
fn curve<'r>(records: impl IntoIterator<Item = &'r Record>) -> Vec<(f64, f64)> {
    let mut points: Vec<(f64, f64)> = records.into_iter().map(|r| (extent(r) as f64, r.gbps)).collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    points
}

fn plot(records: &[Record], op: &str, dtypes: &[&str], device: &str) -> Result<String, Box<dyn Error>> {
    let rows = sweep_rows(records, op);
    // rill's lines keep their dtype's colour across plots; the peers' take the colours after.
    let peers = implementations(records, op).split_off(1);
    let rill_lines = dtypes.iter().enumerate().map(|(i, &dtype)| (RILL, dtype, i));
    let peer_lines = peers.iter().flat_map(|&peer| dtypes.iter().map(move |&dtype| (peer, dtype)));
    let peer_lines = peer_lines.enumerate().map(|(k, (peer, dtype))| (peer, dtype, dtypes.len() + k));
    let all: Vec<Series> = rill_lines
        .chain(peer_lines)
        .filter_map(|(implementation, dtype, i)| {
            series(records, (op, rows), (implementation, dtype), i, !peers.is_empty())
        })
        .collect();
    let points = || all.iter().flat_map(|s| s.points.iter().chain(&s.ceiling));

    // The x axis spans whole powers of two, one either side of a lone power-of-two size. Grid
    // lines at every power, labels at most 9 (every other one or sparser on wide sweeps).
    let first = points().map(|p| p.0).fold(f64::INFINITY, f64::min).log2().floor();
    let last = points().map(|p| p.0).fold(1.0, f64::max).log2().ceil();
    let (first, last) =
        if first < last { (first as u32, last as u32) } else { ((last as u32).saturating_sub(1), last as u32 + 1) };
    let stride = (last - first).div_ceil(8).max(1) as usize;
    let power = |exponent: u32| 2f64.powi(exponent as i32);
    let x_axis = (power(first)..power(last))
        .log_scale()
        .base(2.0)
        .with_key_points((first..=last).step_by(stride).map(power).collect())
        .with_light_points((first..=last).map(power));
    // Headroom so the highest point never touches the frame.
    let highest = points().map(|p| p.1).fold(0.0, f64::max);
    let top = if highest > 0.0 { 1.1 * highest } else { 1.0 };

    let (title, x_desc) = if rows.is_empty() {
        (format!("{op}: effective bandwidth"), "n (elements), log scale")
    } else {
        (format!("{op}: effective bandwidth ({} rows)", rows_text(rows)), "cols (elements per row), log scale")
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(&title, (FONT, 21).into_font().style(FontStyle::Bold))?;
        let root = root.titled(device, (FONT, 15).into_font().color(&RGBColor(85, 85, 85)))?;
        let (plot_area, legend_area) = root.split_horizontally(SIZE.0 - LEGEND_WIDTH);
        let mut chart = ChartBuilder::on(&plot_area)
            .margin(10)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(x_axis, 0.0..top)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc("effective GB/s")
            .x_label_formatter(&|&size| power_of_two(size.log2().round() as u32))
            .y_label_formatter(&|gbps| format!("{gbps:.0}"))
            .y_max_light_lines(0)
            .label_style((FONT, 15))
            .axis_desc_style((FONT, 15))
            .draw()?;
        // Per dtype the dashed ceiling first, so the op's line and markers stay on top.
        for s in &all {
            chart.draw_series(DashedLineSeries::new(s.ceiling.iter().copied(), 6, 4, s.dashes))?;
            chart.draw_series(LineSeries::new(s.points.iter().copied(), s.line).point_size(3))?;
        }
        legend(&legend_area, &all)?;
        root.present()?;
    }
    Ok(svg)
}

/// Per dtype a sample of its line with a marker and, if measured, of its dashed ceiling; beside
/// the plot rather than in it (plotters' own legend stays inside the plot area, over the data).
fn legend(area: &DrawingArea<SVGBackend, Shift>, all: &[Series]) -> Result<(), Box<dyn Error>> {
    let text = TextStyle::from((FONT, 15).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    let sample = |y: i32| vec![(10, y), (38, y)];
    let mut y = 20;
    for s in all {
        area.draw(&PathElement::new(sample(y), s.line))?;
        area.draw(&Circle::new((24, y), 3, s.line))?;
        area.draw(&Text::new(s.label.as_str(), (46, y), &text))?;
        y += 20;
        if !s.ceiling.is_empty() {
            area.draw(&DashedPathElement::new(sample(y), 6, 4, s.dashes))?;
            area.draw(&Text::new(format!("{} copy (ceiling)", s.dtype), (46, y), &text))?;
            y += 20;
        }
        y += 6;
    }
    Ok(())
}

/// 2^exponent as people say it: 512, 1K, 32K, 256M.
fn power_of_two(exponent: u32) -> String {
    let units = ["", "K", "M", "G", "T", "P", "E"];
    let unit = (exponent / 10).min(units.len() as u32 - 1);
    let mantissa = 1u64.checked_shl(exponent - 10 * unit).unwrap_or(u64::MAX);
    format!("{mantissa}{}", units[unit as usize])
}

// ---------------------------------------------------------------------------------------------
// Markdown
// ---------------------------------------------------------------------------------------------

/// A Markdown section: per op (elementwise first, then row ops), a table with a row per shape
/// and per dtype "GB/s (x% of copy)", plus the launch path where the op has any; it ends with
/// the weakest shape and dtype of every op, where work is most likely left.
pub fn markdown(records: &[Record], device: &str, date: &str) -> String {
    let mut out = format!(
        "Measured {date} on {device} by `rill-bench`. Each cell is effective bandwidth (the bytes \
         an op must move over its median time) and, in parentheses, its fraction of a \
         device-to-device copy of the same shape and dtype measured in the same run.\n",
        date = escape_markdown(date),
        device = escape_markdown(device)
    );
    let ops = ops(records);
    let mut behind = Vec::new();
    for &op in &ops {
        out.push('\n');
        table(&mut out, records, op);
        peer_table(&mut out, records, op, &mut behind);
    }
    let weakest: Vec<String> = ops.iter().filter_map(|op| weakest(records, op)).collect();
    let weakest = if weakest.is_empty() { "none measured".to_string() } else { weakest.join("; ") };
    let _ = writeln!(out, "\nWeakest per op: {weakest}.");
    if records.iter().any(|r| !is_rill(&r.implementation)) {
        let behind = if behind.is_empty() { "none".to_string() } else { behind.join("; ") };
        let _ = writeln!(out, "\nBehind the best peer: {behind}.");
    }
    out
}

/// "### op", then the table: shapes grouped by rows (in order of appearance) and sorted by
/// size within a group, so each sweep reads top to bottom.
fn table(out: &mut String, records: &[Record], op: &str) {
    let mine: Vec<&Record> = records.iter().filter(|r| r.op == op && is_rill(&r.implementation)).collect();
    let dtypes = distinct(mine.iter().map(|r| r.dtype.as_str()));
    let with_path = mine.iter().any(|r| !r.path.is_empty() && r.path != "-");
    let groups = distinct(mine.iter().map(|r| leading(r)));
    let mut shapes = distinct(mine.iter().map(|r| r.shape.as_slice()));
    shapes.sort_by_key(|shape| {
        (groups.iter().position(|g| *g == &shape[..shape.len().saturating_sub(1)]), shape.last().copied())
    });

    let _ = writeln!(out, "### {}\n", escape_markdown(op));
    let path_column = |text: &str| if with_path { format!(" {text} |") } else { String::new() };
    let figures: String = dtypes.iter().map(|dtype| format!(" {} GB/s (of copy) |", escape_markdown(dtype))).collect();
    let _ = writeln!(out, "| shape |{figures}{}", path_column("path"));
    let _ = writeln!(out, "|---|{}{}", "---:|".repeat(dtypes.len()), if with_path { "---|" } else { "" });
    for shape in shapes {
        let cells: Vec<Option<&Record>> =
            dtypes.iter().map(|dtype| mine.iter().copied().find(|r| r.dtype == *dtype && r.shape == shape)).collect();
        let figures: String = cells
            .iter()
            .map(|cell| cell.map_or_else(|| " - |".into(), |r| format!(" {:.0} ({:.1}%) |", r.gbps, 100.0 * r.of_copy)))
            .collect();
        let path = path_column(&escape_markdown(&path_cell(&dtypes, &cells)));
        let _ = writeln!(out, "| {} |{figures}{path}", shape_cell(shape));
    }
}

/// Where `op` has peers, "#### op against the peers" and a table with a row per shape and
/// dtype: GB/s of rill and of each peer, the best peer's, and rill's ratio to it; the shapes
/// where rill is behind are added to `behind`.
fn peer_table(out: &mut String, records: &[Record], op: &str, behind: &mut Vec<String>) {
    let implementations = implementations(records, op);
    if implementations.len() < 2 {
        return;
    }
    let rill: Vec<&Record> = records.iter().filter(|r| r.op == op && is_rill(&r.implementation)).collect();
    let names: String = implementations.iter().map(|name| format!(" {} |", escape_markdown(name))).collect();
    let _ = writeln!(out, "\n#### {} against the peers (GB/s)\n", escape_markdown(op));
    let _ = writeln!(out, "| shape | dtype |{names} best peer | rill / best |");
    let _ = writeln!(out, "|---|---|{}---:|---:|", "---:|".repeat(implementations.len()));
    for mine in rill {
        let gbps = |name: &str| {
            records
                .iter()
                .find(|r| r.op == op && r.implementation == name && r.dtype == mine.dtype && r.shape == mine.shape)
                .map(|r| r.gbps)
                .filter(|gbps| gbps.is_finite())
        };
        let cells: String =
            implementations.iter().map(|name| gbps(name).map_or(" - |".into(), |g| format!(" {g:.0} |"))).collect();
        let best = implementations[1..].iter().filter_map(|name| gbps(name)).reduce(f64::max);
        let (shape, dtype) = (shape_cell(&mine.shape), escape_markdown(&mine.dtype));
        let (best_cell, ratio_cell) = match best {
            Some(best) => {
                let ratio = mine.gbps / best;
                if ratio < 1.0 {
                    behind.push(format!("{} {dtype} {shape} ({ratio:.2}x)", escape_markdown(op)));
                }
                (format!("{best:.0}"), format!("{ratio:.2}"))
            }
            None => ("-".into(), "-".into()),
        };
        let _ = writeln!(out, "| {shape} | {dtype} |{cells} {best_cell} | {ratio_cell} |");
    }
}

/// "2^24" for a power-of-two length, "16777215" otherwise, "49152 × 1024" for row ops.
fn shape_cell(shape: &[usize]) -> String {
    match shape {
        [n] if n.is_power_of_two() => format!("2^{}", n.trailing_zeros()),
        _ => rows_text(shape),
    }
}

/// The path, once if every dtype took the same one, else "f32: ...; f16: ...".
fn path_cell(dtypes: &[&str], cells: &[Option<&Record>]) -> String {
    let paths: Vec<(&str, &str)> =
        dtypes.iter().zip(cells).filter_map(|(dtype, cell)| cell.map(|r| (*dtype, r.path.as_str()))).collect();
    match paths.first() {
        Some((_, first)) if paths.iter().all(|(_, path)| path == first) => first.to_string(),
        _ => paths.iter().map(|(dtype, path)| format!("{dtype}: {path}")).collect::<Vec<_>>().join("; "),
    }
}

/// "softmax f16 4096 × 262144 at 65.8% of copy": the op's lowest fraction of copy.
fn weakest(records: &[Record], op: &str) -> Option<String> {
    let worst = records
        .iter()
        .filter(|r| r.op == op && is_rill(&r.implementation) && r.of_copy.is_finite())
        .min_by(|a, b| a.of_copy.total_cmp(&b.of_copy))?;
    let (op, dtype, shape) = (escape_markdown(op), escape_markdown(&worst.dtype), shape_cell(&worst.shape));
    Some(format!("{op} {dtype} {shape} at {:.1}% of copy", 100.0 * worst.of_copy))
}

/// Keeps a table cell one cell: a '|' would split it, a newline would end the row.
fn escape_markdown(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

// ---------------------------------------------------------------------------------------------
// Splicing into a document
// ---------------------------------------------------------------------------------------------

const BEGIN: &str = "<!-- bench:begin -->";
const END: &str = "<!-- bench:end -->";

/// Replaces what lies between the marker lines `<!-- bench:begin -->` and `<!-- bench:end -->`
/// with `section`, keeping the markers and everything around them, so a document's prose
/// survives regeneration. Without both markers in that order it appends them with the section
/// rather than guess where a stray one meant to end (which could delete prose).
pub fn splice(doc: &str, section: &str) -> String {
    let mut body = section.trim_end_matches(['\n', '\r']).to_string();
    if !body.is_empty() {
        body.push('\n');
    }
    if let Some((after_begin, end_start)) = markers(doc) {
        return format!("{}{body}{}", &doc[..after_begin], &doc[end_start..]);
    }
    let mut out = doc.to_string();
    if !out.is_empty() {
        if !out.ends_with('\n') {
            out.push('\n');
        }
        out.push('\n');
    }
    let _ = writeln!(out, "{BEGIN}\n{body}{END}");
    out
}

/// Byte offsets of the end of the begin marker's line and the start of the first end marker
/// line after it; markers count only as whole lines (surrounding spaces allowed).
fn markers(doc: &str) -> Option<(usize, usize)> {
    let mut offset = 0;
    let mut after_begin = None;
    for line in doc.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        match (after_begin, line.trim()) {
            (None, BEGIN) if line.ends_with('\n') => after_begin = Some(offset),
            (Some(after), END) => return Some((after, start)),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Elementwise and row ops, two dtypes, a copy per shape, escapes and a non-ASCII path.
    const SAMPLE: &str = r#"[
  {"op": "copy", "dtype": "f32", "shape": "[65536]", "path": "-", "micros": 6.052, "gbps": 86.6, "of_copy": 1.0000},
  {"op": "gelu", "dtype": "f32", "shape": "[65536]", "path": "-", "micros": 4.970, "gbps": 105.5, "of_copy": 1.2178},
  {"op": "copy", "dtype": "f32", "shape": "[16777216]", "path": "-", "micros": 48.100, "gbps": 2790.0, "of_copy": 1.0000},
  {"op": "gelu", "dtype": "f32", "shape": "[16777216]", "path": "-", "micros": 48.900, "gbps": 2744.0, "of_copy": 0.9835},
  {"op": "copy", "dtype": "f16", "shape": "[16777216]", "path": "-", "micros": 24.900, "gbps": 2700.0, "of_copy": 1.0000},
  {"op": "gelu", "dtype": "f16", "shape": "[16777216]", "path": "-", "micros": 26.800, "gbps": 2506.0, "of_copy": 0.9281},
  {"op": "copy", "dtype": "f32", "shape": "[49152, 32]", "path": "-", "micros": 7.407, "gbps": 1698.8, "of_copy": 1.0000},
  {"op": "softmax", "dtype": "f32", "shape": "[49152, 32]", "path": "warp path: 4 lanes/row \"x\" \\ é\t", "micros": 7.703, "gbps": 1633.6, "of_copy": 0.9616},
  {"op": "copy", "dtype": "f32", "shape": "[49152, 1024]", "path": "-", "micros": 135.812, "gbps": 2964.8, "of_copy": 1.0000},
  {"op": "softmax", "dtype": "f32", "shape": "[49152, 1024]", "path": "warp path: 32 lanes/row", "micros": 137.007, "gbps": 2938.9, "of_copy": 0.9913},
  {"op": "copy", "dtype": "f16", "shape": "[49152, 1024]", "path": "-", "micros": 70.100, "gbps": 2872.0, "of_copy": 1.0000},
  {"op": "softmax", "dtype": "f16", "shape": "[49152, 1024]", "path": "warp path: 32 lanes/row, pack 8", "micros": 94.180, "gbps": 2137.7, "of_copy": 0.7443},
  {"op": "copy", "dtype": "f32", "shape": "[4096, 65536]", "path": "-", "micros": 700.000, "gbps": 3000.0, "of_copy": 1.0000},
  {"op": "softmax", "dtype": "f32", "shape": "[4096, 65536]", "path": "uncached path", "micros": 1000.000, "gbps": 2100.0, "of_copy": 0.7000}
]
"#;

    fn sample() -> Vec<Record> {
        parse(SAMPLE).expect("the sample parses")
    }

    #[test]
    fn parse_reads_every_field() {
        let records = sample();
        assert_eq!(records.len(), 14);
        let r = &records[7];
        assert_eq!((r.op.as_str(), r.dtype.as_str(), r.shape.as_slice()), ("softmax", "f32", &[49152, 32][..]));
        assert_eq!(r.path, "warp path: 4 lanes/row \"x\" \\ é\t");
        assert_eq!((r.micros, r.gbps, r.of_copy), (7.703, 1633.6, 0.9616));
    }

    #[test]
    fn round_trip_keeps_every_record() {
        let records = sample();
        let json = to_json(&records).unwrap();
        assert_eq!(parse(&json).unwrap(), records);
        assert_eq!(to_json(&parse(&json).unwrap()).unwrap(), json);
        assert_eq!(json.lines().count(), records.len() + 2, "one record per line:\n{json}");
        assert!(json.contains(r#""shape":"[49152, 1024]""#), "{json}");
        assert_eq!(to_json(&[]).unwrap(), "[\n]\n");
        assert_eq!(parse(&to_json(&[]).unwrap()).unwrap(), vec![]);
    }

    /// The committed runs, in both formats, still load and survive a write and a read.
    #[test]
    fn committed_records_round_trip() {
        for json in [include_str!("../../docs/bench-h100.json"), include_str!("../../docs/elementwise-h100.json")] {
            let records = parse(json).unwrap();
            assert!(records.len() > 100);
            assert_eq!(parse(&to_json(&records).unwrap()).unwrap(), records);
        }
    }

    #[test]
    fn to_json_keeps_the_recorded_precision() {
        let record = Record { micros: 48.10049, gbps: 2789.96, of_copy: 0.983_549, ..sample()[0].clone() };
        let json = to_json(&[record]).unwrap();
        assert!(json.contains(r#""micros":48.1,"gbps":2790.0,"of_copy":0.9835}"#), "{json}");
        let odd = Record { gbps: f64::NAN, ..sample()[0].clone() };
        assert!(to_json(&[odd]).unwrap().contains(r#""gbps":null"#));
    }

    #[test]
    fn round_trip_keeps_odd_strings() {
        let record = Record {
            op: "a\u{1}b\u{1f600}/".into(),
            dtype: "\r\n".into(),
            shape: vec![1, 2, 3],
            path: String::new(),
            micros: 1.5,
            gbps: 0.0,
            of_copy: 12.25,
            implementation: "torch.compile".into(),
        };
        assert_eq!(parse(&to_json(std::slice::from_ref(&record)).unwrap()).unwrap(), vec![record]);
    }

    #[test]
    fn parse_reads_the_older_format_and_escapes() {
        let old = r#"[{"op": "relu", "dtype": "f32", "len": 65536, "micros": 4.951, "gbps": 105.9, "of_copy": 1.2225, "extra": "x"}]"#;
        let records = parse(old).unwrap();
        assert_eq!((records[0].shape.as_slice(), records[0].path.as_str()), (&[65536][..], "-"));
        let escaped = r#"[{"op": "\u0061\ud83d\ude00\/", "dtype": "f", "shape": " [ 1 ,2 ] ", "micros": -0, "gbps": 1e3, "of_copy": 2.5E-1}]"#;
        let records = parse(escaped).unwrap();
        assert_eq!((records[0].op.as_str(), records[0].shape.as_slice()), ("a\u{1f600}/", &[1, 2][..]));
        assert_eq!((records[0].gbps, records[0].of_copy), (1000.0, 0.25));
    }

    #[test]
    fn parse_rejects_malformed_input_with_a_position() {
        let good = r#"{"op": "a", "dtype": "f32", "shape": "[4]", "path": "-", "micros": 1, "gbps": 2, "of_copy": 3}"#;
        assert!(parse(&format!("[{good}]")).is_ok());
        let bad = [
            String::new(),
            "{}".into(),
            format!("[{good},]"),
            format!("[{good}] x"),
            format!("[{good}{good}]"),
            good.replace("\"op\": \"a\"", "\"op\": 1"),
            good.replace("\"micros\": 1", "\"micros\": \"1\""),
            good.replace("\"micros\": 1", "\"micros\": 01"),
            good.replace("\"micros\": 1", "\"micros\": 1."),
            good.replace("\"micros\": 1", "\"micros\": -"),
            good.replace("\"micros\": 1", "\"micros\": 1e999"),
            good.replace("\"micros\": 1", "\"micros\": true"),
            good.replace("\"micros\": 1", "\"micros\": null"),
            good.replace("\"micros\": 1", "\"micros\": [1]"),
            good.replace(", \"gbps\": 2", ""),
            good.replace("\"[4]\"", "\"[4, x]\""),
            good.replace("\"[4]\"", "\"[]\""),
            good.replace("\"[4]\"", "\"4\""),
            good.replace("\"a\"", "\"a\\x\""),
            good.replace("\"a\"", "\"a\\u12\""),
            good.replace("\"a\"", "\"\\ud800\""),
            good.replace("\"a\"", "\"\\udc00\""),
            good.replace("\"a\"", "\"a\nb\""),
            good.replace("\"dtype\": \"f32\"", "\"op\": \"f32\""),
        ];
        for text in bad {
            let text = if text.starts_with('{') { format!("[{text}]") } else { text };
            let error = parse(&text).expect_err(&text).to_string();
            assert!(error.contains(" at line "), "{error}");
        }
        let error = parse("[\n  {\"op\": 1}]").unwrap_err().to_string();
        assert_eq!(error, "invalid type: integer `1`, expected a string at line 2 column 10");
    }

    #[test]
    fn every_truncation_is_an_error() {
        let end = SAMPLE.rfind(']').unwrap();
        for cut in (0..=end).filter(|&cut| SAMPLE.is_char_boundary(cut)) {
            assert!(parse(&SAMPLE[..cut]).is_err(), "accepted a document cut at byte {cut}");
        }
    }

    #[test]
    fn corrupted_bytes_never_panic() {
        for (at, _) in SAMPLE.char_indices() {
            for junk in ["", "\"", "\\", "{", "}", "[", "]", ",", ":", "0", "-", "e", "é", "\\u", "\\ud800"] {
                let next = SAMPLE[at..].chars().next().map_or(0, char::len_utf8);
                let text = format!("{}{junk}{}", &SAMPLE[..at], &SAMPLE[at + next..]);
                let _ = parse(&text);
            }
        }
    }

    /// Checks that every element opened is closed in order and that every '&' starts an
    /// entity: enough to catch unescaped text and unbalanced tags in our own output.
    fn assert_well_formed(svg: &str) {
        let mut open: Vec<&str> = Vec::new();
        let mut rest = svg;
        while let Some(start) = rest.find('<') {
            let text = &rest[..start];
            for (i, _) in text.match_indices('&') {
                let entity = &text[i..];
                assert!(["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"].iter().any(|e| entity.starts_with(e)), "{text}");
            }
            let end = rest[start..].find('>').expect("a tag is closed") + start;
            let tag = &rest[start + 1..end];
            assert!(!tag.contains('<'), "{tag}");
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(open.pop(), Some(name), "closing tag out of order");
            } else if !tag.ends_with('/') {
                open.push(tag.split_whitespace().next().unwrap());
            }
            rest = &rest[end + 1..];
        }
        assert!(open.is_empty(), "unclosed: {open:?}");
        assert!(rest.trim().is_empty());
    }

    #[test]
    fn plots_are_well_formed_svg_per_op() {
        let plots = plots(&sample(), "NVIDIA H100 <80GB> & \"HBM3\"").unwrap();
        let names: Vec<&str> = plots.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["gelu.svg", "softmax.svg"]);
        for (name, svg) in &plots {
            assert!(svg.starts_with("<svg"), "{name}");
            assert!(svg.trim_end().ends_with("</svg>"), "{name}");
            assert_well_formed(svg);
            assert!(svg.contains("NVIDIA H100 &lt;80GB&gt; &amp; &quot;HBM3&quot;"));
            assert!(svg.contains(">\nf32 copy (ceiling)\n<"), "{name} has its copy ceiling");
            assert!(svg.contains(">\neffective GB/s\n<"), "{name} has a y axis");
        }
        let (gelu, softmax) = (&plots[0].1, &plots[1].1);
        assert!(gelu.contains(">\ngelu: effective bandwidth\n<"));
        assert!(softmax.contains(">\nsoftmax: effective bandwidth (49152 rows)\n<"));
        // A marker per point, one more per dtype in the legend: gelu has 2 f32 points and 1 f16,
        // softmax the same in the 49152-row sweep, without the 4096-row shape.
        assert_eq!(gelu.matches("<circle").count(), 3 + 2);
        assert_eq!(softmax.matches("<circle").count(), 3 + 2);
        assert!(gelu.contains(">\n64K\n<") && gelu.contains(">\n16M\n<"));
        assert!(softmax.contains(">\n32\n<") && softmax.contains(">\n1K\n<"));
    }

    #[test]
    fn plots_survive_odd_records() {
        let mut records = sample();
        records[1].gbps = f64::NAN;
        records[3].shape = vec![0];
        records.push(Record { shape: vec![], ..records[1].clone() });
        records.push(Record { op: "lone".into(), shape: vec![7], gbps: 0.0, ..records[1].clone() });
        records.push(Record { op: "huge".into(), shape: vec![usize::MAX], gbps: 1.0, ..records[1].clone() });
        for (_, svg) in plots(&records, "gpu").unwrap() {
            assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
            assert_well_formed(&svg);
            assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
        }
        assert!(plots(&[], "gpu").unwrap().is_empty());
    }

    #[test]
    fn powers_of_two_read_as_people_say_them() {
        assert_eq!(
            [power_of_two(5), power_of_two(10), power_of_two(15), power_of_two(28), power_of_two(64)],
            ["32", "1K", "32K", "256M", "16E"]
        );
    }

    #[test]
    fn markdown_has_a_row_per_shape() {
        let text = markdown(&sample(), "NVIDIA H100", "2026-11-22");
        assert!(text.starts_with("Measured 2026-11-22 on NVIDIA H100"));
        let gelu = text.find("### gelu").unwrap();
        let softmax = text.find("### softmax").unwrap();
        assert!(gelu < softmax, "elementwise ops first");
        assert!(!text.contains("### copy"));
        for row in ["| 2^16 | 106 (121.8%) | - |", "| 2^24 | 2744 (98.4%) | 2506 (92.8%) |"] {
            assert!(text.contains(row), "{row}\n{text}");
        }
        assert!(!text[gelu..softmax].contains("path"), "gelu has no paths");
        for shape in ["| 49152 × 32 |", "| 49152 × 1024 |", "| 4096 × 65536 |"] {
            assert_eq!(text.matches(shape).count(), 1, "{shape}\n{text}");
        }
        assert!(text.contains("| f32: warp path: 32 lanes/row; f16: warp path: 32 lanes/row, pack 8 |"));
        let last = text.lines().last().unwrap();
        assert_eq!(last, "Weakest per op: gelu f16 2^24 at 92.8% of copy; softmax f32 4096 × 65536 at 70.0% of copy.");
    }

    /// The sample with two peers at some of softmax's shapes: Liger ahead at f16 49152 × 1024.
    fn with_peers() -> Vec<Record> {
        let mut records = sample();
        let peer = |implementation: &str, of: usize, gbps: f64| Record {
            implementation: implementation.into(),
            path: "-".into(),
            gbps,
            ..records[of].clone()
        };
        let peers = [peer("Liger", 11, 2500.0), peer("torch.compile", 11, 1200.0), peer("Liger", 9, 2000.0)];
        records.extend(peers);
        records
    }

    #[test]
    fn peers_get_a_table_per_op_and_the_shapes_rill_is_behind() {
        let text = markdown(&with_peers(), "NVIDIA H100", "2026-11-24");
        assert!(!text.contains("#### gelu"), "an op without peers has no peer table");
        let peers = text.find("#### softmax against the peers (GB/s)").expect(&text);
        assert!(text[peers..].contains("| shape | dtype | rill | Liger | torch.compile | best peer | rill / best |"));
        for row in [
            "| 49152 × 1024 | f16 | 2138 | 2500 | 1200 | 2500 | 0.86 |",
            "| 49152 × 1024 | f32 | 2939 | 2000 | - | 2000 | 1.47 |",
        ] {
            assert!(text[peers..].contains(row), "{row}\n{text}");
        }
        assert!(text[peers..].contains("| 49152 × 32 | f32 | 1634 | - | - | - | - |"), "{text}");
        // The dtype tables and the weakest line stay rill's own.
        assert!(text.contains("| 49152 × 1024 | 2939 (99.1%) | 2138 (74.4%) |"), "{text}");
        assert!(
            text.contains("Weakest per op: gelu f16 2^24 at 92.8% of copy; softmax f32 4096 × 65536 at 70.0% of copy.")
        );
        assert_eq!(text.lines().last().unwrap(), "Behind the best peer: softmax f16 49152 × 1024 (0.86x).");
        assert!(!markdown(&sample(), "H100", "today").contains("Behind the best peer"));
    }

    #[test]
    fn plots_have_a_line_per_implementation() {
        let plots = plots(&with_peers(), "H100").unwrap();
        let softmax = &plots.iter().find(|(name, _)| name == "softmax.svg").unwrap().1;
        assert_well_formed(softmax);
        for label in ["rill f32", "rill f16", "Liger f32", "Liger f16", "torch.compile f16", "f32 copy (ceiling)"] {
            assert!(softmax.contains(&format!(">\n{label}\n<")), "{label}");
        }
        assert!(!softmax.contains("Liger f16 copy"), "peers have no ceiling of their own");
        // rill's 3 points and 2 legend markers as before, 3 peer points and 3 legend markers.
        assert_eq!(softmax.matches("<circle").count(), 5 + 6);
        let gelu = &plots.iter().find(|(name, _)| name == "gelu.svg").unwrap().1;
        assert!(gelu.contains(">\nf32\n<") && !gelu.contains("rill f32"), "no peers: dtypes only");
    }

    #[test]
    fn splice_replaces_between_markers() {
        let doc = "# Perf\n\nintro\n<!-- bench:begin -->\nold\ntable\n<!-- bench:end -->\noutro\n";
        let spliced = splice(doc, "new\n");
        assert_eq!(spliced, "# Perf\n\nintro\n<!-- bench:begin -->\nnew\n<!-- bench:end -->\noutro\n");
        assert_eq!(splice(&spliced, "new"), spliced, "idempotent");
        assert_eq!(splice(doc, ""), "# Perf\n\nintro\n<!-- bench:begin -->\n<!-- bench:end -->\noutro\n");
    }

    #[test]
    fn splice_appends_markers_when_absent() {
        assert_eq!(splice("# Perf\nintro", "new"), "# Perf\nintro\n\n<!-- bench:begin -->\nnew\n<!-- bench:end -->\n");
        assert_eq!(splice("", "new\n"), "<!-- bench:begin -->\nnew\n<!-- bench:end -->\n");
        // An end marker before any begin is prose, not a section: kept, and a pair appended.
        let stray = "<!-- bench:end -->\n";
        let spliced = splice(stray, "new");
        assert!(spliced.starts_with(stray) && spliced.ends_with("<!-- bench:begin -->\nnew\n<!-- bench:end -->\n"));
        assert_eq!(splice(&spliced, "newer"), spliced.replace("new\n", "newer\n"));
    }
}
