//! Reporting for `rill-bench`: the JSON records it writes (and reads back), one SVG plot of
//! effective bandwidth per op, and a Markdown section spliced into a document such as
//! `docs/PERF.md`.
//!
//! Std only, so the benchmark keeps its short dependency list. The JSON side therefore knows
//! just the flat format the benchmark writes: an array of objects whose values are strings and
//! numbers. Every function here is total: malformed input gives `Err`, odd records (NaN, empty
//! shapes) are skipped or shown as gaps, nothing panics.

use std::fmt::Write as _;

/// One measurement, as one object of the benchmark's JSON.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// Kernel name, or "copy" for the device-to-device copy that is the ceiling.
    pub op: String,
    /// Element type: "f32", "f16", "bf16".
    pub dtype: String,
    /// `[n]` for elementwise ops, `[rows, cols]` for row ops.
    pub shape: Vec<usize>,
    /// How the kernel was launched (e.g. "warp path: ..."), or "-" where there is no choice.
    pub path: String,
    /// Median device time of one launch.
    pub micros: f64,
    /// Effective bandwidth: bytes the op must move over `micros`.
    pub gbps: f64,
    /// `gbps` over the copy's at the same shape and dtype (1 for the copy itself).
    pub of_copy: f64,
}

/// The op name of the ceiling rows.
const COPY: &str = "copy";

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

/// Parses the JSON the benchmark writes: an array of flat objects with the fields of
/// [`Record`]; "shape" is a string such as "[49152, 1024]". Also reads the older format with a
/// number "len" instead of "shape" and no "path" (taken as "-"), so earlier runs stay readable.
/// Unknown keys are ignored so a newer writer's extra fields don't break an older reader.
/// Errors name the line, column and byte offset; no input panics.
pub fn parse(json: &str) -> Result<Vec<Record>, String> {
    let mut parser = Parser { text: json, pos: 0 };
    let records = parser.array()?;
    parser.skip_whitespace();
    if parser.pos < json.len() {
        return Err(parser.error("unexpected text after the array"));
    }
    Ok(records)
}

/// Serializes records in the benchmark's format, one object per line, with the precision the
/// benchmark has always written (so `to_json(&parse(doc)?)` reproduces a document it wrote).
/// Non-finite numbers, which no measurement produces, are written as `null` to keep the JSON
/// valid; `parse` rejects them.
pub fn to_json(records: &[Record]) -> String {
    let mut out = String::from("[\n");
    for (i, r) in records.iter().enumerate() {
        let comma = if i + 1 < records.len() { "," } else { "" };
        let _ = writeln!(
            out,
            "  {{\"op\": {}, \"dtype\": {}, \"shape\": {}, \"path\": {}, \"micros\": {}, \"gbps\": {}, \"of_copy\": {}}}{comma}",
            quote(&r.op),
            quote(&r.dtype),
            quote(&shape_text(&r.shape)),
            quote(&r.path),
            json_number(r.micros, 3),
            json_number(r.gbps, 1),
            json_number(r.of_copy, 4),
        );
    }
    out.push_str("]\n");
    out
}

/// "[49152, 1024]": the shape as the benchmark's JSON writes it.
fn shape_text(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    format!("[{}]", dims.join(", "))
}

/// The inverse of [`shape_text`]; `None` unless it is a non-empty list of plain integers.
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

/// A JSON string literal.
fn quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A number with fixed decimals, or `null` where JSON has no spelling for it.
fn json_number(value: f64, decimals: usize) -> String {
    if value.is_finite() { format!("{value:.decimals$}") } else { "null".into() }
}

/// A value of the flat format.
enum Value {
    Str(String),
    Num(f64),
}

/// One key of an object, with where its value starts (for error messages).
struct Field {
    key: String,
    at: usize,
    value: Value,
}

/// A cursor over the document. Positions are byte offsets; every read goes through `peek` or
/// `str::get`, so a truncated or mangled document ends in an error, never an out-of-bounds
/// index.
struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    /// Consumes `byte` if it is next.
    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        if found {
            self.pos += 1;
        }
        found
    }

    fn expect(&mut self, byte: u8, what: &str) -> Result<(), String> {
        if self.eat(byte) { Ok(()) } else { Err(self.error(&format!("expected {what}"))) }
    }

    fn error(&self, message: &str) -> String {
        self.error_at(self.pos, message)
    }

    /// "line 3, column 14 (byte 120): expected ',' or '}', found 'x'".
    fn error_at(&self, pos: usize, message: &str) -> String {
        let bytes = self.text.as_bytes();
        let before = &bytes[..pos.min(bytes.len())];
        let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
        let column = 1 + before.len() - before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let found = match self.text.get(pos..).and_then(|rest| rest.chars().next()) {
            Some(c) => format!("found {c:?}"),
            None if pos >= bytes.len() => "found the end of the input".into(),
            None => "found a partial character".into(),
        };
        format!("line {line}, column {column} (byte {pos}): {message}, {found}")
    }

    /// `[ record, ... ]`
    fn array(&mut self) -> Result<Vec<Record>, String> {
        self.skip_whitespace();
        self.expect(b'[', "'[' to open the array of records")?;
        let mut records = Vec::new();
        self.skip_whitespace();
        if self.eat(b']') {
            return Ok(records);
        }
        loop {
            self.skip_whitespace();
            records.push(self.record()?);
            self.skip_whitespace();
            if self.eat(b']') {
                return Ok(records);
            }
            self.expect(b',', "',' or ']' after a record")?;
        }
    }

    /// One object, checked for the fields a [`Record`] needs.
    fn record(&mut self) -> Result<Record, String> {
        let start = self.pos;
        let fields = self.object()?;
        Ok(Record {
            op: self.string_field(&fields, "op", start)?,
            dtype: self.string_field(&fields, "dtype", start)?,
            shape: self.shape_field(&fields, start)?,
            path: match find(&fields, "path") {
                Some(_) => self.string_field(&fields, "path", start)?,
                None => "-".into(),
            },
            micros: self.number_field(&fields, "micros", start)?,
            gbps: self.number_field(&fields, "gbps", start)?,
            of_copy: self.number_field(&fields, "of_copy", start)?,
        })
    }

    /// `{ "key": value, ... }` with string keys, string or number values and no repeated key.
    fn object(&mut self) -> Result<Vec<Field>, String> {
        self.expect(b'{', "'{' to open a record")?;
        let mut fields = Vec::new();
        self.skip_whitespace();
        if self.eat(b'}') {
            return Ok(fields);
        }
        loop {
            self.skip_whitespace();
            let key_at = self.pos;
            let key = self.string()?;
            if find(&fields, &key).is_some() {
                return Err(self.error_at(key_at, &format!("repeated key {key:?}")));
            }
            self.skip_whitespace();
            self.expect(b':', "':' after a key")?;
            self.skip_whitespace();
            let at = self.pos;
            let value = self.value()?;
            fields.push(Field { key, at, value });
            self.skip_whitespace();
            if self.eat(b'}') {
                return Ok(fields);
            }
            self.expect(b',', "',' or '}' after a value")?;
        }
    }

    fn value(&mut self) -> Result<Value, String> {
        match self.peek() {
            Some(b'"') => self.string().map(Value::Str),
            Some(b'-' | b'0'..=b'9') => self.number().map(Value::Num),
            _ => Err(self.error("expected a string or a number (the only values of this format)")),
        }
    }

    /// A string literal with JSON's escapes; raw control characters are rejected, as in JSON.
    fn string(&mut self) -> Result<String, String> {
        self.expect(b'"', "'\"' to open a string")?;
        let mut out = String::new();
        loop {
            let run = self.pos;
            while matches!(self.peek(), Some(b) if b != b'"' && b != b'\\' && b >= 0x20) {
                self.pos += 1;
            }
            // The run stops at an ASCII byte or at the end, both character boundaries.
            out.push_str(self.text.get(run..self.pos).unwrap_or_default());
            match self.peek() {
                None => return Err(self.error("unterminated string")),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => out.push(self.escape()?),
                Some(_) => return Err(self.error("control character in a string")),
            }
        }
    }

    /// The character of a backslash escape, the cursor on the backslash.
    fn escape(&mut self) -> Result<char, String> {
        let at = self.pos;
        self.pos += 1;
        let c = match self.peek() {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                self.pos += 1;
                return self.unicode_escape(at);
            }
            _ => return Err(self.error_at(at, "invalid escape")),
        };
        self.pos += 1;
        Ok(c)
    }

    /// `\uXXXX`, or a surrogate pair of two, the cursor after the first `u`.
    fn unicode_escape(&mut self, at: usize) -> Result<char, String> {
        let high = self.hex4()?;
        let code = if (0xD800..0xDC00).contains(&high) {
            if !(self.eat(b'\\') && self.eat(b'u')) {
                return Err(self.error_at(at, "high surrogate without its low half"));
            }
            let low = self.hex4()?;
            if !(0xDC00..0xE000).contains(&low) {
                return Err(self.error_at(at, "high surrogate without its low half"));
            }
            0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
        } else {
            high
        };
        char::from_u32(code).ok_or_else(|| self.error_at(at, "lone low surrogate"))
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self.text.get(self.pos..self.pos + 4).filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()));
        let code = digits.and_then(|d| u32::from_str_radix(d, 16).ok());
        let code = code.ok_or_else(|| self.error("expected four hex digits"))?;
        self.pos += 4;
        Ok(code)
    }

    /// A number in JSON's grammar (no leading zeros, no bare '.', no NaN), finite.
    fn number(&mut self) -> Result<f64, String> {
        let start = self.pos;
        self.eat(b'-');
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => self.digits()?,
            _ => return Err(self.error("expected a digit")),
        }
        if self.eat(b'.') {
            self.digits()?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            self.digits()?;
        }
        let value: Option<f64> = self.text.get(start..self.pos).and_then(|t| t.parse().ok());
        value.filter(|v| v.is_finite()).ok_or_else(|| self.error_at(start, "number out of range"))
    }

    /// One or more decimal digits.
    fn digits(&mut self) -> Result<(), String> {
        if !matches!(self.peek(), Some(b'0'..=b'9')) {
            return Err(self.error("expected a digit"));
        }
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        Ok(())
    }

    fn string_field(&self, fields: &[Field], key: &str, object_at: usize) -> Result<String, String> {
        match find(fields, key) {
            Some(Field { value: Value::Str(text), .. }) => Ok(text.clone()),
            Some(field) => Err(self.error_at(field.at, &format!("{key:?} must be a string"))),
            None => Err(self.error_at(object_at, &format!("record without {key:?}"))),
        }
    }

    fn number_field(&self, fields: &[Field], key: &str, object_at: usize) -> Result<f64, String> {
        match find(fields, key) {
            Some(Field { value: Value::Num(number), .. }) => Ok(*number),
            Some(field) => Err(self.error_at(field.at, &format!("{key:?} must be a number"))),
            None => Err(self.error_at(object_at, &format!("record without {key:?}"))),
        }
    }

    /// "shape": "[rows, cols]", or the older format's "len": n.
    fn shape_field(&self, fields: &[Field], object_at: usize) -> Result<Vec<usize>, String> {
        if let Some(field) = find(fields, "shape") {
            let shape = match &field.value {
                Value::Str(text) => parse_shape(text),
                Value::Num(_) => None,
            };
            return shape.ok_or_else(|| self.error_at(field.at, "\"shape\" must be a string like \"[49152, 1024]\""));
        }
        let Some(field) = find(fields, "len") else {
            return Err(self.error_at(object_at, "record without \"shape\""));
        };
        match field.value {
            // 2^53: beyond it an f64 no longer holds every integer.
            Value::Num(n) if n >= 0.0 && n.fract() == 0.0 && n <= 9_007_199_254_740_992.0 => Ok(vec![n as usize]),
            _ => Err(self.error_at(field.at, "\"len\" must be a non-negative integer")),
        }
    }
}

fn find<'f>(fields: &'f [Field], key: &str) -> Option<&'f Field> {
    fields.iter().find(|field| field.key == key)
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
    let mut counts: Vec<(&[usize], usize)> = Vec::new();
    for record in records.iter().filter(|r| r.op == op) {
        match counts.iter_mut().find(|(rows, _)| *rows == leading(record)) {
            Some((_, count)) => *count += 1,
            None => counts.push((leading(record), 1)),
        }
    }
    let mut best: (&[usize], usize) = (&[], 0);
    for (rows, count) in counts {
        if count > best.1 {
            best = (rows, count);
        }
    }
    best.0
}

/// Every op but the copy: elementwise ops first, then row ops, each in order of appearance.
fn ops(records: &[Record]) -> Vec<&str> {
    let all = distinct(records.iter().map(|r| r.op.as_str()).filter(|&op| op != COPY));
    let (elementwise, rows): (Vec<&str>, Vec<&str>) = all.iter().partition(|&&op| sweep_rows(records, op).is_empty());
    elementwise.into_iter().chain(rows).collect()
}

/// "49152" or "8 × 4096": leading dimensions for a title.
fn rows_text(rows: &[usize]) -> String {
    let dims: Vec<String> = rows.iter().map(usize::to_string).collect();
    dims.join(" × ")
}

// ---------------------------------------------------------------------------------------------
// SVG plots
// ---------------------------------------------------------------------------------------------

const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 500.0;
/// The plot area's edges; the right margin holds the legend, outside the data.
const LEFT: f64 = 80.0;
const RIGHT: f64 = WIDTH - 180.0;
const TOP: f64 = 70.0;
const BOTTOM: f64 = HEIGHT - 60.0;

/// Colours by dtype, in order of the dtype's first appearance in the whole run, so a dtype
/// keeps its colour across plots (matplotlib's defaults: distinct, and readable when paled).
const PALETTE: [(u8, u8, u8); 8] = [
    (31, 119, 180),
    (214, 39, 40),
    (44, 160, 44),
    (255, 127, 14),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (23, 190, 207),
];

/// One SVG plot per op but the copy, named "<op>.svg": effective GB/s against n (elementwise
/// ops) or cols (row ops, only the op's most common rows, so the line is one sweep), both on
/// a log2 axis; a line with markers per dtype and that dtype's copy ceiling dashed and paler.
pub fn plots(records: &[Record], device: &str) -> Vec<(String, String)> {
    let dtypes = distinct(records.iter().map(|r| r.dtype.as_str()));
    ops(records).into_iter().map(|op| (file_name(op), plot(records, op, &dtypes, device))).collect()
}

/// "<op>.svg", any character that could leave the directory replaced.
fn file_name(op: &str) -> String {
    let safe: String =
        op.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    format!("{safe}.svg")
}

/// The points of one dtype in one plot: (x, GB/s, shape) for the op and for the copy ceiling.
struct Series<'a> {
    dtype: &'a str,
    colour: (u8, u8, u8),
    points: Vec<(usize, f64, &'a Record)>,
    ceiling: Vec<(usize, f64)>,
}

/// The op's sweep in one dtype, sorted by size, with the copies at the same shapes; `None`
/// when the dtype has no plottable point. Zero sizes and non-finite GB/s have no place on a
/// log axis and are left out.
fn series<'a>(records: &'a [Record], op: &str, rows: &[usize], dtype: &'a str, index: usize) -> Option<Series<'a>> {
    let plottable = |r: &&Record| r.dtype == dtype && leading(r) == rows && extent(r) > 0 && r.gbps.is_finite();
    let mut points: Vec<(usize, f64, &Record)> =
        records.iter().filter(|r| r.op == op).filter(plottable).map(|r| (extent(r), r.gbps, r)).collect();
    if points.is_empty() {
        return None;
    }
    points.sort_by_key(|p| p.0);
    let mut ceiling: Vec<(usize, f64)> = records
        .iter()
        .filter(|r| r.op == COPY)
        .filter(plottable)
        .filter(|copy| points.iter().any(|p| p.2.shape == copy.shape))
        .map(|copy| (extent(copy), copy.gbps))
        .collect();
    ceiling.sort_by_key(|p| p.0);
    Some(Series { dtype, colour: PALETTE[index % PALETTE.len()], points, ceiling })
}

/// Maps data to pixels: x on a log2 axis over whole powers of two, y linear from 0.
struct Frame {
    log_lo: f64,
    log_hi: f64,
    y_top: f64,
}

impl Frame {
    fn x(&self, value: usize) -> f64 {
        LEFT + (RIGHT - LEFT) * ((value as f64).log2() - self.log_lo) / (self.log_hi - self.log_lo)
    }

    fn y(&self, gbps: f64) -> f64 {
        BOTTOM - (BOTTOM - TOP) * gbps.clamp(0.0, self.y_top) / self.y_top
    }
}

fn plot(records: &[Record], op: &str, dtypes: &[&str], device: &str) -> String {
    let rows = sweep_rows(records, op);
    let all: Vec<Series> =
        dtypes.iter().enumerate().filter_map(|(i, dtype)| series(records, op, rows, dtype, i)).collect();
    let sizes: Vec<usize> =
        all.iter().flat_map(|s| s.points.iter().map(|p| p.0).chain(s.ceiling.iter().map(|c| c.0))).collect();
    let lo = sizes.iter().copied().min().unwrap_or(1).max(1);
    let hi = sizes.iter().copied().max().unwrap_or(1).max(1);
    let (mut log_lo, mut log_hi) = ((lo as f64).log2().floor(), (hi as f64).log2().ceil());
    if log_hi <= log_lo {
        (log_lo, log_hi) = (log_lo - 1.0, log_hi + 1.0);
    }
    let highest = all.iter().flat_map(|s| s.points.iter().map(|p| p.1).chain(s.ceiling.iter().map(|c| c.1)));
    let (y_top, y_step) = round_top(highest.fold(0.0, f64::max));
    let frame = Frame { log_lo: log_lo.max(0.0), log_hi, y_top };

    let title = if rows.is_empty() {
        format!("{op}: effective bandwidth")
    } else {
        format!("{op}: effective bandwidth ({} rows)", rows_text(rows))
    };
    let x_label = if rows.is_empty() { "n (elements)" } else { "cols (elements per row)" };

    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" \
         font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n\
         <rect width=\"{WIDTH}\" height=\"{HEIGHT}\" fill=\"white\"/>\n"
    );
    let centre = (LEFT + RIGHT) / 2.0;
    let _ = writeln!(
        svg,
        "<text x=\"{centre}\" y=\"28\" text-anchor=\"middle\" font-size=\"17\" font-weight=\"bold\">{}</text>",
        escape_xml(&title)
    );
    let _ = writeln!(
        svg,
        "<text x=\"{centre}\" y=\"50\" text-anchor=\"middle\" fill=\"#555\">{}</text>",
        escape_xml(device)
    );
    y_axis(&mut svg, &frame, y_step);
    x_axis(&mut svg, &frame, x_label);
    for s in &all {
        draw_series(&mut svg, &frame, s);
    }
    legend(&mut svg, &all);
    svg.push_str("</svg>");
    svg
}

/// The smallest 1, 2 or 5 × 10^k step that covers `max` in at most 8 steps, and the first
/// multiple of it strictly above `max`, so the highest point never touches the frame.
fn round_top(max: f64) -> (f64, f64) {
    let max = if max.is_finite() && max > 0.0 { max } else { 1.0 };
    let mut exponent = max.log10().floor() as i32 - 2;
    loop {
        for mantissa in [1.0, 2.0, 5.0] {
            let step = mantissa * 10f64.powi(exponent);
            let steps = (max / step).floor() + 1.0;
            if steps <= 8.0 {
                return (steps * step, step);
            }
        }
        exponent += 1;
    }
}

/// Horizontal grid lines with GB/s labels, and the axis title.
fn y_axis(svg: &mut String, frame: &Frame, step: f64) {
    let decimals = if step >= 1.0 { 0 } else { (-step.log10().floor()) as usize };
    let ticks = (frame.y_top / step).round() as usize;
    for i in 0..=ticks {
        let value = i as f64 * step;
        let y = frame.y(value);
        let stroke = if i == 0 { "#333" } else { "#e4e4e4" };
        let _ = writeln!(svg, "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{RIGHT}\" y2=\"{y:.1}\" stroke=\"{stroke}\"/>");
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{y:.1}\" dy=\"0.35em\" text-anchor=\"end\">{value:.decimals$}</text>",
            LEFT - 8.0
        );
    }
    let middle = (TOP + BOTTOM) / 2.0;
    let _ = writeln!(
        svg,
        "<text x=\"22\" y=\"{middle}\" text-anchor=\"middle\" transform=\"rotate(-90 22 {middle})\">effective GB/s</text>"
    );
}

/// A vertical grid line at every power of two and at most 9 labels, from the first power
/// (every other one or sparser on wide sweeps, so labels never collide), and the axis title.
fn x_axis(svg: &mut String, frame: &Frame, title: &str) {
    let (first, last) = (frame.log_lo as u32, frame.log_hi as u32);
    let stride = (last - first).div_ceil(8).max(1);
    for exponent in first..=last {
        let x = frame.x(1usize.checked_shl(exponent).unwrap_or(usize::MAX));
        let labelled = (exponent - first) % stride == 0;
        let stroke = if exponent == first {
            "#333"
        } else if labelled {
            "#e4e4e4"
        } else {
            "#f3f3f3"
        };
        let _ = writeln!(svg, "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{BOTTOM}\" stroke=\"{stroke}\"/>");
        if labelled {
            let _ = writeln!(
                svg,
                "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                BOTTOM + 18.0,
                power_of_two(exponent)
            );
        }
    }
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{title}, log scale</text>",
        (LEFT + RIGHT) / 2.0,
        BOTTOM + 44.0
    );
}

/// 2^exponent as people say it: 512, 1K, 32K, 256M.
fn power_of_two(exponent: u32) -> String {
    let units = ["", "K", "M", "G", "T", "P", "E"];
    let unit = (exponent / 10).min(units.len() as u32 - 1);
    let mantissa = 1u64.checked_shl(exponent - 10 * unit).unwrap_or(u64::MAX);
    format!("{mantissa}{}", units[unit as usize])
}

/// The dashed ceiling first, so the op's line and markers stay on top where they meet.
fn draw_series(svg: &mut String, frame: &Frame, series: &Series) {
    let colour = hex(series.colour);
    if !series.ceiling.is_empty() {
        let points: Vec<String> =
            series.ceiling.iter().map(|&(x, gbps)| format!("{:.1},{:.1}", frame.x(x), frame.y(gbps))).collect();
        let _ = writeln!(
            svg,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>",
            points.join(" "),
            hex(paler(series.colour))
        );
    }
    let points: Vec<String> =
        series.points.iter().map(|&(x, gbps, _)| format!("{:.1},{:.1}", frame.x(x), frame.y(gbps))).collect();
    let _ = writeln!(
        svg,
        "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" stroke-linejoin=\"round\"/>",
        points.join(" ")
    );
    for &(x, gbps, record) in &series.points {
        let tip = format!(
            "{} {} {}: {gbps:.1} GB/s, {:.1}% of copy",
            record.op,
            record.dtype,
            shape_text(&record.shape),
            100.0 * record.of_copy
        );
        let _ = writeln!(
            svg,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{colour}\" stroke=\"white\" stroke-width=\"1\"><title>{}</title></circle>",
            frame.x(x),
            frame.y(gbps),
            escape_xml(&tip)
        );
    }
}

/// Per dtype, a sample of its line with a marker and, if measured, of its dashed ceiling.
fn legend(svg: &mut String, all: &[Series]) {
    let x = RIGHT + 20.0;
    let mut y = TOP + 10.0;
    for series in all {
        let colour = hex(series.colour);
        let name = escape_xml(series.dtype);
        let _ = writeln!(
            svg,
            "<line x1=\"{x}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"{colour}\" stroke-width=\"2\"/>\
             <circle cx=\"{}\" cy=\"{y}\" r=\"3.5\" fill=\"{colour}\"/>\
             <text x=\"{}\" y=\"{y}\" dy=\"0.35em\">{name}</text>",
            x + 28.0,
            x + 14.0,
            x + 36.0
        );
        y += 20.0;
        if !series.ceiling.is_empty() {
            let _ = writeln!(
                svg,
                "<line x1=\"{x}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"{}\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\
                 <text x=\"{}\" y=\"{y}\" dy=\"0.35em\">{name} copy (ceiling)</text>",
                x + 28.0,
                hex(paler(series.colour)),
                x + 36.0
            );
            y += 20.0;
        }
        y += 6.0;
    }
}

/// Halfway to white: the same hue, clearly secondary to the op's own line.
fn paler((r, g, b): (u8, u8, u8)) -> (u8, u8, u8) {
    let mix = |c: u8| c + (255 - c) / 2;
    (mix(r), mix(g), mix(b))
}

fn hex((r, g, b): (u8, u8, u8)) -> String {
    format!("#{r:02x}{g:02x}{b:02x}")
}

/// Text safe inside an SVG element or attribute (device names may hold '&' or '<').
fn escape_xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
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
    for &op in &ops {
        out.push('\n');
        table(&mut out, records, op);
    }
    let weakest: Vec<String> = ops.iter().filter_map(|op| weakest(records, op)).collect();
    let weakest = if weakest.is_empty() { "none measured".to_string() } else { weakest.join("; ") };
    let _ = writeln!(out, "\nWeakest per op: {weakest}.");
    out
}

/// "### op", then the table: shapes grouped by rows (in order of appearance) and sorted by
/// size within a group, so each sweep reads top to bottom.
fn table(out: &mut String, records: &[Record], op: &str) {
    let mine: Vec<&Record> = records.iter().filter(|r| r.op == op).collect();
    let dtypes = distinct(mine.iter().map(|r| r.dtype.as_str()));
    let with_path = mine.iter().any(|r| !r.path.is_empty() && r.path != "-");
    let groups = distinct(mine.iter().map(|r| leading(r)));
    let mut shapes = distinct(mine.iter().map(|r| r.shape.as_slice()));
    shapes.sort_by_key(|shape| {
        (groups.iter().position(|g| *g == &shape[..shape.len().saturating_sub(1)]), shape.last().copied())
    });

    let _ = writeln!(out, "### {}\n", escape_markdown(op));
    let mut header = String::from("| shape |");
    let mut rule = String::from("|---|");
    for dtype in &dtypes {
        let _ = write!(header, " {} GB/s (of copy) |", escape_markdown(dtype));
        rule.push_str("---:|");
    }
    if with_path {
        header.push_str(" path |");
        rule.push_str("---|");
    }
    let _ = writeln!(out, "{header}\n{rule}");
    for shape in shapes {
        let cells: Vec<Option<&Record>> =
            dtypes.iter().map(|dtype| mine.iter().copied().find(|r| r.dtype == *dtype && r.shape == shape)).collect();
        let mut line = format!("| {} |", shape_cell(shape));
        for cell in &cells {
            let text = cell.map_or_else(|| "-".to_string(), |r| format!("{:.0} ({:.1}%)", r.gbps, 100.0 * r.of_copy));
            let _ = write!(line, " {text} |");
        }
        if with_path {
            let _ = write!(line, " {} |", escape_markdown(&path_cell(&dtypes, &cells)));
        }
        let _ = writeln!(out, "{line}");
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
        .filter(|r| r.op == op && r.of_copy.is_finite())
        .min_by(|a, b| a.of_copy.total_cmp(&b.of_copy))?;
    Some(format!(
        "{} {} {} at {:.1}% of copy",
        escape_markdown(op),
        escape_markdown(&worst.dtype),
        shape_cell(&worst.shape),
        100.0 * worst.of_copy
    ))
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
    fn round_trip_reproduces_the_document() {
        let records = sample();
        assert_eq!(to_json(&records), SAMPLE);
        assert_eq!(parse(&to_json(&records)).unwrap(), records);
        assert_eq!(parse(&to_json(&[])).unwrap(), vec![]);
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
        };
        assert_eq!(parse(&to_json(std::slice::from_ref(&record))).unwrap(), vec![record]);
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
            let error = parse(&text).expect_err(&text);
            assert!(error.starts_with("line 1, column "), "{error}");
        }
        let error = parse("[\n  {\"op\": 1}]").unwrap_err();
        assert!(error.starts_with("line 2, column 10 (byte 11): \"op\" must be a string"), "{error}");
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
        let plots = plots(&sample(), "NVIDIA H100 <80GB> & \"HBM3\"");
        let names: Vec<&str> = plots.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["gelu.svg", "softmax.svg"]);
        for (name, svg) in &plots {
            assert!(svg.starts_with("<svg"), "{name}");
            assert!(svg.ends_with("</svg>"), "{name}");
            assert_well_formed(svg);
            assert!(svg.contains("NVIDIA H100 &lt;80GB&gt; &amp; &quot;HBM3&quot;"));
            assert!(svg.contains("stroke-dasharray"), "{name} has its copy ceiling");
        }
        let (gelu, softmax) = (&plots[0].1, &plots[1].1);
        assert!(gelu.contains(">gelu: effective bandwidth<"));
        assert!(softmax.contains(">softmax: effective bandwidth (49152 rows)<"));
        // f32 and f16: a line and a ceiling each.
        assert_eq!(gelu.matches("<polyline").count(), 4);
        assert_eq!(softmax.matches("<polyline").count(), 4);
        // Only the 49152-row sweep: 2 f32 points and 1 f16, not the 4096-row shape.
        assert_eq!(softmax.matches("<title>").count(), 3);
        assert!(!softmax.contains("[4096, 65536]"));
        assert!(gelu.contains(">64K<") && gelu.contains(">16M<"));
        assert!(softmax.contains(">32<") && softmax.contains(">1K<"));
    }

    #[test]
    fn plots_survive_odd_records() {
        let mut records = sample();
        records[1].gbps = f64::NAN;
        records[3].shape = vec![0];
        records.push(Record { shape: vec![], ..records[1].clone() });
        records.push(Record { op: "lone".into(), shape: vec![7], gbps: 0.0, ..records[1].clone() });
        for (_, svg) in plots(&records, "gpu") {
            assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
            assert_well_formed(&svg);
            assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
        }
        assert!(plots(&[], "gpu").is_empty());
    }

    #[test]
    fn round_top_is_a_round_number_above_the_max() {
        assert_eq!(round_top(3034.4), (3500.0, 500.0));
        assert_eq!(round_top(2998.0), (3000.0, 500.0));
        assert_eq!(round_top(3000.0), (3500.0, 500.0));
        assert_eq!(round_top(105.9), (120.0, 20.0));
        let (top, step) = round_top(0.0);
        assert!((top - 1.2).abs() < 1e-9 && (step - 0.2).abs() < 1e-9, "an empty plot still has an axis");
        assert_eq!(round_top(f64::NAN), round_top(0.0));
        assert_eq!(
            [power_of_two(5), power_of_two(10), power_of_two(15), power_of_two(28)],
            ["32", "1K", "32K", "256M"]
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
