//! NumPy `.npy` files through `npyz`: the little- or big-endian `float32`, `float16`, `int64`
//! and `int32` arrays in C order that rill reads and writes (`int32` holds a ReLU mask's
//! words, and class indices where NumPy's default integer is 32 bits). `.npy` has no standard
//! bfloat16, so none is offered.
//!
//! Errors are messages naming the file; no file makes this module panic.

use half::f16;
use npyz::{AutoSerialize, DType, Deserialize, NpyFile, NpyHeader, Order, TypeChar, WriterBuilder};
use std::io::{BufWriter, Write};
use std::path::Path;

const SUPPORTED: &str = "float32 ('<f4'), float16 ('<f2'), int64 ('<i8') and int32 ('<i4')";

/// NumPy's limit on dimensions (`NPY_MAXDIMS`); npyz writes headers only up to 64 KiB.
const MAX_DIMS: usize = 64;

/// The elements of an array, in C (row-major) order. `f16` is the one rill computes with.
#[derive(Clone, Debug, PartialEq)]
pub enum NpyData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    I64(Vec<i64>),
    I32(Vec<i32>),
}

impl NpyData {
    pub fn len(&self) -> usize {
        match self {
            NpyData::F32(v) => v.len(),
            NpyData::F16(v) => v.len(),
            NpyData::I64(v) => v.len(),
            NpyData::I32(v) => v.len(),
        }
    }

    /// The NumPy name of the element type, as messages show it.
    pub fn dtype_name(&self) -> &'static str {
        match self {
            NpyData::F32(_) => "float32",
            NpyData::F16(_) => "float16",
            NpyData::I64(_) => "int64",
            NpyData::I32(_) => "int32",
        }
    }

    /// int32 values as int64 (class indices, which the library takes as int64), others as
    /// they are.
    pub fn widened(self) -> Self {
        match self {
            NpyData::I32(v) => NpyData::I64(v.into_iter().map(i64::from).collect()),
            other => other,
        }
    }

    /// A bitmask's words as int32 of the same bits: NumPy and PyTorch handle int32 everywhere,
    /// uint32 not.
    pub fn from_words(words: Vec<u32>) -> Self {
        NpyData::I32(words.into_iter().map(u32::cast_signed).collect())
    }

    /// The bits of int32 values as a bitmask's words, as [`NpyData::from_words`] wrote them.
    pub fn words(&self) -> Option<Vec<u32>> {
        if let NpyData::I32(v) = self { Some(v.iter().map(|w| w.cast_unsigned()).collect()) } else { None }
    }
}

/// An array read from a `.npy` file.
#[derive(Clone, Debug, PartialEq)]
pub struct NpyArray {
    /// The dimensions; empty for a scalar (one element).
    pub shape: Vec<usize>,
    pub data: NpyData,
}

/// Reads a `.npy` file.
pub fn read(path: &Path) -> Result<NpyArray, String> {
    let bytes = std::fs::read(path).map_err(|err| format!("{}: {err}", path.display()))?;
    parse(&bytes).map_err(|err| format!("{}: {err}", path.display()))
}

/// Parses the bytes of a `.npy` file. The payload's length is checked against the header
/// first, so a truncated or padded file is named as such rather than misread.
fn parse(bytes: &[u8]) -> Result<NpyArray, String> {
    let mut payload = bytes;
    let header = NpyHeader::from_reader(&mut payload).map_err(|err| format!("not a readable .npy file: {err}"))?;
    if header.order() == Order::Fortran {
        return Err("Fortran-order (column-major) arrays are not supported; save a C-order array, e.g. with \
                    np.ascontiguousarray"
            .into());
    }
    let DType::Plain(type_str) = header.dtype() else {
        return Err(format!("structured dtypes are not supported; supported dtypes are {SUPPORTED}"));
    };
    if header.shape().len() > MAX_DIMS {
        return Err(format!("{} dimensions, more than NumPy's {MAX_DIMS}", header.shape().len()));
    }
    let shape = header.shape().iter().map(|&d| usize::try_from(d).ok()).collect::<Option<Vec<usize>>>();
    let element_count = shape.as_ref().and_then(|shape| shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)));
    let byte_count = element_count.zip(type_str.num_bytes()).and_then(|(n, size)| n.checked_mul(size));
    let (Some(shape), Some(byte_count)) = (shape, byte_count) else {
        return Err(format!("the shape {:?} has more elements than fit in memory", header.shape()));
    };
    if payload.len() != byte_count {
        let truncated = if payload.len() < byte_count { ": the file is truncated" } else { "" };
        return Err(format!(
            "the data is {} bytes, but shape {shape:?} of '{type_str}' needs {byte_count}{truncated}",
            payload.len()
        ));
    }
    let file = NpyFile::with_header(header, payload);
    let data = match (type_str.type_char(), type_str.size_field()) {
        (TypeChar::Float, 4) => NpyData::F32(values(file)?),
        (TypeChar::Float, 2) => {
            NpyData::F16(values::<npyz::half::f16>(file)?.into_iter().map(|x| f16::from_bits(x.to_bits())).collect())
        }
        (TypeChar::Int, 8) => NpyData::I64(values(file)?),
        (TypeChar::Int, 4) => NpyData::I32(values(file)?),
        _ => return Err(format!("dtype '{type_str}' is not supported; supported dtypes are {SUPPORTED}")),
    };
    Ok(NpyArray { shape, data })
}

fn values<T: Deserialize>(file: NpyFile<&[u8]>) -> Result<Vec<T>, String> {
    file.into_vec().map_err(|err| format!("unreadable data: {err}"))
}

/// Writes `data` with dimensions `shape` to a `.npy` file in C order.
pub fn write(path: &Path, shape: &[usize], data: &NpyData) -> Result<(), String> {
    if shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) != Some(data.len()) {
        return Err(format!("{}: shape {shape:?} does not describe the {} elements given", path.display(), data.len()));
    }
    if shape.len() > MAX_DIMS {
        return Err(format!("{}: {} dimensions, more than NumPy's {MAX_DIMS}", path.display(), shape.len()));
    }
    let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    let written = std::fs::File::create(path).and_then(|file| {
        let out = BufWriter::new(file);
        match data {
            NpyData::F32(v) => write_values(out, &shape, v.iter().copied()),
            NpyData::F16(v) => write_values(out, &shape, v.iter().map(|x| npyz::half::f16::from_bits(x.to_bits()))),
            NpyData::I64(v) => write_values(out, &shape, v.iter().copied()),
            NpyData::I32(v) => write_values(out, &shape, v.iter().copied()),
        }
    });
    written.map_err(|err| format!("{}: {err}", path.display()))
}

fn write_values<T: AutoSerialize>(
    out: impl Write,
    shape: &[u64],
    values: impl IntoIterator<Item = T>,
) -> std::io::Result<()> {
    let mut writer = npyz::WriteOptions::new().default_dtype().shape(shape).writer(out).begin_nd()?;
    writer.extend(values)?;
    writer.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A file name in the temp folder unique to this process and `name`, removed when dropped.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str) -> Self {
            TempFile(std::env::temp_dir().join(format!("rill-cli-npy-{}-{name}.npy", std::process::id())))
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// What numpy writes for `np.save(f, np.arange(6, dtype=np.float32).reshape(2, 3))`.
    fn numpy_arange_2x3() -> Vec<u8> {
        let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
        // Magic (6) + version (2) + header length (2) = 10 bytes before the header; numpy
        // pads the header with spaces and a newline to make the preamble 128 bytes.
        let mut bytes = header_file(&format!("{header}{}\n", " ".repeat(128 - 10 - header.len() - 1)), &[]);
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

    fn round_trip(name: &str, shape: &[usize], data: NpyData) {
        let file = TempFile::new(name);
        write(&file.0, shape, &data).unwrap();
        let bytes = std::fs::read(&file.0).unwrap();
        let header_len = usize::from(u16::from_le_bytes([bytes[8], bytes[9]]));
        assert_eq!((10 + header_len) % 64, 0, "data not aligned as numpy aligns it, shape {shape:?}");
        assert_eq!(read(&file.0).unwrap(), NpyArray { shape: shape.to_vec(), data });
    }

    const SHAPES: [&[usize]; 5] = [&[], &[0], &[5], &[2, 3], &[2, 0, 3]];

    fn count(shape: &[usize]) -> usize {
        shape.iter().product()
    }

    #[test]
    fn f32_round_trips() {
        for shape in SHAPES {
            let data = (0..count(shape)).map(|i| i as f32 * -1.5 + 0.25).collect();
            round_trip("f32", shape, NpyData::F32(data));
        }
        round_trip("f32-edge", &[4], NpyData::F32(vec![f32::INFINITY, f32::MIN_POSITIVE, -0.0, f32::MAX]));
    }

    #[test]
    fn f16_round_trips() {
        for shape in SHAPES {
            let data = (0..count(shape)).map(|i| f16::from_f32(i as f32 / 3.0 - 1.0)).collect();
            round_trip("f16", shape, NpyData::F16(data));
        }
        round_trip("f16-edge", &[3], NpyData::F16(vec![f16::MAX, f16::MIN_POSITIVE_SUBNORMAL, f16::NEG_INFINITY]));
    }

    #[test]
    fn i64_round_trips() {
        for shape in SHAPES {
            let data = (0..count(shape)).map(|i| (i as i64 - 2) * 1_000_000_000_007).collect();
            round_trip("i64", shape, NpyData::I64(data));
        }
        round_trip("i64-edge", &[2], NpyData::I64(vec![i64::MIN, i64::MAX]));
    }

    #[test]
    fn i32_round_trips_and_holds_mask_words_bit_for_bit() {
        for shape in SHAPES {
            round_trip("i32", shape, NpyData::I32((0..count(shape)).map(|i| i as i32 * -7).collect()));
        }
        let words = vec![0, 1, 0x8000_0000, u32::MAX, 0xdead_beef];
        let data = NpyData::from_words(words.clone());
        assert_eq!(data.words(), Some(words));
        round_trip("words", &[5], data);
        assert_eq!(NpyData::F32(vec![1.0]).words(), None);
    }

    #[test]
    fn nan_payload_survives() {
        let file = TempFile::new("nan");
        let nan = f32::from_bits(0x7fc0_1234);
        write(&file.0, &[1], &NpyData::F32(vec![nan])).unwrap();
        let NpyData::F32(v) = read(&file.0).unwrap().data else { panic!("wrong dtype") };
        assert_eq!(v[0].to_bits(), 0x7fc0_1234);
    }

    #[test]
    fn parses_what_numpy_writes() {
        let array = parse(&numpy_arange_2x3()).unwrap();
        assert_eq!(array, NpyArray { shape: vec![2, 3], data: NpyData::F32(vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]) });
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
    fn reads_big_endian_and_int32() {
        let bytes = header_file("{'descr': '>f4', 'fortran_order': False, 'shape': ()}", &1.0f32.to_be_bytes());
        assert_eq!(parse(&bytes).unwrap(), NpyArray { shape: vec![], data: NpyData::F32(vec![1.0]) });
        let bytes = header_file("{'descr': '>f2', 'fortran_order': False, 'shape': (1,)}", &[0x3c, 0x00]);
        assert_eq!(parse(&bytes).unwrap().data, NpyData::F16(vec![f16::ONE]));
        let mut payload = (-3i32).to_le_bytes().to_vec();
        payload.extend_from_slice(&i32::MAX.to_le_bytes());
        let bytes = header_file("{\"descr\": \"<i4\", \"fortran_order\": False, \"shape\": (2,)}", &payload);
        let data = parse(&bytes).unwrap().data;
        assert_eq!(data, NpyData::I32(vec![-3, i32::MAX]));
        assert_eq!(data.widened(), NpyData::I64(vec![-3, i64::from(i32::MAX)]));
    }

    fn message(bytes: &[u8]) -> String {
        match parse(bytes) {
            Err(message) => message,
            Ok(array) => panic!("expected an error, read {array:?}"),
        }
    }

    #[test]
    fn rejects_truncated_and_padded_files() {
        let bytes = numpy_arange_2x3();
        for len in 0..bytes.len() {
            assert!(!message(&bytes[..len]).is_empty());
        }
        assert!(message(&bytes[..bytes.len() - 1]).contains("truncated"));
        let mut padded = bytes;
        padded.push(0);
        assert!(message(&padded).contains("needs 24"));
    }

    #[test]
    fn rejects_what_rill_does_not_read() {
        let mut bytes = numpy_arange_2x3();
        bytes[1] = b'n';
        assert!(message(&bytes).contains(".npy"));
        let bytes = header_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", &[0; 24]);
        assert!(message(&bytes).contains("Fortran"));
        let bytes = header_file("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", &[0; 24]);
        let unsupported = message(&bytes);
        assert!(unsupported.contains("'<f8'") && unsupported.contains("float16 ('<f2')"), "{unsupported}");
        let bytes = header_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", &[0; 4]);
        assert!(message(&bytes).contains("structured"));
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
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2.0, 3)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999999999999999999999,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296)}",
            "{'descr: '<f4', 'fortran_order': False, 'shape': (6,)}",
            "{'descr': <f4, 'fortran_order': False, 'shape': (6,)}",
            "['descr', '<f4']",
        ] {
            assert!(!message(&header_file(header, &[0; 24])).is_empty(), "{header}");
        }
        let deep = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {}}}", "(".repeat(100_000));
        message(&header_file(&deep, &[]));
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
        let mut utf8 = original;
        utf8[6] = 3;
        utf8[20] = 0xff;
        let _ = parse(&utf8);
    }

    #[test]
    fn errors_name_the_file() {
        let file = TempFile::new("errors");
        let wrong_count = write(&file.0, &[2, 2], &NpyData::F32(vec![1.0]));
        assert!(
            wrong_count.is_err_and(|m| m.contains("rill-cli-npy") && m.contains("[2, 2]") && m.contains("1 elements"))
        );
        let missing = read(&file.0);
        assert!(missing.is_err_and(|m| m.contains("rill-cli-npy")));
        std::fs::write(&file.0, b"PK\x03\x04").unwrap();
        assert!(read(&file.0).is_err_and(|m| m.contains("rill-cli-npy") && m.contains(".npy")));
    }
}
