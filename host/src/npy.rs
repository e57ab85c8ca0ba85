//! A small reader and writer for NumPy `.npy` files, enough to move tensors between rill and
//! Python: little-endian `float32`, `float16` and `int64` arrays in C order (`int32` is read
//! too, widened to `int64`).
//!
//! Reading accepts format versions 1.0, 2.0 and 3.0 and any header padding. Writing produces
//! the same bytes as `numpy.save`: version 1.0 (2.0 when the header is too long for it), the
//! header padded with spaces and a newline so that the data starts at a multiple of 64 bytes.
//!
//! Malformed bytes give [`Error::InvalidInput`], well-formed files of a dtype or layout this
//! module does not read give [`Error::Unsupported`]; no input makes it panic.
//!
//! ```
//! use rill::npy::{self, NpyData, NpyDataRef};
//! let bytes = npy::to_bytes(&[2, 3], NpyDataRef::F32(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]));
//! let array = npy::parse(&bytes)?;
//! assert_eq!(array.shape, [2, 3]);
//! assert_eq!(array.data, NpyData::F32(vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]));
//! # Ok::<(), rill::Error>(())
//! ```

use crate::error::{Error, Result, invalid};
use half::f16;
use std::path::Path;

const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// The data starts at a multiple of this many bytes (numpy's `ARRAY_ALIGN`).
const ALIGN: usize = 64;
/// numpy leaves room in the header for the first dimension to grow to this many digits.
const GROWTH_AXIS_MAX_DIGITS: usize = 21;
/// Nesting deeper than this in a header is rejected rather than recursed into.
const MAX_DEPTH: usize = 16;
const SUPPORTED: &str = "'<f4' (float32), '<f2' (float16), '<i8' (int64) and '<i4' (int32, read as int64)";

/// The elements of an array read from a `.npy` file, in C (row-major) order.
#[derive(Clone, Debug, PartialEq)]
pub enum NpyData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    I64(Vec<i64>),
}

/// Borrowed elements to write to a `.npy` file, in C (row-major) order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NpyDataRef<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    I64(&'a [i64]),
}

/// An array read from a `.npy` file.
#[derive(Clone, Debug, PartialEq)]
pub struct NpyArray {
    /// The dimensions; empty for a scalar (one element).
    pub shape: Vec<usize>,
    pub data: NpyData,
}

impl NpyData {
    pub fn len(&self) -> usize {
        self.as_ref().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The numpy name of the element type: `float32`, `float16` or `int64`.
    pub fn dtype_name(&self) -> &'static str {
        self.as_ref().dtype_name()
    }

    pub fn as_ref(&self) -> NpyDataRef<'_> {
        match self {
            NpyData::F32(v) => NpyDataRef::F32(v),
            NpyData::F16(v) => NpyDataRef::F16(v),
            NpyData::I64(v) => NpyDataRef::I64(v),
        }
    }
}

impl NpyDataRef<'_> {
    pub fn len(&self) -> usize {
        match self {
            NpyDataRef::F32(v) => v.len(),
            NpyDataRef::F16(v) => v.len(),
            NpyDataRef::I64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The numpy name of the element type: `float32`, `float16` or `int64`.
    pub fn dtype_name(&self) -> &'static str {
        match self {
            NpyDataRef::F32(_) => "float32",
            NpyDataRef::F16(_) => "float16",
            NpyDataRef::I64(_) => "int64",
        }
    }

    fn descr(&self) -> &'static str {
        match self {
            NpyDataRef::F32(_) => "<f4",
            NpyDataRef::F16(_) => "<f2",
            NpyDataRef::I64(_) => "<i8",
        }
    }
}

/// Reads a `.npy` file; errors name the file.
pub fn read(path: &Path) -> Result<NpyArray> {
    let bytes = std::fs::read(path).map_err(|err| Error::InvalidInput(format!("{}: {err}", path.display())))?;
    parse(&bytes).map_err(|err| match err {
        Error::InvalidInput(message) => Error::InvalidInput(format!("{}: {message}", path.display())),
        Error::Unsupported(message) => Error::Unsupported(format!("{}: {message}", path.display())),
        other => other,
    })
}

/// Parses the bytes of a `.npy` file.
pub fn parse(bytes: &[u8]) -> Result<NpyArray> {
    if bytes.len() < MAGIC.len() + 2 {
        if MAGIC.starts_with(bytes) || bytes.starts_with(MAGIC) {
            invalid!("truncated .npy file: it is only {} bytes", bytes.len());
        }
        invalid!("not a .npy file: it does not start with the magic string \\x93NUMPY");
    }
    if &bytes[..MAGIC.len()] != MAGIC {
        invalid!("not a .npy file: it does not start with the magic string \\x93NUMPY");
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (length_bytes, utf8) = match (major, minor) {
        (1, 0) => (2, false),
        (2, 0) => (4, false),
        (3, 0) => (4, true),
        _ => {
            return Err(Error::Unsupported(format!(
                ".npy format version {major}.{minor}; supported versions are 1.0, 2.0 and 3.0"
            )));
        }
    };
    let header_start = 8 + length_bytes;
    let Some(length_field) = bytes.get(8..header_start) else {
        invalid!("truncated .npy file: it ends inside the header length");
    };
    let header_len = length_field.iter().rev().fold(0usize, |n, &b| (n << 8) | usize::from(b));
    let Some(header) = bytes.get(header_start..).and_then(|rest| rest.get(..header_len)) else {
        invalid!(
            "truncated .npy file: the header is {header_len} bytes but only {} follow the preamble",
            bytes.len() - header_start
        );
    };
    let header: String = if utf8 {
        match std::str::from_utf8(header) {
            Ok(text) => text.to_owned(),
            Err(err) => invalid!("the .npy header is not valid UTF-8: {err}"),
        }
    } else {
        // Versions 1.0 and 2.0 encode the header as latin-1, which maps bytes to code points.
        header.iter().map(|&b| char::from(b)).collect()
    };
    let header = Header::parse(&header)?;
    let payload = &bytes[header_start + header_len..];

    let element_count = header.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let byte_count = element_count.and_then(|n| n.checked_mul(header.dtype.size()));
    let (Some(element_count), Some(byte_count)) = (element_count, byte_count) else {
        invalid!("the .npy shape {:?} has more elements than fit in memory", header.shape);
    };
    if payload.len() != byte_count {
        invalid!(
            "the .npy data is {} bytes, but shape {:?} of {} needs {byte_count} ({element_count} elements of {} bytes){}",
            payload.len(),
            header.shape,
            header.dtype.name(),
            header.dtype.size(),
            if payload.len() < byte_count { ": the file is truncated" } else { "" }
        );
    }
    let data = match header.dtype {
        Dtype::F32 => NpyData::F32(decode(payload, |b: [u8; 4]| f32::from_le_bytes(b))),
        Dtype::F16 => NpyData::F16(decode(payload, |b: [u8; 2]| f16::from_bits(u16::from_le_bytes(b)))),
        Dtype::I64 => NpyData::I64(decode(payload, i64::from_le_bytes)),
        Dtype::I32 => NpyData::I64(decode(payload, |b: [u8; 4]| i64::from(i32::from_le_bytes(b)))),
    };
    Ok(NpyArray { shape: header.shape, data })
}

fn decode<const N: usize, T>(payload: &[u8], from_bytes: impl Fn([u8; N]) -> T) -> Vec<T> {
    payload.as_chunks::<N>().0.iter().map(|&chunk| from_bytes(chunk)).collect()
}

/// Writes `data` with dimensions `shape` to a `.npy` file.
pub fn write(path: &Path, shape: &[usize], data: NpyDataRef<'_>) -> Result<()> {
    check_len(shape, data)?;
    std::fs::write(path, to_bytes(shape, data)).map_err(|err| Error::InvalidInput(format!("{}: {err}", path.display())))
}

/// The bytes of a `.npy` file holding `data` with dimensions `shape`, identical to what
/// `numpy.save` writes for the same array.
///
/// # Panics
///
/// If `data` does not have as many elements as `shape` describes ([`write`] returns an
/// error instead).
pub fn to_bytes(shape: &[usize], data: NpyDataRef<'_>) -> Vec<u8> {
    if let Err(err) = check_len(shape, data) {
        panic!("npy::to_bytes: {err}");
    }
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape_repr = match dims.as_slice() {
        [one] => format!("({one},)"),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '{}', 'fortran_order': False, 'shape': {shape_repr}, }}", data.descr());
    if let Some(first) = dims.first() {
        header.push_str(&" ".repeat(GROWTH_AXIS_MAX_DIGITS.saturating_sub(first.len())));
    }
    // Like numpy: version 1.0 unless the padded header overflows its 16-bit length.
    let padded_len = |prefix_len: usize| {
        let unpadded = prefix_len + header.len() + 1;
        header.len() + 1 + ALIGN - unpadded % ALIGN
    };
    let (version, header_len) = match padded_len(10) {
        len if len <= usize::from(u16::MAX) => (1u8, len),
        _ => (2u8, padded_len(12)),
    };

    let mut bytes = Vec::with_capacity(12 + header_len + data.len() * 8);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&[version, 0]);
    if version == 1 {
        bytes.extend_from_slice(&(header_len as u16).to_le_bytes());
    } else {
        // A header of 4 GiB would not fit in memory as a String first.
        bytes.extend_from_slice(&u32::try_from(header_len).unwrap_or(u32::MAX).to_le_bytes());
    }
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + header_len - header.len() - 1, b' ');
    bytes.push(b'\n');
    match data {
        NpyDataRef::F32(v) => v.iter().for_each(|x| bytes.extend_from_slice(&x.to_le_bytes())),
        NpyDataRef::F16(v) => v.iter().for_each(|x| bytes.extend_from_slice(&x.to_bits().to_le_bytes())),
        NpyDataRef::I64(v) => v.iter().for_each(|x| bytes.extend_from_slice(&x.to_le_bytes())),
    }
    bytes
}

fn check_len(shape: &[usize], data: NpyDataRef<'_>) -> Result<()> {
    let count = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    if count != Some(data.len()) {
        invalid!("shape {shape:?} does not describe the {} elements given", data.len());
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Dtype {
    F32,
    F16,
    I64,
    I32,
}

impl Dtype {
    fn from_descr(descr: &str) -> Result<Dtype> {
        let unsupported = |what: &str| Err(Error::Unsupported(format!("{what}; supported dtypes are {SUPPORTED}")));
        let mut chars = descr.chars();
        let order = chars.next();
        let kind = chars.as_str();
        // '=' is native order, little-endian on every host rill runs on; '|' ("not
        // applicable") is unambiguous once the host order is little-endian too.
        let little = matches!(order, Some('<')) || matches!(order, Some('=' | '|')) && cfg!(target_endian = "little");
        if matches!(order, Some('>')) || matches!(order, Some('=' | '|')) && !little {
            return unsupported(&format!("big-endian dtype '{descr}'"));
        }
        match (little, kind) {
            (true, "f4") => Ok(Dtype::F32),
            (true, "f2") => Ok(Dtype::F16),
            (true, "i8") => Ok(Dtype::I64),
            (true, "i4") => Ok(Dtype::I32),
            _ => unsupported(&format!("dtype '{descr}'")),
        }
    }

    fn size(self) -> usize {
        match self {
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F16 => 2,
            Dtype::I64 => 8,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "float32",
            Dtype::F16 => "float16",
            Dtype::I64 => "int64",
            Dtype::I32 => "int32",
        }
    }
}

/// The three keys of a `.npy` header that matter.
struct Header {
    dtype: Dtype,
    shape: Vec<usize>,
}

impl Header {
    fn parse(text: &str) -> Result<Header> {
        let shown = excerpt(text);
        let mut parser = Parser { rest: text };
        let dict = match parser.value(0) {
            Ok(Literal::Dict(entries)) => entries,
            Ok(other) => invalid!("the .npy header is not a dict but {}", other.describe()),
            Err(message) => {
                let offset = text.len() - parser.rest.len();
                invalid!("the .npy header {shown} is not a Python literal: {message} at character {offset}")
            }
        };
        parser.skip_padding();
        if !parser.rest.is_empty() {
            invalid!("the .npy header has {} after the dict", excerpt(parser.rest));
        }
        let get = |key: &str| {
            // A repeated key means its last value, as in Python.
            let found = dict.iter().rev().find(|(k, _)| matches!(k, Literal::Str(s) if s == key)).map(|(_, v)| v);
            found.map_or_else(|| invalid!("the .npy header {shown} has no '{key}'"), Ok)
        };

        let dtype = match get("descr")? {
            Literal::Str(descr) => Dtype::from_descr(descr)?,
            Literal::List(_) => {
                return Err(Error::Unsupported(format!("structured dtypes; supported dtypes are {SUPPORTED}")));
            }
            other => invalid!("the .npy 'descr' is {}, not a dtype string", other.describe()),
        };
        match get("fortran_order")? {
            Literal::Bool(false) => {}
            Literal::Bool(true) => {
                return Err(Error::Unsupported(
                    "Fortran-order (column-major) arrays; save a C-order array, e.g. with np.ascontiguousarray".into(),
                ));
            }
            other => invalid!("the .npy 'fortran_order' is {}, not True or False", other.describe()),
        }
        let shape = match get("shape")? {
            Literal::Tuple(dims) => dims
                .iter()
                .map(|d| match d {
                    Literal::Int(n) => usize::try_from(*n).ok(),
                    _ => None,
                })
                .collect::<Option<Vec<usize>>>(),
            _ => None,
        };
        let Some(shape) = shape else {
            invalid!("the .npy 'shape' is {}, not a tuple of non-negative integers", get("shape")?.describe());
        };
        Ok(Header { dtype, shape })
    }
}

/// `text` quoted, cut short if long.
fn excerpt(text: &str) -> String {
    const MAX_CHARS: usize = 100;
    match text.char_indices().nth(MAX_CHARS) {
        Some((end, _)) => format!("{:?}...", &text[..end]),
        None => format!("{text:?}"),
    }
}

/// The Python literals a `.npy` header is made of.
#[derive(Debug, PartialEq)]
enum Literal {
    Str(String),
    Int(i128),
    Bool(bool),
    None,
    Tuple(Vec<Literal>),
    List(Vec<Literal>),
    Dict(Vec<(Literal, Literal)>),
}

impl Literal {
    fn describe(&self) -> String {
        match self {
            Literal::Str(s) => format!("the string {}", excerpt(s)),
            Literal::Int(n) => format!("the integer {n}"),
            Literal::Bool(true) => "True".into(),
            Literal::Bool(false) => "False".into(),
            Literal::None => "None".into(),
            Literal::Tuple(_) => "a tuple".into(),
            Literal::List(_) => "a list".into(),
            Literal::Dict(_) => "a dict".into(),
        }
    }
}

/// A recursive-descent parser for the subset of Python literal syntax numpy writes.
struct Parser<'a> {
    rest: &'a str,
}

type ParseResult<T> = std::result::Result<T, String>;

impl Parser<'_> {
    fn skip_whitespace(&mut self) {
        self.rest = self.rest.trim_start_matches([' ', '\t', '\n', '\r']);
    }

    /// Whitespace and the NUL bytes some writers pad with.
    fn skip_padding(&mut self) {
        self.rest = self.rest.trim_start_matches([' ', '\t', '\n', '\r', '\0']);
    }

    fn peek(&mut self) -> Option<char> {
        self.skip_whitespace();
        self.rest.chars().next()
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.rest = &self.rest[c.len_utf8()..];
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> ParseResult<Literal> {
        if depth > MAX_DEPTH {
            return Err(format!("nested more than {MAX_DEPTH} deep"));
        }
        match self.peek() {
            Some('{') => {
                self.rest = &self.rest[1..];
                let mut entries = Vec::new();
                while !self.eat('}') {
                    let key = self.value(depth + 1)?;
                    if !self.eat(':') {
                        return Err(format!("expected ':' after the key {}", key.describe()));
                    }
                    entries.push((key, self.value(depth + 1)?));
                    if !self.eat(',') && self.peek() != Some('}') {
                        return Err("expected ',' or '}' in the dict".into());
                    }
                }
                Ok(Literal::Dict(entries))
            }
            Some(open @ ('(' | '[')) => {
                self.rest = &self.rest[1..];
                let close = if open == '(' { ')' } else { ']' };
                let mut items = Vec::new();
                let mut trailing_comma = false;
                while !self.eat(close) {
                    items.push(self.value(depth + 1)?);
                    trailing_comma = self.eat(',');
                    if !trailing_comma && self.peek() != Some(close) {
                        return Err(format!("expected ',' or '{close}'"));
                    }
                }
                Ok(match (open, items.len(), trailing_comma) {
                    // `(x)` is just `x` in Python; a one-element tuple is `(x,)`.
                    ('(', 1, false) => items.pop().unwrap_or(Literal::None),
                    ('(', ..) => Literal::Tuple(items),
                    _ => Literal::List(items),
                })
            }
            Some(quote @ ('\'' | '"')) => self.string(quote).map(Literal::Str),
            Some(c) if c.is_ascii_digit() || c == '-' || c == '+' => self.integer().map(Literal::Int),
            Some(c) if c.is_ascii_alphabetic() => {
                let end = self.rest.find(|c: char| !c.is_ascii_alphanumeric() && c != '_').unwrap_or(self.rest.len());
                let (word, rest) = self.rest.split_at(end);
                let value = match word {
                    "True" => Literal::Bool(true),
                    "False" => Literal::Bool(false),
                    "None" => Literal::None,
                    _ => return Err(format!("unexpected name {word:?}")),
                };
                self.rest = rest;
                Ok(value)
            }
            Some(c) => Err(format!("unexpected {c:?}")),
            None => Err("unexpected end".into()),
        }
    }

    fn string(&mut self, quote: char) -> ParseResult<String> {
        let mut chars = self.rest.char_indices().skip(1);
        let mut value = String::new();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, escaped @ ('\\' | '\'' | '"'))) => value.push(escaped),
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, 't')) => value.push('\t'),
                    Some((_, other)) => {
                        value.push('\\');
                        value.push(other);
                    }
                    None => break,
                },
                c if c == quote => {
                    self.rest = &self.rest[i + 1..];
                    return Ok(value);
                }
                c => value.push(c),
            }
        }
        Err("unterminated string".into())
    }

    fn integer(&mut self) -> ParseResult<i128> {
        let sign_len = usize::from(self.rest.starts_with(['-', '+']));
        let digits_end =
            self.rest[sign_len..].find(|c: char| !c.is_ascii_digit()).map_or(self.rest.len(), |i| i + sign_len);
        let text = &self.rest[..digits_end];
        let value = text.parse::<i128>().map_err(|err| format!("bad integer {text:?}: {err}"))?;
        self.rest = &self.rest[digits_end..];
        // Python 2 numpy wrote long integers with an `L` suffix, e.g. `(3L, 4L)`.
        if let Some(rest) = self.rest.strip_prefix(['L', 'l']) {
            self.rest = rest;
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What numpy 1.x (and 2.x) writes for `np.save(f, np.arange(6, dtype=np.float32).reshape(2, 3))`.
    fn numpy_arange_2x3() -> Vec<u8> {
        let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
        // Magic (6) + version (2) + header length (2) = 10 bytes before the header; numpy
        // pads the header with spaces and a newline to make the preamble 128 bytes.
        assert_eq!(header.len(), 59);
        let padding = 128 - 10 - header.len() - 1;
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend_from_slice(&118u16.to_le_bytes());
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend(std::iter::repeat_n(b' ', padding));
        bytes.push(b'\n');
        assert_eq!(bytes.len(), 128);
        for x in 0..6 {
            bytes.extend_from_slice(&(x as f32).to_le_bytes());
        }
        bytes
    }

    fn header_file(header: &str, payload: &[u8]) -> Vec<u8> {
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(payload);
        bytes
    }

    fn round_trip(shape: &[usize], data: NpyDataRef<'_>) {
        let bytes = to_bytes(shape, data);
        let header_len = usize::from(u16::from_le_bytes([bytes[8], bytes[9]]));
        assert_eq!((10 + header_len) % ALIGN, 0, "preamble not aligned for shape {shape:?}");
        let array = parse(&bytes).unwrap();
        assert_eq!(array.shape, shape);
        assert_eq!(array.data.as_ref(), data);
    }

    fn shapes() -> [&'static [usize]; 4] {
        [&[], &[0], &[5], &[2, 3]]
    }

    fn count(shape: &[usize]) -> usize {
        shape.iter().product()
    }

    #[test]
    fn f32_round_trips() {
        for shape in shapes() {
            let data: Vec<f32> = (0..count(shape)).map(|i| i as f32 * -1.5 + 0.25).collect();
            round_trip(shape, NpyDataRef::F32(&data));
        }
        round_trip(&[4], NpyDataRef::F32(&[f32::INFINITY, f32::MIN_POSITIVE, -0.0, f32::MAX]));
    }

    #[test]
    fn f16_round_trips() {
        for shape in shapes() {
            let data: Vec<f16> = (0..count(shape)).map(|i| f16::from_f32(i as f32 / 3.0 - 1.0)).collect();
            round_trip(shape, NpyDataRef::F16(&data));
        }
    }

    #[test]
    fn i64_round_trips() {
        for shape in shapes() {
            let data: Vec<i64> = (0..count(shape)).map(|i| (i as i64 - 2) * 1_000_000_000_007).collect();
            round_trip(shape, NpyDataRef::I64(&data));
        }
        round_trip(&[2], NpyDataRef::I64(&[i64::MIN, i64::MAX]));
    }

    #[test]
    fn nan_payload_survives() {
        let nan = f32::from_bits(0x7fc0_1234);
        let array = parse(&to_bytes(&[1], NpyDataRef::F32(&[nan]))).unwrap();
        let NpyData::F32(v) = array.data else { panic!("wrong dtype") };
        assert_eq!(v[0].to_bits(), 0x7fc0_1234);
    }

    #[test]
    fn parses_what_numpy_writes() {
        let array = parse(&numpy_arange_2x3()).unwrap();
        assert_eq!(array, NpyArray { shape: vec![2, 3], data: NpyData::F32(vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]) });
    }

    #[test]
    fn writes_what_numpy_writes() {
        let data = [0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(to_bytes(&[2, 3], NpyDataRef::F32(&data)), numpy_arange_2x3());
    }

    #[test]
    fn writes_version_2_when_the_header_is_long() {
        let shape = vec![1usize; 30_000];
        let bytes = to_bytes(&shape, NpyDataRef::F16(&[f16::ONE]));
        assert_eq!(bytes[6..8], [2, 0]);
        let header_len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
        assert_eq!((12 + header_len) % ALIGN, 0);
        let array = parse(&bytes).unwrap();
        assert_eq!(array.shape, shape);
        assert_eq!(array.data, NpyData::F16(vec![f16::ONE]));
    }

    #[test]
    fn reads_versions_2_and_3() {
        for version in [2u8, 3] {
            let header = "{'shape': (2,), 'fortran_order': False, 'descr': '<i8'}\n";
            let mut bytes = vec![0x93, b'N', b'U', b'M', b'P', b'Y', version, 0];
            bytes.extend_from_slice(&(header.len() as u32).to_le_bytes());
            bytes.extend_from_slice(header.as_bytes());
            bytes.extend_from_slice(&7i64.to_le_bytes());
            bytes.extend_from_slice(&(-7i64).to_le_bytes());
            assert_eq!(parse(&bytes).unwrap(), NpyArray { shape: vec![2], data: NpyData::I64(vec![7, -7]) });
        }
    }

    #[test]
    fn accepts_other_byte_order_marks_and_int32() {
        let one = 1.0f32.to_le_bytes();
        for descr in ["=f4", "|f4"] {
            let bytes = header_file(&format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ()}}"), &one);
            assert_eq!(parse(&bytes).unwrap(), NpyArray { shape: vec![], data: NpyData::F32(vec![1.0]) });
        }
        let mut payload = (-3i32).to_le_bytes().to_vec();
        payload.extend_from_slice(&i32::MAX.to_le_bytes());
        let bytes = header_file("{\"descr\": \"<i4\", \"fortran_order\": False, \"shape\": (2L,)}", &payload);
        assert_eq!(parse(&bytes).unwrap().data, NpyData::I64(vec![-3, i32::MAX as i64]));
    }

    fn invalid_message(bytes: &[u8]) -> String {
        match parse(bytes) {
            Err(Error::InvalidInput(message)) => message,
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    fn unsupported_message(bytes: &[u8]) -> String {
        match parse(bytes) {
            Err(Error::Unsupported(message)) => message,
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }

    #[test]
    fn rejects_truncated_files() {
        let bytes = numpy_arange_2x3();
        for len in 0..bytes.len() {
            let message = invalid_message(&bytes[..len]);
            assert!(!message.is_empty());
        }
        assert!(invalid_message(&bytes[..bytes.len() - 1]).contains("truncated"));
        assert!(invalid_message(&bytes[..20]).contains("truncated"));
    }

    #[test]
    fn rejects_extra_data() {
        let mut bytes = numpy_arange_2x3();
        bytes.push(0);
        assert!(invalid_message(&bytes).contains("needs 24"));
    }

    #[test]
    fn rejects_bad_magic() {
        let mut bytes = numpy_arange_2x3();
        bytes[1] = b'n';
        assert!(invalid_message(&bytes).contains("magic"));
        assert!(invalid_message(b"PK\x03\x04").contains("magic"));
    }

    #[test]
    fn rejects_unknown_versions() {
        let mut bytes = numpy_arange_2x3();
        bytes[6] = 4;
        assert!(unsupported_message(&bytes).contains("version 4.0"));
    }

    #[test]
    fn rejects_fortran_order() {
        let bytes = header_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", &[0; 24]);
        assert!(unsupported_message(&bytes).contains("Fortran"));
    }

    #[test]
    fn rejects_big_endian_and_other_dtypes() {
        let bytes = header_file("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", &[0; 24]);
        let message = unsupported_message(&bytes);
        assert!(message.contains("'>f4'") && message.contains("'<f2'"), "{message}");
        let bytes = header_file("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", &[0; 24]);
        let message = unsupported_message(&bytes);
        assert!(message.contains("'<f8'") && message.contains("'<f4' (float32)"), "{message}");
        let bytes = header_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", &[0; 4]);
        assert!(unsupported_message(&bytes).contains("structured"));
    }

    #[test]
    fn rejects_malformed_headers() {
        for header in [
            "",
            "{",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), ",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)} junk",
            "{'descr': '<f4', 'fortran_order': False}",
            "{'descr': '<f4', 'fortran_order': 0, 'shape': (6,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (-6,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (6)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2.0, 3)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999999999999999999999,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296)}",
            "{'descr: '<f4', 'fortran_order': False, 'shape': (6,)}",
            "{'descr': '<f4' 'fortran_order': False, 'shape': (6,)}",
            "{'descr': <f4, 'fortran_order': False, 'shape': (6,)}",
            "{'descr': '<f4', 'fortran_order': false, 'shape': (6,)}",
            "['descr', '<f4']",
        ] {
            let bytes = header_file(header, &[0; 24]);
            let message = invalid_message(&bytes);
            assert!(message.contains(".npy"), "{header}: {message}");
        }
        let deep = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {}}}", "(".repeat(100_000));
        invalid_message(&header_file(&deep, &[]));
    }

    #[test]
    fn never_panics_on_corrupted_bytes() {
        let original = numpy_arange_2x3();
        for i in 0..original.len() {
            for value in [0u8, b' ', b'(', b')', b'\'', b'{', 0x80, 0xff] {
                let mut bytes = original.clone();
                bytes[i] = value;
                let _ = parse(&bytes);
            }
        }
        let mut utf8 = original.clone();
        utf8[6] = 3;
        utf8[20] = 0xff;
        let _ = parse(&utf8);
    }

    #[test]
    fn write_checks_the_element_count() {
        let path = std::env::temp_dir().join(format!("rill-npy-test-{}.npy", std::process::id()));
        assert!(matches!(write(&path, &[2, 2], NpyDataRef::F32(&[1.0])), Err(Error::InvalidInput(_))));
        write(&path, &[2], NpyDataRef::F32(&[1.0, 2.0])).unwrap();
        assert_eq!(read(&path).unwrap().data, NpyData::F32(vec![1.0, 2.0]));
        std::fs::remove_file(&path).unwrap();
        let missing = read(&path);
        assert!(matches!(&missing, Err(Error::InvalidInput(m)) if m.contains("rill-npy-test")), "{missing:?}");
    }
}
