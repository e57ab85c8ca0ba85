//! A user's fused kernels through rill's planner (`examples/fused-dequant-softmax`):
//! softmax, LayerNorm and RMSNorm of dequantized int8 logits into bf16, on the paths the
//! planner picks by width, at pack 1 for odd widths and offset views, against the f64
//! reference; a call recorded in a graph; the unfused chain; the user's elementwise
//! functor; and what the fused API rejects.

use crate::graph::differing_elements;
use crate::harness::{Measured, Suite, measure, tolerance_of, view_at, view_mut_at};
use half::bf16;
use rill::fuse::FusedModule;
use rill::norm::{NormKind, NormParts};
use rill::{Element, Tensor};
use rill_example_fused_dequant_softmax::{Dequant, DequantKernels, PTX};
use rill_tests::check::max_error_with_floor;
use rill_tests::random::Rng;
use rill_tests::reference::{norm_rows, norm_stats_rows, softmax_rows};

/// `(rows, cols, logits offset)`: the warp path (8, 1000), the shared one (32000 columns
/// cached as f32), the uncached one (70000: no block holds the row, no cluster kernels),
/// odd widths and an offset view at pack 1.
const CASES: &[(usize, usize, usize)] =
    &[(1, 8, 0), (3, 1000, 0), (3, 1000, 1), (5, 4099, 0), (64, 32000, 0), (2, 50000, 0), (1, 70000, 0)];

struct Inputs {
    q: Vec<i8>,
    scale: Vec<f32>,
    bias: Vec<bf16>,
}

impl Inputs {
    fn random(rng: &mut Rng, rows: usize, cols: usize) -> Inputs {
        Inputs {
            q: (0..rows * cols).map(|_| (rng.next_u64() % 256) as u8 as i8).collect(),
            scale: (0..rows).map(|_| rng.uniform(0.005, 0.05) as f32).collect(),
            bias: (0..cols).map(|_| bf16::from_f32(rng.uniform(-1.0, 1.0) as f32)).collect(),
        }
    }

    /// The dequantized logits in f64.
    fn logits(&self, cols: usize) -> Vec<f64> {
        (0..self.q.len())
            .map(|i| self.q[i] as f64 * self.scale[i / cols] as f64 + self.bias[i % cols].to_f64())
            .collect()
    }
}

pub fn run_cases(suite: &mut Suite) {
    let kernels = match DequantKernels::load(&suite.stream.gpu().clone()) {
        Ok(kernels) => kernels,
        Err(error) => return suite.case("fused/load", 0.0, |_, _| Err(error)),
    };
    for &(rows, cols, offset) in CASES {
        let name = format!("fused/dequant_softmax/{rows}x{cols}/offset={offset}");
        suite.case(&name, tolerance_of::<bf16>(), |suite, rng| {
            let inputs = Inputs::random(rng, rows, cols);
            let q = suite.upload(&inputs.q, offset)?;
            let (scale, bias) = (suite.upload(&inputs.scale, 0)?, suite.upload(&inputs.bias, 0)?);
            let mut out = suite.poisoned::<bf16>(rows * cols, 0)?;
            let plan = kernels.dequant_softmax(
                &suite.stream,
                &view_at(&q, offset, &[rows, cols])?,
                &scale,
                &bias,
                &mut view_mut_at(&mut out, 0, &[rows, cols])?,
            )?;
            let want = softmax_rows(&inputs.logits(cols), cols, false);
            let m = measure(&out.to_vec()?, &want);
            Ok(Measured { detail: format!("{} on {}", m.detail, plan.describe()), ..m })
        });
    }
    // A call of a fused kernel waits for nothing (the module read its facts at load), so
    // it can be recorded: the replay gives the eager call's bits, and recording runs nothing.
    for (rows, cols) in [(3, 1000), (64, 32000)] {
        suite.case(&format!("fused/dequant_softmax/captured/{rows}x{cols}"), 0.5, |suite, rng| {
            let inputs = Inputs::random(rng, rows, cols);
            let shape = [rows, cols];
            let q = suite.upload(&inputs.q, 0)?;
            let (scale, bias) = (suite.upload(&inputs.scale, 0)?, suite.upload(&inputs.bias, 0)?);
            let (mut eager, mut replayed) =
                (suite.poisoned::<bf16>(rows * cols, 0)?, suite.poisoned::<bf16>(rows * cols, 0)?);
            let q = view_at(&q, 0, &shape)?;
            kernels.dequant_softmax(&suite.stream, &q, &scale, &bias, &mut view_mut_at(&mut eager, 0, &shape)?)?;
            let mut out = view_mut_at(&mut replayed, 0, &shape)?;
            let graph = suite.stream.capture(|s| kernels.dequant_softmax(s, &q, &scale, &bias, &mut out).map(drop))?;
            let poison = rill_tests::check::poison::<bf16>().to_bits();
            if replayed.to_vec()?.iter().any(|y| y.to_bits() != poison) {
                return Ok(Measured { error: f64::INFINITY, detail: "recording ran the kernel".into() });
            }
            graph.launch(&suite.stream)?;
            let differing = differing_elements(&eager, &replayed)?;
            Ok(Measured { error: differing as f64, detail: format!("{differing} elements differ from the eager call") })
        });
    }
    for &(rows, cols, offset) in CASES {
        for kind in [NormKind::LayerNorm, NormKind::RmsNorm] {
            norm_case(suite, &kernels, kind, (rows, cols, offset));
        }
    }
    for (len, offset) in [(1, 0), (1000, 0), (4099, 1), ((1 << 20) + 3, 0)] {
        squared_relu_case::<f32, f32>(suite, &kernels, len, offset);
        squared_relu_case::<bf16, bf16>(suite, &kernels, len, offset);
        squared_relu_case::<f32, bf16>(suite, &kernels, len, offset);
    }
    let (rows, cols) = (64, 4096);
    suite.case(&format!("fused/dequantize_then_softmax/{rows}x{cols}"), tolerance_of::<bf16>(), |suite, rng| {
        let inputs = Inputs::random(rng, rows, cols);
        let q = suite.upload(&inputs.q, 0)?;
        let (scale, bias) = (suite.upload(&inputs.scale, 0)?, suite.upload(&inputs.bias, 0)?);
        let (mut dequantized, mut out) =
            (suite.poisoned::<bf16>(rows * cols, 0)?, suite.poisoned::<bf16>(rows * cols, 0)?);
        let shape = [rows, cols];
        kernels.dequantize_then_softmax(
            &suite.stream,
            (&q.view().reshape(&shape)?, &scale, &bias),
            &mut dequantized.view_mut().reshape(&shape)?,
            &mut out.view_mut().reshape(&shape)?,
        )?;
        // The chain rounds the logits, computed in f32 as its kernel does (one FMA), to bf16.
        let rounded: Vec<f64> = (0..rows * cols)
            .map(|i| {
                let v = (inputs.q[i] as f32).mul_add(inputs.scale[i / cols], inputs.bias[i % cols].to_f32());
                bf16::from_f32(v).to_f64()
            })
            .collect();
        Ok(measure(&out.to_vec()?, &softmax_rows(&rounded, cols, false)))
    });
    let gpu = suite.stream.gpu().clone();
    suite.rejects("fused/rejects/parameters_of_another_size", |_| {
        FusedModule::load(&gpu, PTX)?.softmax::<u64>("dequant_softmax").map(drop)
    });
    suite.rejects("fused/rejects/unknown_family", |_| {
        FusedModule::load(&gpu, PTX)?.softmax::<Dequant>("nope").map(drop)
    });
    suite.rejects("fused/rejects/norm_weight_of_another_dtype", |_| {
        FusedModule::load(&gpu, PTX)?.norm::<Dequant, bf16>("dequant_norm").map(drop)
    });
    suite.rejects("fused/rejects/softmax_as_norm", |_| {
        FusedModule::load(&gpu, PTX)?.norm::<Dequant, f32>("dequant_softmax").map(drop)
    });
    suite.rejects("fused/rejects/elementwise_dtypes_not_built", |_| {
        FusedModule::load(&gpu, PTX)?.elementwise::<bf16, f32>("squared_relu").map(drop)
    });
    suite.rejects("fused/rejects/rms_norm_with_bias", |suite| {
        let q = Tensor::<i8>::zeros(&gpu, &[4, 64])?;
        let (scale, bias) = (Tensor::<f32>::zeros(&gpu, &[4])?, Tensor::<bf16>::zeros(&gpu, &[64])?);
        let beta = Tensor::<f32>::zeros(&gpu, &[64])?;
        let mut out = Tensor::<bf16>::zeros(&gpu, &[4, 64])?;
        let parts = NormParts::new().bias(&beta);
        kernels.dequant_norm(&suite.stream, NormKind::RmsNorm, (&q, &scale, &bias), parts, &mut out).map(drop)
    });
    suite.rejects("fused/rejects/norm_weight_length", |suite| {
        let q = Tensor::<i8>::zeros(&gpu, &[4, 64])?;
        let (scale, bias) = (Tensor::<f32>::zeros(&gpu, &[4])?, Tensor::<bf16>::zeros(&gpu, &[64])?);
        let weight = Tensor::<f32>::zeros(&gpu, &[63])?;
        let mut out = Tensor::<bf16>::zeros(&gpu, &[4, 64])?;
        let parts = NormParts::new().weight(&weight);
        kernels.dequant_norm(&suite.stream, NormKind::LayerNorm, (&q, &scale, &bias), parts, &mut out).map(drop)
    });
    suite.rejects("fused/rejects/elementwise_shape", |suite| {
        let x = Tensor::<f32>::zeros(&gpu, &[64])?;
        let mut y = Tensor::<f32>::zeros(&gpu, &[65])?;
        kernels.squared_relu(&suite.stream, &x, &mut y)
    });
    suite.rejects("fused/rejects/scale_per_row", |suite| {
        let q = Tensor::<i8>::zeros(&gpu, &[4, 64])?;
        let (scale, bias) = (Tensor::<f32>::zeros(&gpu, &[3])?, Tensor::<bf16>::zeros(&gpu, &[64])?);
        let mut out = Tensor::<bf16>::zeros(&gpu, &[4, 64])?;
        kernels.dequant_softmax(&suite.stream, &q, &scale, &bias, &mut out).map(drop)
    });
}

/// The rstd a norm case saves: f32 against the f64 reference.
const RSTD_TOLERANCE: f64 = 1e-5;

/// `kind` of the dequantized logits with a random f32 weight (and bias, LayerNorm), the
/// per-row statistics saved: y within bf16's rounding (absolute below 1: normalized
/// outputs), mean and rstd within f32's.
fn norm_case(suite: &mut Suite, kernels: &DequantKernels, kind: NormKind, (rows, cols, offset): (usize, usize, usize)) {
    let name = format!("fused/dequant_norm/{}/{rows}x{cols}/offset={offset}", kind.name());
    suite.case(&name, tolerance_of::<bf16>(), |suite, rng| {
        let inputs = Inputs::random(rng, rows, cols);
        let weight: Vec<f32> = (0..cols).map(|_| rng.uniform(0.5, 1.5) as f32).collect();
        let beta: Vec<f32> = (0..cols).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
        let q = suite.upload(&inputs.q, offset)?;
        let (scale, bias) = (suite.upload(&inputs.scale, 0)?, suite.upload(&inputs.bias, 0)?);
        let (weight_dev, beta_dev) = (suite.upload(&weight, 0)?, suite.upload(&beta, 0)?);
        let mut out = suite.poisoned::<bf16>(rows * cols, 0)?;
        let (mut mean, mut rstd) = (suite.poisoned::<f32>(rows, 0)?, suite.poisoned::<f32>(rows, 0)?);
        let rms = kind == NormKind::RmsNorm;
        let plan = {
            let mut parts = NormParts::new().weight(&weight_dev).save_rstd(&mut rstd);
            if !rms {
                parts = parts.bias(&beta_dev).save_mean(&mut mean);
            }
            let logits = view_at(&q, offset, &[rows, cols])?;
            let mut y = view_mut_at(&mut out, 0, &[rows, cols])?;
            kernels.dequant_norm(&suite.stream, kind, (&logits, &scale, &bias), parts, &mut y)?
        };
        let x = inputs.logits(cols);
        let (w, b): (Vec<f64>, Vec<f64>) =
            (weight.iter().map(|&v| v as f64).collect(), beta.iter().map(|&v| v as f64).collect());
        let want = norm_rows(&x, cols, rms, 1e-5, Some(&w), (!rms).then_some(&b[..]));
        let stats = norm_stats_rows(&x, cols, rms, 1e-5);
        let want_rstd: Vec<f64> = stats.iter().map(|s| s.1).collect();
        let mut saved = vec![("rstd", rstd.to_vec()?, want_rstd)];
        if !rms {
            saved.push(("mean", mean.to_vec()?, stats.iter().map(|s| s.0).collect()));
        }
        for (what, got, want) in saved {
            // The mean against the row's spread (1 / rstd): its rounding's scale.
            let worst = max_error_with_floor(&got, &want, |r| if what == "mean" { 1.0 / stats[r].1 } else { 0.0 });
            // NaN errors fail too (a comparison with NaN is false).
            if let Some(worst) = worst.filter(|w| w.error.is_nan() || w.error >= RSTD_TOLERANCE) {
                return Ok(Measured {
                    error: f64::INFINITY,
                    detail: format!("{what} of row {}: got {:e}, want {:e}", worst.index, worst.got, worst.want),
                });
            }
        }
        let y = out.to_vec()?;
        let m = match max_error_with_floor(&y, &want, |_| 1.0) {
            Some(w) => {
                Measured { error: w.error, detail: format!("element {}: got {:e}, want {:e}", w.index, w.got, w.want) }
            }
            None => Measured { error: 0.0, detail: String::new() },
        };
        Ok(Measured { detail: format!("{} on {}", m.detail, plan.describe()), ..m })
    });
}

/// The user's squared ReLU from `I` to `O` over `len` random values starting `offset`
/// elements into their allocation (pack 1 where that misaligns them).
fn squared_relu_case<I: Element, O: Element>(suite: &mut Suite, kernels: &DequantKernels, len: usize, offset: usize) {
    let name = format!("fused/squared_relu/{}->{}/{len}/offset={offset}", I::DTYPE.name(), O::DTYPE.name());
    suite.case(&name, tolerance_of::<O>(), |suite, rng| {
        let x: Vec<I> = (0..len).map(|_| I::from_f64(rng.uniform(-4.0, 4.0))).collect();
        let x_dev = suite.upload(&x, offset)?;
        let mut y = suite.poisoned::<O>(len, offset)?;
        kernels.squared_relu(
            &suite.stream,
            &view_at(&x_dev, offset, &[len])?,
            &mut view_mut_at(&mut y, offset, &[len])?,
        )?;
        let want: Vec<f64> = x.iter().map(|v| v.to_f64().max(0.0).powi(2)).collect();
        Ok(measure(&y.to_vec()?[offset..], &want))
    });
}
