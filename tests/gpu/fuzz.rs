//! The fuzz of the public API on the device ([`rill_tests::fuzz`]): each random call either
//! fails with a typed error, launches nothing and changes no byte, or writes exactly its
//! outputs (nothing around them, no input changed) to within the f64 reference's tolerance.
//! Each array is an allocation of its own, poisoned around the view; the case's seed makes
//! its call.

use crate::harness::{Measured, Suite};
use crate::norm::{self, Checks, PARAM_GRAD_TOLERANCE, STATS_TOLERANCE};
use half::{bf16, f16};
use rill::{DType, Tensor};
use rill_tests::check::{relative_floor, tolerance};
use rill_tests::fuzz::{Array, Case, Op, SCALE, addresses, call, generate};
use rill_tests::random::Rng;
use rill_tests::reference::{
    cross_entropy_backward_magnitude_rows, cross_entropy_backward_rows, cross_entropy_rows, logsumexp_rows,
    norm_apply_rows, norm_backward_magnitude_rows, norm_backward_rows, norm_param_grads, norm_stats_rows,
    softmax_backward_magnitude_rows, softmax_backward_rows, softmax_rows,
};
use std::collections::HashMap;

/// Calls per run: a few thousand, about a third with a defect.
const CALLS: usize = 3000;

/// Bytes of poison after each view, where an out-of-bounds write would show.
const GUARD_BYTES: usize = 64;

pub fn run(suite: &mut Suite) {
    // A fuzz case's name does not name the same call in another run (each run draws its
    // calls from its seed), so the sanitizer's selections, which name their cases, leave
    // the fuzz out; compute-sanitizer runs it on its own (`gpu fuzz/`).
    if suite.options.sanitizer_selection() {
        return;
    }
    for k in 0..CALLS {
        suite.case(&format!("fuzz/{k:04}"), 1.0, one_call);
    }
}

fn one_call(suite: &mut Suite, rng: &mut Rng) -> rill::Result<Measured> {
    let case = generate(rng);
    let inputs = inputs(rng, &case);
    let buffers: Vec<Vec<u8>> = case
        .arrays
        .iter()
        .map(|a| {
            let mut bytes = poison(a.dtype, a.offset + a.len() + GUARD_BYTES.div_ceil(a.dtype.size()));
            if let Some(values) = inputs.get(a.name) {
                let start = a.offset * a.dtype.size();
                let data = encode(a.dtype, values);
                bytes[start..start + data.len()].copy_from_slice(&data);
            }
            bytes
        })
        .collect();
    let tensors = buffers.iter().map(|b| upload(suite, b)).collect::<rill::Result<Vec<_>>>()?;
    let own = |k: usize| tensors[k].view().address() + (case.arrays[k].offset * case.arrays[k].dtype.size()) as u64;
    let before = rill::launch_counts();
    let outcome = call(&suite.stream, &case, addresses(&case, own));
    let launched = rill::launch_counts().since(&before).launched;
    let refused = matches!(outcome, Err(rill::Error::InvalidInput(_) | rill::Error::Unsupported(_)));
    if let Some(defect) = &case.defect {
        if outcome.is_ok() {
            return Ok(failure(&case, format!("took a call with a defect ({defect})")));
        }
        if !refused {
            return outcome.map(|()| Measured { error: 0.0, detail: String::new() });
        }
        if !launched.is_empty() {
            return Ok(failure(&case, format!("refused ({defect}) but launched {launched:?}")));
        }
    } else {
        outcome.map_err(|error| rill::Error::InvalidInput(format!("{error}; the call: {}", case.describe())))?;
    }
    suite.stream.synchronize()?;
    let read = tensors.iter().map(|t| Ok(bytes_of(&t.to_vec()?))).collect::<rill::Result<Vec<_>>>()?;
    let bytes = |k: usize| {
        let (home, start) = case.landing(k);
        (home, start..start + case.arrays[k].len() * case.arrays[k].dtype.size())
    };
    // Nothing outside the outputs' views changed (nothing at all, where the call was refused).
    for (k, array) in case.arrays.iter().enumerate() {
        let written: Vec<_> = (0..case.arrays.len())
            .filter(|&o| case.arrays[o].output && !refused)
            .map(bytes)
            .filter(|(home, _)| *home == k)
            .map(|(_, range)| range)
            .collect();
        let changed =
            (0..buffers[k].len()).find(|&b| read[k][b] != buffers[k][b] && !written.iter().any(|v| v.contains(&b)));
        if let Some(byte) = changed {
            return Ok(failure(&case, format!("byte {byte} of {}'s allocation changed", array.name)));
        }
    }
    if refused {
        return Ok(Measured { error: 0.0, detail: String::new() });
    }
    let got = |name: &str| {
        let k = case.index(name).expect("an output of the call");
        let (home, range) = bytes(k);
        decode(case.arrays[k].dtype, &read[home][range])
    };
    // The case's tolerance is 1: the checks report the worst ratio to each output's own.
    let mut checks = Checks::new(1.0);
    expect(&case, &inputs, &got, &mut checks);
    Ok(checks.measured_in(&case.describe()))
}

fn failure(case: &Case, why: String) -> Measured {
    Measured { error: f64::INFINITY, detail: format!("{why}; the call: {}", case.describe()) }
}

/// Random inputs for the case's input arrays, as the device will see them (rounded to
/// their dtype), by name.
fn inputs(rng: &mut Rng, case: &Case) -> HashMap<&'static str, Vec<f64>> {
    let mut values = HashMap::new();
    let cols = case.cols.max(1);
    for a in case.arrays.iter().filter(|a| !a.output) {
        let len = a.len();
        let mut uniform = |lo: f64, hi: f64| -> Vec<f64> { (0..len).map(|_| rng.uniform(lo, hi)).collect() };
        let raw = match (case.op, a.name) {
            (Op::Elementwise(op), name) => {
                let k = ["x", "b", "c"].iter().position(|n| *n == name).unwrap_or(0);
                (0..len).map(|_| op.domains[k].sample(rng)).collect()
            }
            (_, "target") => (0..len)
                .map(|_| if rng.next_u64() % 5 == 0 { -100.0 } else { (rng.next_u64() % cols as u64) as f64 })
                .collect(),
            (Op::SoftmaxBackward { log }, "x") => {
                let logits = uniform(-8.0, 8.0);
                softmax_rows(&logits, cols, log)
            }
            (Op::NormForward(_) | Op::NormBackward(_), "weight") => uniform(0.5, 1.5),
            (Op::NormForward(_) | Op::NormBackward(_), "x" | "residual" | "bias") => uniform(-2.0, 2.0),
            (_, "dy" | "dloss") => uniform(-1.0, 1.0),
            (_, "mask") => uniform(-4.0, 4.0),
            (_, "rstd" | "mean") => continue,
            _ => uniform(-8.0, 8.0),
        };
        values.insert(a.name, round(a.dtype, &raw));
    }
    // A backward's statistics are the forward's of its x, as saved (f32).
    if let Op::NormBackward(p) = case.op {
        let x = &values["x"];
        let stats = norm_stats_rows(x, cols, p.kind == rill::norm::NormKind::RmsNorm, 1e-5);
        for (name, pick) in [("rstd", 1), ("mean", 0)] {
            if let Some(a) = case.array(name).filter(|a| !a.output) {
                let v: Vec<f64> = stats.iter().map(|s| if pick == 1 { s.1 } else { s.0 }).collect();
                let mut v = round(DType::F32, &v);
                v.resize(a.len(), 0.0);
                values.insert(a.name, v);
            }
        }
    }
    values
}

/// What the call must have written, compared output by output.
fn expect(case: &Case, inputs: &HashMap<&'static str, Vec<f64>>, got: &dyn Fn(&str) -> Vec<f64>, checks: &mut Checks) {
    let (t, u, g) = case.dtypes;
    let cols = case.cols;
    let input = |name: &str| &inputs[name];
    let probability_floor = relative_floor(t).max(1e-30);
    match case.op {
        Op::Elementwise(op) => {
            let len = case.array("y").map_or(0, Array::len);
            let args: Vec<&Vec<f64>> = ["x", "b", "c"][..op.arity].iter().map(|n| input(n)).collect();
            let want: Vec<f64> = (0..len)
                .map(|i| {
                    let at: Vec<f64> = args
                        .iter()
                        .enumerate()
                        .map(|(k, a)| if op.broadcasts_last && k + 1 == op.arity { a[i % cols] } else { a[i] })
                        .collect();
                    round(t, &[(op.reference)(&at)])[0]
                })
                .collect();
            checks.compare_values("y", &got("y"), &want, tolerance(t), |_| relative_floor(t));
        }
        Op::Cast => checks.compare_values("y", &got("y"), input("x"), tolerance(u), |_| relative_floor(u)),
        Op::Softmax { log } => {
            let floor = if log { 1.0 } else { probability_floor };
            checks.compare_values("y", &got("y"), &softmax_rows(input("x"), cols, log), tolerance(t), |_| floor);
        }
        Op::SoftmaxBackward { log } => {
            let (y, dy) = (input("x"), input("dy"));
            let magnitude = softmax_backward_magnitude_rows(y, dy, cols, log);
            let want = softmax_backward_rows(y, dy, cols, log);
            checks.compare_values("dx", &got("y"), &want, tolerance(t), |i| magnitude[i].max(relative_floor(t)));
        }
        Op::ScaleMask => {
            let (x, mask) = (input("x"), input("mask"));
            let mask_rows = mask.len() / cols;
            let scaled: Vec<f64> =
                (0..x.len()).map(|i| x[i] * SCALE as f64 + mask[(i / cols % mask_rows) * cols + i % cols]).collect();
            checks.compare_values("y", &got("y"), &softmax_rows(&scaled, cols, false), tolerance(t), |_| {
                probability_floor
            });
        }
        Op::Causal => {
            let x = input("x");
            let queries = case.rows;
            let scaled: Vec<f64> = (0..x.len())
                .map(|i| if i % cols <= i / cols % queries { x[i] * SCALE as f64 } else { f64::NEG_INFINITY })
                .collect();
            checks.compare_values("y", &got("y"), &softmax_rows(&scaled, cols, false), tolerance(t), |_| {
                probability_floor
            });
        }
        Op::CrossEntropy => {
            let target: Vec<i64> = input("target").iter().map(|&v| v as i64).collect();
            checks.compare_values(
                "loss",
                &got("out"),
                &cross_entropy_rows(input("x"), &target, cols),
                tolerance(t),
                |_| 1.0,
            );
        }
        Op::LogSumExp => {
            checks.compare_values("logsumexp", &got("out"), &logsumexp_rows(input("x"), cols), tolerance(t), |_| 1.0)
        }
        Op::CrossEntropyBackward => {
            let (x, dloss) = (input("x"), input("dloss"));
            let target: Vec<i64> = input("target").iter().map(|&v| v as i64).collect();
            let want = cross_entropy_backward_rows(x, &target, dloss, cols);
            let magnitude = cross_entropy_backward_magnitude_rows(x, &target, dloss, cols);
            checks.compare_values("dlogits", &got("y"), &want, tolerance(t), |i| magnitude[i].max(probability_floor));
        }
        Op::NormForward(p) => {
            let rms = p.kind == rill::norm::NormKind::RmsNorm;
            let x = match inputs.get("residual") {
                // The sum as the kernel rounds it, to the input's dtype.
                Some(r) => round(t, &input("x").iter().zip(r).map(|(a, b)| a + b).collect::<Vec<_>>()),
                None => input("x").clone(),
            };
            let stats = norm_stats_rows(&x, cols, rms, p.eps as f64);
            let (w, b) = (inputs.get("weight"), inputs.get("bias"));
            let want = norm_apply_rows(&x, cols, &stats, w.map(Vec::as_slice), b.map(Vec::as_slice));
            let tol = norm::tolerance(u);
            checks.compare_values("y", &got("y"), &want, tol, norm::y_floor(&stats, cols, w.map(Vec::as_slice), tol));
            if case.index("sum").is_some() {
                checks.compare_values("sum", &got("sum"), &x, tolerance(t), |_| relative_floor(t));
            }
            if case.index("mean").is_some() {
                let want: Vec<f64> = stats.iter().map(|s| s.0).collect();
                let scale = norm::mean_scale(&x, cols);
                checks.compare_values("mean", &got("mean"), &want, STATS_TOLERANCE, |r| scale[r]);
            }
            if case.index("rstd").is_some() {
                let want: Vec<f64> = stats.iter().map(|s| s.1).collect();
                let floor = norm::rstd_floor(&stats, STATS_TOLERANCE);
                checks.compare_values("rstd", &got("rstd"), &want, STATS_TOLERANCE, floor);
            }
        }
        Op::NormBackward(p) => {
            let rms = p.kind == rill::norm::NormKind::RmsNorm;
            let (x, dy, rstd) = (input("x"), input("dy"), input("rstd"));
            let stats: Vec<(f64, f64)> = match inputs.get("mean") {
                Some(mean) => mean.iter().zip(rstd).map(|(&m, &r)| (m, r)).collect(),
                None => rstd.iter().map(|&r| (0.0, r)).collect(),
            };
            let w = inputs.get("weight").map(Vec::as_slice);
            let want = norm_backward_rows(x, dy, cols, &stats, rms, w);
            let magnitude = norm_backward_magnitude_rows(x, dy, cols, &stats, rms, w);
            checks.compare_values("dx", &got("dx"), &want, norm::tolerance(t), |i| magnitude[i].max(relative_floor(t)));
            let grads = norm_param_grads(x, dy, cols, &stats);
            let tol = tolerance(g).max(PARAM_GRAD_TOLERANCE);
            if case.index("dweight").is_some() {
                let floor = |c: usize| grads.dweight_magnitude[c].max(relative_floor(g));
                checks.compare_values("dweight", &got("dweight"), &grads.dweight, tol, floor);
            }
            if case.index("dbias").is_some() {
                let floor = |c: usize| grads.dbias_magnitude[c].max(relative_floor(g));
                checks.compare_values("dbias", &got("dbias"), &grads.dbias, tol, floor);
            }
        }
    }
}

/// `values` rounded to `dtype`, as the device stores them.
fn round(dtype: DType, values: &[f64]) -> Vec<f64> {
    decode(dtype, &encode(dtype, values))
}

fn encode(dtype: DType, values: &[f64]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(values.len() * dtype.size());
    for &v in values {
        match dtype {
            DType::F32 => bytes.extend((v as f32).to_le_bytes()),
            DType::F16 => bytes.extend(f16::from_f64(v).to_le_bytes()),
            DType::BF16 => bytes.extend(bf16::from_f64(v).to_le_bytes()),
            DType::I64 => bytes.extend((v as i64).to_le_bytes()),
            other => unreachable!("the fuzz makes no {other:?} arrays"),
        }
    }
    bytes
}

fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(dtype.size())
        .map(|b| match dtype {
            DType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
            DType::F16 => f16::from_le_bytes(b.try_into().unwrap()).to_f64(),
            DType::BF16 => bf16::from_le_bytes(b.try_into().unwrap()).to_f64(),
            DType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
            other => unreachable!("the fuzz makes no {other:?} arrays"),
        })
        .collect()
}

/// `len` elements of poison: NaN, or for integers a value no op writes.
fn poison(dtype: DType, len: usize) -> Vec<u8> {
    let one = match dtype {
        DType::I64 => encode(dtype, &[-0x5A5A_5A5A as f64]),
        _ => encode(dtype, &[f64::NAN]),
    };
    one.repeat(len)
}

/// A device copy of `bytes` (in words, the tail padded).
fn upload(suite: &Suite, bytes: &[u8]) -> rill::Result<Tensor<u32>> {
    let words: Vec<u32> = bytes
        .chunks(4)
        .map(|c| {
            let mut word = [0xA5; 4];
            word[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(word)
        })
        .collect();
    Tensor::from_slice(&suite.gpu, &words, &[words.len()])
}

fn bytes_of(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}
