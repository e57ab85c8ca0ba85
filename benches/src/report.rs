//! Reporting for `rill-bench`: the record files it writes (and reads back), one SVG plot of
//! effective bandwidth per op, and the Markdown report spliced into a document such as
//! `docs/PERF.md`.
//!
//! A record file holds one run or several of one GPU, each a [`Header`] (date, commit, GPU,
//! driver, the peers' versions) and its [`Record`]s. A report has a [`Section`] per file: the
//! newest figure of every op, dtype and shape its runs measured, and where rill is behind.
//!
//! Malformed input gives `Err`, odd records (NaN, empty shapes) are skipped or shown as gaps,
//! nothing panics.

use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::{BTreeMap, HashSet};
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

/// What a run was: when, on which build and GPU, beside which peers. Any field may be empty
/// (unknown); unknown keys are ignored, so a newer writer's fields don't break an older reader.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Header {
    /// The day the run started, "2026-11-27" (UTC).
    pub date: String,
    /// The build's commit, as `git describe --always --dirty` names it; for runs recorded
    /// before headers existed, the commit that recorded the run.
    pub commit: String,
    /// The GPU's name as the driver reports it: what sections are titled by.
    pub gpu: String,
    /// The GPU's limits that bear on the figures: SMs, L2, the DRAM's peak.
    pub device: String,
    /// The driver's release, where the system tells it, and the CUDA version of its API.
    pub driver: String,
    /// Each peer's version by name ("torch", "triton", "Liger", "QuACK", "CuTe DSL"); empty
    /// where no peer ran.
    pub peers: BTreeMap<String, String>,
    /// What the run was where its records do not say it (how an older record was made, what a
    /// run of a few shapes measured).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub note: String,
}

/// One run: its header and its records, in the order measured.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Run {
    #[serde(rename = "run", default)]
    pub header: Header,
    pub records: Vec<Record>,
}

/// The object form of a record file: one run (`run` and `records`) or several (`runs`).
#[derive(Deserialize)]
struct Document {
    run: Option<Header>,
    records: Option<Vec<Record>>,
    runs: Option<Vec<Run>>,
}

/// Parses a record file: `{"run": {...}, "records": [...]}` (one run), `{"runs": [{"run":
/// ..., "records": [...]}, ...]}` (several, oldest first), or a bare array of records (runs
/// recorded before headers existed: one run, its header empty). Records are objects with the
/// fields of [`Record`]; the oldest also read, with a number "len" instead of "shape" and no
/// "path" (taken as "-"). Unknown keys are ignored; syntax and type errors name the line and
/// column.
pub fn parse(json: &str) -> serde_json::Result<Vec<Run>> {
    if json.trim_start().starts_with('[') {
        let records: Vec<Record> = serde_json::from_str(json)?;
        return Ok(vec![Run { header: Header::default(), records }]);
    }
    let document: Document = serde_json::from_str(json)?;
    match document {
        Document { run, records: Some(records), runs: None } => {
            Ok(vec![Run { header: run.unwrap_or_default(), records }])
        }
        Document { run: None, records: None, runs: Some(runs) } => Ok(runs),
        _ => Err(serde_json::Error::custom(
            "a record file holds \"run\" and \"records\" (one run) or \"runs\" (several), not both",
        )),
    }
}

/// Serializes `runs` with one record a line, so runs diff line by line: one run as `{"run":
/// ..., "records": [...]}`, several as `{"runs": [...]}`.
pub fn to_json(runs: &[Run]) -> serde_json::Result<String> {
    let mut out = String::from("{\n");
    match runs {
        [run] => write_run(&mut out, run, "  ")?,
        _ => {
            out.push_str("  \"runs\": [\n");
            for (i, run) in runs.iter().enumerate() {
                out.push_str("    {\n");
                write_run(&mut out, run, "      ")?;
                out.push_str(if i + 1 < runs.len() { "    },\n" } else { "    }\n" });
            }
            out.push_str("  ]\n");
        }
    }
    out.push_str("}\n");
    Ok(out)
}

/// `"run": {...},` and `"records": [...]`, each line indented by `indent`.
fn write_run(out: &mut String, run: &Run, indent: &str) -> serde_json::Result<()> {
    let _ = writeln!(out, "{indent}\"run\": {},", serde_json::to_string(&run.header)?);
    if run.records.is_empty() {
        let _ = writeln!(out, "{indent}\"records\": []");
        return Ok(());
    }
    let _ = writeln!(out, "{indent}\"records\": [");
    for (i, record) in run.records.iter().enumerate() {
        let comma = if i + 1 < run.records.len() { "," } else { "" };
        let _ = writeln!(out, "{indent}  {}{comma}", serde_json::to_string(record)?);
    }
    let _ = writeln!(out, "{indent}]");
    Ok(())
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

/// "2026-11-27": the UTC day of `unix_seconds` (the proleptic Gregorian calendar).
pub fn utc_date(unix_seconds: u64) -> String {
    // Days since 1970-01-01, shifted to start on 0000-03-01 so each year ends with February
    // and its leap day; a cycle of 400 years is 146097 days.
    let days = unix_seconds / 86_400 + 719_468;
    let (era, day_of_era) = (days / 146_097, days % 146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 };
    let year = era * 400 + year_of_era + u64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

// ---------------------------------------------------------------------------------------------
// Sections: the runs of one record file, merged
// ---------------------------------------------------------------------------------------------

/// One part of the report: the runs of one record file (of one GPU), each op, dtype and shape
/// from the last run that measured it, so a newer run of a few shapes updates an older sweep
/// while every row keeps its own run's copy and peers.
#[derive(Clone, Debug, PartialEq)]
pub struct Section {
    /// What the section is called after its GPU: its record file's stem.
    pub name: String,
    /// The runs' headers, oldest first.
    pub runs: Vec<Header>,
    /// The rows, each op, dtype and shape (every implementation of it) from one run.
    pub records: Vec<Record>,
    /// The run (an index into `runs`) each of `records` comes from.
    pub run_of: Vec<usize>,
}

impl Section {
    /// `runs` (oldest first) merged: a run's records replace every record of an earlier run
    /// at the same op, dtype and shape, whatever its implementation.
    pub fn new(name: &str, runs: Vec<Run>) -> Section {
        let (mut records, mut run_of, mut headers) = (Vec::new(), Vec::new(), Vec::new());
        for (index, run) in runs.into_iter().enumerate() {
            let measured: HashSet<(&str, &str, &[usize])> = run.records.iter().map(key).collect();
            let kept: Vec<bool> = records.iter().map(|r| !measured.contains(&key(r))).collect();
            let mut keep = kept.iter().copied();
            records.retain(|_| keep.next().unwrap_or(true));
            let mut keep = kept.into_iter();
            run_of.retain(|_| keep.next().unwrap_or(true));
            run_of.extend(std::iter::repeat_n(index, run.records.len()));
            records.extend(run.records);
            headers.push(run.header);
        }
        Section { name: name.into(), runs: headers, records, run_of }
    }

    /// The GPU of the newest run that names one.
    pub fn gpu(&self) -> &str {
        self.runs.iter().rev().map(|h| h.gpu.as_str()).find(|gpu| !gpu.is_empty()).unwrap_or("")
    }

    /// "NVIDIA H100 80GB HBM3: sweep-h100", or the name alone where no run names its GPU.
    pub fn title(&self) -> String {
        match self.gpu() {
            "" => self.name.clone(),
            gpu => format!("{gpu}: {}", self.name),
        }
    }
}

/// The op, dtype and shape a record measures.
fn key(record: &Record) -> (&str, &str, &[usize]) {
    (&record.op, &record.dtype, &record.shape)
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

/// A row is behind its best peer under this ratio (rill's GB/s over the peer's).
pub const BEHIND: f64 = 0.98;

/// A row is listed under this fraction of its copy.
pub const UNDER_COPY: f64 = 0.90;

/// A copy faster than this (µs) is mostly launch latency, so a fraction of it says little
/// about bandwidth: such rows stay out of the list of where rill is behind.
pub const LATENCY_BOUND_MICROS: f64 = 10.0;

/// The report: what it is and how it was made (`command`), which runs each section comes
/// from, then per section its runs, where rill is behind its best peer or under 90% of copy,
/// and per op a table with a row per shape and dtype (GB/s, % of copy, the best peer and
/// rill's ratio to it, the plan).
pub fn markdown(sections: &[Section], command: &str) -> String {
    let mut out = format!(
        "Generated by `{}`. Each figure is effective bandwidth: the bytes an op must move (each \
         input read once, each output written once) over its median time, and its fraction of a \
         device-to-device copy of the same shape and dtype timed in the same run. Peers are charged \
         rill's bytes; \"rill / best\" is rill's GB/s over the best peer's, in the same run.\n\nSections:\n",
        command.replace('`', "'")
    );
    for section in sections {
        let _ = writeln!(out, "- {}: {}.", escape_markdown(&section.title()), summary(section));
    }
    for section in sections {
        write_section(&mut out, section);
    }
    out
}

/// "2 runs, 2026-11-24 to 2026-11-27; rill, torch eager, torch.compile": the runs' dates and
/// who was timed.
fn summary(section: &Section) -> String {
    let dates: Vec<&str> = section.runs.iter().map(|h| h.date.as_str()).filter(|d| !d.is_empty()).collect();
    let (first, last) = (dates.iter().min(), dates.iter().max());
    let when = match (first, last) {
        (Some(first), Some(last)) if first != last => format!(", {first} to {last}"),
        (Some(first), _) => format!(", {first}"),
        _ => String::new(),
    };
    let count = match section.runs.len() {
        1 => "1 run".to_string(),
        n => format!("{n} runs"),
    };
    let who: Vec<&str> = std::iter::once(RILL)
        .chain(distinct(section.records.iter().map(|r| r.implementation.as_str()).filter(|i| !is_rill(i))))
        .collect();
    escape_markdown(&format!("{count}{when}; {}", who.join(", ")))
}

fn write_section(out: &mut String, section: &Section) {
    let _ = writeln!(out, "\n## {}\n", escape_markdown(&section.title()));
    if section.runs.len() > 1 {
        out.push_str(
            "Runs, oldest first; a run's rows replace an earlier run's at the same op, dtype and shape \
             (the tables' last column), and its GPU, driver and peers are the run before's unless named:\n\n",
        );
    } else {
        out.push_str("Run:\n\n");
    }
    for (index, header) in section.runs.iter().enumerate() {
        let rows = section.run_of.iter().zip(&section.records).filter(|(run, r)| **run == index && is_measure(r));
        let rows = match rows.count() {
            1 => "1 row".to_string(),
            n => format!("{n} rows"),
        };
        let before = index.checked_sub(1).map(|i| &section.runs[i]);
        let _ = writeln!(out, "{}. {} ({rows})", index + 1, describe_run(header, before));
    }
    behind_list(out, section);
    for op in ops(&section.records) {
        out.push('\n');
        table(out, section, op);
    }
}

/// A run's header in one line: date, commit, GPU and its limits, driver, peers, note; the
/// GPU, driver and peers only where they differ from the run `before`'s.
fn describe_run<'a>(header: &'a Header, before: Option<&Header>) -> String {
    let or = |text: &'a str, unknown: &'a str| if text.is_empty() { unknown } else { text };
    let mut line = format!("{}, commit {}", or(&header.date, "date unknown"), or(&header.commit, "unknown"));
    let new = |field: fn(&Header) -> &str| before.is_none_or(|before| field(before) != field(header));
    if new(|h| &h.gpu) || new(|h| &h.device) {
        if !header.gpu.is_empty() {
            let _ = write!(line, ", {}", header.gpu);
        }
        if !header.device.is_empty() {
            let _ = write!(line, " ({})", header.device);
        }
    }
    if !header.driver.is_empty() && new(|h| &h.driver) {
        let _ = write!(line, ", driver {}", header.driver);
    }
    if before.is_none_or(|before| before.peers != header.peers) {
        let _ = write!(line, "; {}", peer_versions(&header.peers));
    }
    if !header.note.is_empty() {
        let _ = write!(line, ". {}", header.note.trim_end_matches('.'));
    }
    escape_markdown(&line)
}

/// "PyTorch 2.11.0, Triton 3.6.0, Liger 0.8.5": the best-known peers first, then the rest by
/// name; "no peers" where none ran.
fn peer_versions(peers: &BTreeMap<String, String>) -> String {
    const KNOWN: [(&str, &str); 5] =
        [("torch", "PyTorch"), ("triton", "Triton"), ("Liger", "Liger"), ("QuACK", "QuACK"), ("CuTe DSL", "CuTe DSL")];
    let known = KNOWN.iter().filter_map(|&(key, name)| peers.get(key).map(|version| format!("{name} {version}")));
    let others = peers.iter().filter(|(key, _)| KNOWN.iter().all(|(k, _)| k != key)).map(|(k, v)| format!("{k} {v}"));
    let all: Vec<String> = known.chain(others).collect();
    if all.is_empty() { "no peers".into() } else { all.join(", ") }
}

/// Whether a record is a measurement of an op (not the copy it is measured against).
fn is_measure(record: &Record) -> bool {
    record.op != COPY && is_rill(&record.implementation)
}

/// Whether `op` is a row that compares rather than one of rill's ops at a shape it plans: the
/// RMSNorm ladder's rungs (`family/rung`) and the fused example's reference rows (the unfused
/// chain and its first kernel, `dequantize*`; a forced path, `*_uncached`).
fn is_reference(op: &str) -> bool {
    op.contains('/') || op.starts_with("dequantize") || op.ends_with("_uncached")
}

/// The best peer's GB/s for `mine` and its name, if any peer measured it.
fn best_peer<'a>(records: &'a [Record], mine: &Record) -> Option<(&'a str, f64)> {
    records
        .iter()
        .filter(|r| !is_rill(&r.implementation) && key(r) == key(mine) && r.gbps.is_finite())
        .max_by(|a, b| a.gbps.total_cmp(&b.gbps))
        .map(|r| (r.implementation.as_str(), r.gbps))
}

/// Whether `mine`'s copy took under [`LATENCY_BOUND_MICROS`].
fn latency_bound(records: &[Record], mine: &Record) -> bool {
    records
        .iter()
        .find(|r| r.op == COPY && is_rill(&r.implementation) && r.dtype == mine.dtype && r.shape == mine.shape)
        .is_some_and(|copy| copy.micros < LATENCY_BOUND_MICROS)
}

/// "### Where rill is behind": per op, the shapes under [`BEHIND`] of the best peer and those
/// under [`UNDER_COPY`] of copy, by dtype; reference rows and latency-bound ones left out.
fn behind_list(out: &mut String, section: &Section) {
    let records = &section.records;
    let _ = writeln!(
        out,
        "\n### Where rill is behind\n\nRows under {BEHIND} of the best peer or under {:.0}% of copy (left out: \
         rows whose copy takes under {LATENCY_BOUND_MICROS:.0} µs, which measure launches more than \
         bandwidth, and rows that compare rather than run one of rill's ops).\n",
        100.0 * UNDER_COPY
    );
    let mut any = false;
    for op in ops(records).into_iter().filter(|op| !is_reference(op)) {
        let mine: Vec<&Record> =
            records.iter().filter(|r| r.op == op && is_rill(&r.implementation) && !latency_bound(records, r)).collect();
        let behind = by_dtype(&mine, |r| {
            let (peer, gbps) = best_peer(records, r)?;
            let ratio = r.gbps / gbps;
            (ratio < BEHIND).then(|| format!("{} ({ratio:.2}x {})", shape_cell(&r.shape), escape_markdown(peer)))
        });
        let under = by_dtype(&mine, |r| {
            (r.of_copy < UNDER_COPY).then(|| format!("{} ({:.1}%)", shape_cell(&r.shape), 100.0 * r.of_copy))
        });
        let parts: Vec<String> = [("behind the best peer", behind), ("under 90% of copy", under)]
            .into_iter()
            .filter(|(_, list)| !list.is_empty())
            .map(|(what, list)| format!("{what}: {list}"))
            .collect();
        if !parts.is_empty() {
            let _ = writeln!(out, "- `{}`: {}.", escape_markdown(op).replace('`', "'"), parts.join("; "));
            any = true;
        }
    }
    if !any {
        out.push_str("None.\n");
    }
}

/// "f32 49152 × 32 (65.1%), 49152 × 64 (77.3%); bf16 ...": `cell` of each record it gives
/// one for, grouped by dtype in order of appearance, the shapes of a dtype in the tables' order.
fn by_dtype(records: &[&Record], cell: impl Fn(&Record) -> Option<String>) -> String {
    let groups = distinct(records.iter().map(|r| leading(r)));
    let order = |r: &Record| (groups.iter().position(|g| *g == leading(r)), extent(r));
    let dtypes = distinct(records.iter().map(|r| r.dtype.as_str()));
    let parts: Vec<String> = dtypes
        .into_iter()
        .filter_map(|dtype| {
            let mut mine: Vec<&Record> = records.iter().copied().filter(|r| r.dtype == dtype).collect();
            mine.sort_by_key(|r| order(r));
            let cells: Vec<String> = mine.into_iter().filter_map(&cell).collect();
            (!cells.is_empty()).then(|| format!("{} {}", escape_markdown(dtype), cells.join(", ")))
        })
        .collect();
    parts.join("; ")
}

/// "### op", then a row per shape and dtype: shapes grouped by rows (in order of appearance)
/// and sorted by size within a group, so each sweep reads top to bottom; the peer columns where
/// the op has peers, the path where any row has one, the run where the section has several.
fn table(out: &mut String, section: &Section, op: &str) {
    let records = &section.records;
    let mine: Vec<(usize, &Record)> =
        records.iter().enumerate().filter(|(_, r)| r.op == op && is_rill(&r.implementation)).collect();
    let dtypes = distinct(mine.iter().map(|(_, r)| r.dtype.as_str()));
    let groups = distinct(mine.iter().map(|(_, r)| leading(r)));
    let mut rows = mine.clone();
    rows.sort_by_key(|(_, r)| {
        let group = groups.iter().position(|g| *g == leading(r));
        (group, extent(r), dtypes.iter().position(|d| *d == r.dtype))
    });
    let with_peers = implementations(records, op).len() > 1;
    let with_path = mine.iter().any(|(_, r)| !r.path.is_empty() && r.path != "-");
    let with_run = section.runs.len() > 1;

    let _ = writeln!(out, "### {}\n", escape_markdown(op));
    let mut head = String::from("| shape | dtype | GB/s | % of copy |");
    let mut rule = String::from("|---|---|---:|---:|");
    for (wanted, name, align) in [
        (with_peers, "best peer |", "---|"),
        (with_peers, "rill / best |", "---:|"),
        (with_path, "path |", "---|"),
        (with_run, "run |", "---:|"),
    ] {
        if wanted {
            let _ = write!(head, " {name}");
            rule.push_str(align);
        }
    }
    let _ = writeln!(out, "{head}\n{rule}");
    for (index, r) in rows {
        let mut row = format!(
            "| {} | {} | {:.0} | {:.1} |",
            shape_cell(&r.shape),
            escape_markdown(&r.dtype),
            r.gbps,
            100.0 * r.of_copy
        );
        if with_peers {
            match best_peer(records, r) {
                Some((peer, gbps)) => {
                    let _ = write!(row, " {} {gbps:.0} | {:.2} |", escape_markdown(peer), r.gbps / gbps);
                }
                None => row.push_str(" - | - |"),
            }
        }
        if with_path {
            let _ = write!(row, " {} |", escape_markdown(&r.path));
        }
        if with_run {
            let _ = write!(row, " {} |", section.run_of[index] + 1);
        }
        let _ = writeln!(out, "{row}");
    }
}

/// "2^24" for a power-of-two length, "16777215" otherwise, "49152 × 1024" for row ops.
fn shape_cell(shape: &[usize]) -> String {
    match shape {
        [n] if n.is_power_of_two() => format!("2^{}", n.trailing_zeros()),
        _ => rows_text(shape),
    }
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

    /// Elementwise and row ops, two dtypes, a copy per shape, escapes and a non-ASCII path: a
    /// run recorded before headers existed.
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
        let mut runs = parse(SAMPLE).expect("the sample parses");
        assert_eq!((runs.len(), &runs[0].header), (1, &Header::default()), "a bare array is one run, no header");
        runs.remove(0).records
    }

    fn header(date: &str) -> Header {
        Header {
            date: date.into(),
            commit: "abc1234".into(),
            gpu: "NVIDIA H100 80GB HBM3".into(),
            device: "132 SMs, 50 MB L2, DRAM 3.35 TB/s peak".into(),
            driver: "580.159.04, CUDA 13.0".into(),
            ..Header::default()
        }
    }

    fn section(runs: Vec<Run>) -> Section {
        Section::new("sample", runs)
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
    fn round_trip_keeps_every_record_and_header() {
        let mut first = header("2026-11-27");
        first.peers = BTreeMap::from([("torch".into(), "2.11.0+cu130".into()), ("QuACK".into(), "0.6.5".into())]);
        first.note = "a \"quoted\" note".into();
        let run = Run { header: first, records: sample() };
        let json = to_json(std::slice::from_ref(&run)).unwrap();
        assert_eq!(parse(&json).unwrap(), std::slice::from_ref(&run));
        assert_eq!(to_json(&parse(&json).unwrap()).unwrap(), json);
        assert_eq!(json.lines().count(), run.records.len() + 5, "one record per line:\n{json}");
        assert!(json.starts_with("{\n  \"run\": {\"date\":\"2026-11-27\",\"commit\":\"abc1234\","), "{json}");
        assert!(json.contains(r#""shape":"[49152, 1024]""#), "{json}");

        let second = Run { header: header("2026-11-28"), records: sample()[..2].to_vec() };
        let empty = Run::default();
        let runs = [run, second, empty];
        let json = to_json(&runs).unwrap();
        assert_eq!(parse(&json).unwrap(), runs);
        assert_eq!(to_json(&parse(&json).unwrap()).unwrap(), json);
        assert!(json.starts_with("{\n  \"runs\": [\n    {\n      \"run\": {"), "{json}");
        assert!(json.contains("      \"records\": []\n"), "{json}");
        assert_eq!(to_json(&[]).unwrap(), "{\n  \"runs\": [\n  ]\n}\n");
        assert_eq!(parse(&to_json(&[]).unwrap()).unwrap(), []);
    }

    /// The committed record files load, every run with its date, commit and GPU, and read
    /// back as rill-bench writes them.
    #[test]
    fn committed_records_round_trip() {
        let files = [
            include_str!("../../docs/records/sweep-h100.json"),
            include_str!("../../docs/records/small-shapes-h100.json"),
            include_str!("../../docs/records/peers-h100.json"),
            include_str!("../../docs/records/peers-h200.json"),
        ];
        for json in files {
            let runs = parse(json).unwrap();
            for run in &runs {
                let Header { date, commit, gpu, .. } = &run.header;
                assert!(!date.is_empty() && !commit.is_empty() && !gpu.is_empty(), "{:?}", run.header);
                assert!(!run.records.is_empty());
            }
            assert_eq!(to_json(&runs).unwrap(), json);
        }
    }

    #[test]
    fn to_json_keeps_the_recorded_precision() {
        let record = Record { micros: 48.10049, gbps: 2789.96, of_copy: 0.983_549, ..sample()[0].clone() };
        let json = to_json(&[Run { header: Header::default(), records: vec![record] }]).unwrap();
        assert!(json.contains(r#""micros":48.1,"gbps":2790.0,"of_copy":0.9835}"#), "{json}");
        let odd = Record { gbps: f64::NAN, ..sample()[0].clone() };
        assert!(to_json(&[Run { header: Header::default(), records: vec![odd] }]).unwrap().contains(r#""gbps":null"#));
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
        let header = Header {
            gpu: "\"GPU\"\n\u{1}".into(),
            peers: BTreeMap::from([("}{".into(), "\\".into())]),
            ..Header::default()
        };
        let runs = [Run { header, records: vec![record] }];
        assert_eq!(parse(&to_json(&runs).unwrap()).unwrap(), runs);
    }

    #[test]
    fn parse_reads_the_older_format_and_escapes() {
        let old = r#"[{"op": "relu", "dtype": "f32", "len": 65536, "micros": 4.951, "gbps": 105.9, "of_copy": 1.2225, "extra": "x"}]"#;
        let records = parse(old).unwrap().remove(0).records;
        assert_eq!((records[0].shape.as_slice(), records[0].path.as_str()), (&[65536][..], "-"));
        let escaped = r#"[{"op": "\u0061\ud83d\ude00\/", "dtype": "f", "shape": " [ 1 ,2 ] ", "micros": -0, "gbps": 1e3, "of_copy": 2.5E-1}]"#;
        let records = parse(escaped).unwrap().remove(0).records;
        assert_eq!((records[0].op.as_str(), records[0].shape.as_slice()), ("a\u{1f600}/", &[1, 2][..]));
        assert_eq!((records[0].gbps, records[0].of_copy), (1000.0, 0.25));
    }

    /// A header may lack fields or have new ones; a run may lack its header.
    #[test]
    fn parse_reads_partial_headers() {
        let good = r#"{"op": "a", "dtype": "f32", "shape": "[4]", "micros": 1, "gbps": 2, "of_copy": 3}"#;
        let runs =
            parse(&format!(r#"{{"run": {{"gpu": "H200", "new": [1]}}, "records": [{good}], "later": 1}}"#)).unwrap();
        assert_eq!((runs.len(), runs[0].header.gpu.as_str(), runs[0].header.date.as_str()), (1, "H200", ""));
        let runs = parse(&format!(r#" {{"records": [{good}]}}"#)).unwrap();
        assert_eq!((runs[0].header.clone(), runs[0].records.len()), (Header::default(), 1));
        let runs =
            parse(&format!(r#"{{"runs": [{{"records": []}}, {{"run": {{"date": "d"}}, "records": [{good}]}}]}}"#));
        let runs = runs.unwrap();
        assert_eq!((runs.len(), runs[1].header.date.as_str(), runs[1].records.len()), (2, "d", 1));
    }

    #[test]
    fn parse_rejects_malformed_input_with_a_position() {
        let good = r#"{"op": "a", "dtype": "f32", "shape": "[4]", "path": "-", "micros": 1, "gbps": 2, "of_copy": 3}"#;
        assert!(parse(&format!("[{good}]")).is_ok());
        let bad = [
            String::new(),
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
            format!(r#"{{"run": {{"date": 7}}, "records": [{good}]}}"#),
            format!(r#"{{"run": {{"peers": {{"torch": 2}}}}, "records": [{good}]}}"#),
            format!(r#"{{"records": [{good}], "records": []}}"#),
            r#"{"runs": [{"run": {}}]}"#.into(),
            format!(r#"{{"runs": {good}}}"#),
            "{".into(),
            "7".into(),
        ];
        for text in bad {
            let text = if text.starts_with("{\"op\"") { format!("[{text}]") } else { text };
            let error = parse(&text).expect_err(&text).to_string();
            assert!(error.contains(" at line "), "{text}: {error}");
        }
        let error = parse("[\n  {\"op\": 1}]").unwrap_err().to_string();
        assert_eq!(error, "invalid type: integer `1`, expected a string at line 2 column 10");
    }

    /// An object that is neither one run nor several is an error naming the two forms.
    #[test]
    fn parse_rejects_an_object_of_neither_form() {
        let good = r#"{"op": "a", "dtype": "f32", "shape": "[4]", "micros": 1, "gbps": 2, "of_copy": 3}"#;
        for text in [
            "{}".to_string(),
            r#"{"run": {}}"#.into(),
            r#"{"runs": [], "records": []}"#.into(),
            format!(r#"{{"run": {{}}, "runs": [{{"records": [{good}]}}]}}"#),
        ] {
            let error = parse(&text).expect_err(&text).to_string();
            assert!(error.contains("\"runs\" (several)"), "{text}: {error}");
        }
    }

    #[test]
    fn every_truncation_is_an_error() {
        let one = to_json(&[Run { header: header("2026-11-27"), records: sample() }]).unwrap();
        for doc in [SAMPLE, one.as_str()] {
            let end = doc.rfind([']', '}']).unwrap();
            for cut in (0..=end).filter(|&cut| doc.is_char_boundary(cut)) {
                assert!(parse(&doc[..cut]).is_err(), "accepted a document cut at byte {cut}");
            }
        }
    }

    #[test]
    fn corrupted_bytes_never_panic() {
        let several = to_json(&[Run { header: header("d"), records: sample()[..3].to_vec() }, Run::default()]).unwrap();
        for doc in [SAMPLE, several.as_str()] {
            for (at, _) in doc.char_indices() {
                for junk in ["", "\"", "\\", "{", "}", "[", "]", ",", ":", "0", "-", "e", "é", "\\u", "\\ud800"] {
                    let next = doc[at..].chars().next().map_or(0, char::len_utf8);
                    let text = format!("{}{junk}{}", &doc[..at], &doc[at + next..]);
                    let _ = parse(&text);
                }
            }
        }
    }

    #[test]
    fn utc_dates_are_the_calendar_s() {
        assert_eq!(utc_date(0), "1970-01-01");
        assert_eq!(utc_date(86_399), "1970-01-01");
        assert_eq!(utc_date(951_782_400), "2000-02-29");
        assert_eq!(utc_date(951_868_800), "2000-03-01");
        assert_eq!(utc_date(1_709_164_800), "2024-02-29");
        assert_eq!(utc_date(1_798_761_599), "2026-12-31");
        assert_eq!(utc_date(1_798_761_600), "2027-01-01");
        assert_eq!(utc_date(4_107_542_400), "2100-03-01", "2100 is no leap year");
        // Every day from 1970 to 2400 follows the one before.
        let mut previous = utc_date(0);
        for day in 1..157_000u64 {
            let date = utc_date(day * 86_400);
            assert!(date > previous, "{previous} then {date}");
            let (month, day_of_month): (u32, u32) = (date[5..7].parse().unwrap(), date[8..].parse().unwrap());
            assert!((1..=12).contains(&month) && (1..=31).contains(&day_of_month), "{date}");
            previous = date;
        }
    }

    /// A later run's rows replace an earlier run's at the same op, dtype and shape, peers and
    /// all, and only there.
    #[test]
    fn a_section_keeps_the_newest_row_of_each_shape() {
        let old = with_peers();
        let newer: Vec<Record> = sample()
            .into_iter()
            .filter(|r| r.dtype == "f16" && r.shape == [49152, 1024])
            .map(|r| Record { gbps: r.gbps + 1.0, ..r })
            .collect();
        assert_eq!(newer.len(), 2, "the copy and softmax");
        let s = section(vec![
            Run { header: header("2026-11-24"), records: old.clone() },
            Run { header: Header { gpu: String::new(), ..header("2026-11-27") }, records: newer.clone() },
        ]);
        assert_eq!(s.records.len(), s.run_of.len());
        assert_eq!(s.records.len(), old.len() - 4 + 2, "the old copy, softmax and both of its peers went");
        for (r, &run) in s.records.iter().zip(&s.run_of) {
            let replaced = r.dtype == "f16" && r.shape == [49152, 1024];
            assert_eq!(run, usize::from(replaced), "{r:?}");
            assert!(!replaced || is_rill(&r.implementation), "{r:?}");
        }
        assert!(s.records.iter().any(|r| r.implementation == "Liger" && r.dtype == "f32"));
        assert_eq!((s.gpu(), s.title().as_str()), ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3: sample"));
        let unnamed = section(vec![Run::default()]);
        assert_eq!((unnamed.gpu(), unnamed.title().as_str(), unnamed.records.len()), ("", "sample", 0));
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
    fn the_report_names_its_command_sections_and_runs() {
        let s = section(vec![Run { header: header("2026-11-22"), records: sample() }]);
        let text = markdown(&[s], "rill-bench --from-json x.json --perf `P`");
        assert!(text.starts_with("Generated by `rill-bench --from-json x.json --perf 'P'`. "), "{text}");
        assert!(text.contains("\nSections:\n- NVIDIA H100 80GB HBM3: sample: 1 run, 2026-11-22; rill.\n"), "{text}");
        assert!(
            text.contains("\n## NVIDIA H100 80GB HBM3: sample\n\nRun:\n\n1. 2026-11-22, commit abc1234, "),
            "{text}"
        );
        let run = "NVIDIA H100 80GB HBM3 (132 SMs, 50 MB L2, DRAM 3.35 TB/s peak), driver 580.159.04, CUDA 13.0; \
                   no peers (7 rows)\n";
        assert!(text.contains(run), "{text}");
        let unknown = markdown(&[section(vec![Run { header: Header::default(), records: sample() }])], "c");
        assert!(
            unknown.contains("\n## sample\n\nRun:\n\n1. date unknown, commit unknown; no peers (7 rows)\n"),
            "{unknown}"
        );
    }

    #[test]
    fn markdown_has_a_row_per_shape_and_dtype() {
        let text = markdown(&[section(vec![Run { header: header("2026-11-22"), records: sample() }])], "c");
        let gelu = text.find("### gelu").unwrap();
        let softmax = text.find("### softmax").unwrap();
        assert!(gelu < softmax, "elementwise ops first");
        assert!(!text.contains("### copy"));
        assert!(text[gelu..softmax].contains("| shape | dtype | GB/s | % of copy |\n|---|---|---:|---:|\n"), "no path");
        let rows = "| 2^16 | f32 | 106 | 121.8 |\n| 2^24 | f32 | 2744 | 98.4 |\n| 2^24 | f16 | 2506 | 92.8 |\n";
        assert!(text[gelu..softmax].contains(rows), "{text}");
        assert!(text[softmax..].contains("| shape | dtype | GB/s | % of copy | path |\n|---|---|---:|---:|---|\n"));
        let rows = [
            "| 49152 × 32 | f32 | 1634 | 96.2 | warp path: 4 lanes/row \"x\" \\ é\t |",
            "| 49152 × 1024 | f32 | 2939 | 99.1 | warp path: 32 lanes/row |",
            "| 49152 × 1024 | f16 | 2138 | 74.4 | warp path: 32 lanes/row, pack 8 |",
            "| 4096 × 65536 | f32 | 2100 | 70.0 | uncached path |",
        ];
        assert!(text[softmax..].contains(&rows.join("\n")), "sorted by rows, width, dtype:\n{text}");
        assert!(!text.contains("| run |"), "one run: no run column");
    }

    #[test]
    fn the_list_names_where_rill_is_under_90_percent_of_copy() {
        let mut records = sample();
        // Launch-bound (its copy under 10 µs) and a reference row: both under 90%, neither listed.
        records[7].of_copy = 0.5;
        let ladder = Record { op: "rms_norm_ladder/warp_strided".into(), of_copy: 0.3, ..records[9].clone() };
        let chain = Record { op: "dequantize_then_softmax".into(), of_copy: 0.3, ..records[9].clone() };
        records.extend([ladder, chain]);
        let text = markdown(&[section(vec![Run { header: header("d"), records }])], "c");
        let list = &text[text.find("### Where rill is behind").unwrap()..text.find("### gelu").unwrap()];
        assert!(list.contains("Rows under 0.98 of the best peer or under 90% of copy (left out: rows whose copy"));
        let softmax = "- `softmax`: under 90% of copy: f32 4096 × 65536 (70.0%); f16 49152 × 1024 (74.4%).\n";
        assert!(list.contains(softmax), "{list}");
        assert_eq!(list.matches("\n- ").count(), 1, "{list}");
        assert!(text.contains("### rms_norm_ladder/warp_strided"), "references keep their tables");
        let fast: Vec<Record> = sample().into_iter().map(|r| Record { of_copy: 1.0, ..r }).collect();
        let text = markdown(&[section(vec![Run { header: header("d"), records: fast }])], "c");
        assert!(
            text.contains("bandwidth, and rows that compare rather than run one of rill's ops).\n\nNone.\n"),
            "{text}"
        );
    }

    #[test]
    fn peers_get_columns_and_the_shapes_rill_is_behind() {
        let mut versions = header("2026-11-24");
        versions.peers = BTreeMap::from([
            ("QuACK".into(), "0.6.5".into()),
            ("torch".into(), "2.11.0+cu130".into()),
            ("Liger".into(), "0.8.5".into()),
            ("zeta".into(), "1".into()),
            ("triton".into(), "3.6.0".into()),
        ]);
        let text = markdown(&[section(vec![Run { header: versions, records: with_peers() }])], "c");
        assert!(
            text.contains("; PyTorch 2.11.0+cu130, Triton 3.6.0, Liger 0.8.5, QuACK 0.6.5, zeta 1 (7 rows)"),
            "{text}"
        );
        assert!(text.contains("- NVIDIA H100 80GB HBM3: sample: 1 run, 2026-11-24; rill, Liger, torch.compile.\n"));
        let gelu = text.find("### gelu").unwrap();
        let softmax = text.find("### softmax").unwrap();
        assert!(!text[gelu..softmax].contains("best peer"), "an op without peers has no peer columns");
        let head =
            "| shape | dtype | GB/s | % of copy | best peer | rill / best | path |\n|---|---|---:|---:|---|---:|---|\n";
        assert!(text[softmax..].contains(head), "{text}");
        for row in [
            "| 49152 × 32 | f32 | 1634 | 96.2 | - | - | warp path",
            "| 49152 × 1024 | f32 | 2939 | 99.1 | Liger 2000 | 1.47 | warp path: 32 lanes/row |",
            "| 49152 × 1024 | f16 | 2138 | 74.4 | Liger 2500 | 0.86 | warp path: 32 lanes/row, pack 8 |",
        ] {
            assert!(text[softmax..].contains(row), "{row}\n{text}");
        }
        assert!(!text[softmax..].contains("| Liger |"), "peers are not rows of their own");
        let listed = "- `softmax`: behind the best peer: f16 49152 × 1024 (0.86x Liger); under 90% of copy: f32 4096 × 65536 \
                      (70.0%); f16 49152 × 1024 (74.4%).\n";
        assert!(text.contains(listed), "{text}");
    }

    /// Several runs: each listed with the rows it still gives, and each row's run in its table.
    #[test]
    fn several_runs_give_a_run_column() {
        let newer: Vec<Record> = sample().into_iter().filter(|r| r.op == COPY || r.op == "gelu").collect();
        let mut third = header("2026-11-28");
        third.note = "the gelu rows | again.".into();
        let runs =
            vec![Run { header: header("2026-11-27"), records: with_peers() }, Run { header: third, records: newer }];
        let text = markdown(&[section(runs)], "c");
        assert!(text.contains(
            "- NVIDIA H100 80GB HBM3: sample: 2 runs, 2026-11-27 to 2026-11-28; rill, Liger, torch.compile.\n"
        ));
        assert!(
            text.contains("Runs, oldest first; a run's rows replace an earlier run's at the same op, dtype and shape")
        );
        assert!(text.contains("1. 2026-11-27, commit abc1234, "), "{text}");
        assert!(
            text.contains("; no peers (4 rows)\n2. 2026-11-28, "),
            "softmax's four rows stay the first run's:\n{text}"
        );
        assert!(text.contains("\n2. 2026-11-28, commit abc1234. the gelu rows \\| again (3 rows)\n"), "{text}");
        assert!(text.contains("| 2^24 | f16 | 2506 | 92.8 | 2 |"), "{text}");
        assert!(text.contains(
            "| 49152 × 1024 | f16 | 2138 | 74.4 | Liger 2500 | 0.86 | warp path: 32 lanes/row, pack 8 | 1 |"
        ));
        assert!(text.contains("| shape | dtype | GB/s | % of copy | best peer | rill / best | path | run |\n"));
    }

    /// A run names its GPU, driver and peers where they differ from the run before's.
    #[test]
    fn runs_name_what_changed() {
        let one: Vec<Record> = sample().into_iter().filter(|r| r.op == COPY || r.op == "gelu").take(2).collect();
        let mut h200 = Header { gpu: "NVIDIA H200".into(), driver: "590.1".into(), ..header("2026-11-28") };
        h200.peers = BTreeMap::from([("torch".into(), "2.11".into())]);
        let runs = vec![
            Run { header: header("2026-11-27"), records: sample() },
            Run { header: Header { driver: "590.1".into(), ..header("2026-11-27") }, records: sample() },
            Run { header: h200, records: one },
        ];
        let text = markdown(&[section(runs)], "c");
        assert!(text.contains("\n2. 2026-11-27, commit abc1234, driver 590.1 (6 rows)\n"), "{text}");
        assert!(text.contains("\n3. 2026-11-28, commit abc1234, NVIDIA H200 (132 SMs, 50 MB L2, DRAM 3.35 TB/s peak); PyTorch 2.11 (1 row)\n"), "{text}");
    }

    /// Sections follow one another in the order given, each with its own list and tables.
    #[test]
    fn each_record_file_is_a_section() {
        let h200 = Header { gpu: "NVIDIA H200".into(), ..header("2026-11-28") };
        let sections = [
            Section::new("sweep-h100", vec![Run { header: header("2026-11-27"), records: sample() }]),
            Section::new("peers-h200", vec![Run { header: h200, records: with_peers() }]),
        ];
        let text = markdown(&sections, "c");
        let first = text.find("\n## NVIDIA H100 80GB HBM3: sweep-h100\n").unwrap();
        let second = text.find("\n## NVIDIA H200: peers-h200\n").unwrap();
        assert!(first < second);
        assert!(text.contains(
            "Sections:\n- NVIDIA H100 80GB HBM3: sweep-h100: 1 run, 2026-11-27; rill.\n- NVIDIA H200: \
                               peers-h200: 1 run, 2026-11-28; rill, Liger, torch.compile.\n"
        ));
        assert_eq!(text.matches("### Where rill is behind").count(), 2);
        assert!(!text[first..second].contains("best peer |"), "{text}");
        assert!(text[second..].contains("best peer |"));
        assert_eq!(markdown(&[], "c").matches("##").count(), 0);
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
