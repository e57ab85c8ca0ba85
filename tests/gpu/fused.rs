//! A user's fused kernel through rill's planner (`examples/fused-dequant-softmax`):
//! softmax of dequantized int8 logits into bf16, on the paths the planner picks by width,
//! at pack 1 for odd widths and offset views, against the f64 reference; the unfused chain;
//! and what the fused API rejects.

use crate::harness::{Measured, Suite, measure, tolerance_of, view_at, view_mut_at};
use half::bf16;
use rill::Tensor;
use rill::fuse::FusedModule;
use rill_example_fused_dequant_softmax::{Dequant, DequantKernels, PTX};
use rill_tests::random::Rng;
use rill_tests::reference::softmax_rows;

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
        // The chain rounds the logits, computed in f32 as its kernel does, to bf16.
        let rounded: Vec<f64> = (0..rows * cols)
            .map(|i| {
                let v = inputs.q[i] as f32 * inputs.scale[i / cols] + inputs.bias[i % cols].to_f32();
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
    suite.rejects("fused/rejects/scale_per_row", |suite| {
        let q = Tensor::<i8>::zeros(&gpu, &[4, 64])?;
        let (scale, bias) = (Tensor::<f32>::zeros(&gpu, &[3])?, Tensor::<bf16>::zeros(&gpu, &[64])?);
        let mut out = Tensor::<bf16>::zeros(&gpu, &[4, 64])?;
        kernels.dequant_softmax(&suite.stream, &q, &scale, &bias, &mut out).map(drop)
    });
}
