//! Recorded work (`Stream::capture`) replays to what the same calls give launched one by
//! one, bit for bit, and recording runs nothing.

use crate::harness::{Measured, Suite, view_at, view_mut_at};
use half::bf16;
use rill::norm::{Forward, Norm, NormKind};
use rill::{Element, Stream, Tensor, elementwise, softmax};

/// A decode step's row ops: residual add + RMSNorm, softmax, SiLU, cross entropy.
struct Outputs {
    sum: Tensor<bf16>,
    normed: Tensor<bf16>,
    probs: Tensor<bf16>,
    act: Tensor<bf16>,
    loss: Tensor<f32>,
}

struct Inputs {
    x: Tensor<bf16>,
    residual: Tensor<bf16>,
    weight: Tensor<f32>,
    target: Tensor<i64>,
}

pub fn run_cases(suite: &mut Suite) {
    for (rows, cols) in [(4, 4096), (37, 4099)] {
        suite.case(&format!("graph/replay_matches_eager/{rows}x{cols}"), 0.5, |suite, rng| {
            let random = |rng: &mut rill_tests::random::Rng, len| -> Vec<bf16> {
                (0..len).map(|_| bf16::from_f64(rng.uniform(-3.0, 3.0))).collect()
            };
            let inputs = Inputs {
                x: suite.upload(&random(rng, rows * cols), 0)?,
                residual: suite.upload(&random(rng, rows * cols), 0)?,
                weight: suite.upload(&(0..cols).map(|_| rng.uniform(0.5, 1.5) as f32).collect::<Vec<_>>(), 0)?,
                target: suite
                    .upload(&(0..rows).map(|_| (rng.next_u64() % cols as u64) as i64).collect::<Vec<_>>(), 0)?,
            };
            let (mut eager, mut replayed) = (outputs(suite, rows, cols)?, outputs(suite, rows, cols)?);
            step(&suite.stream, &inputs, &mut eager, (rows, cols))?;
            let graph = suite.stream.capture(|s| step(s, &inputs, &mut replayed, (rows, cols)))?;
            suite.stream.synchronize()?;
            if replayed.loss.to_vec()?.iter().any(|l| l.to_bits() != rill_tests::check::poison::<f32>().to_bits()) {
                return Ok(Measured { error: f64::INFINITY, detail: "recording ran the work".into() });
            }
            let mut worst = Measured { error: 0.0, detail: String::new() };
            for replay in 1..=2 {
                graph.launch(&suite.stream)?;
                let differing = differing_bits(&eager, &replayed)?;
                if differing.0 > 0 {
                    worst = Measured {
                        error: differing.0 as f64,
                        detail: format!("replay {replay}: {} elements differ, first in {}", differing.0, differing.1),
                    };
                }
            }
            Ok(worst)
        });
    }
}

fn outputs(suite: &Suite, rows: usize, cols: usize) -> rill::Result<Outputs> {
    let len = rows * cols;
    Ok(Outputs {
        sum: suite.poisoned(len, 0)?,
        normed: suite.poisoned(len, 0)?,
        probs: suite.poisoned(len, 0)?,
        act: suite.poisoned(len, 0)?,
        loss: suite.poisoned(rows, 0)?,
    })
}

/// The step's calls on `stream`, into `out`.
fn step(stream: &Stream, inputs: &Inputs, out: &mut Outputs, (rows, cols): (usize, usize)) -> rill::Result<()> {
    let shape = [rows, cols];
    let (x, residual) = (view_at(&inputs.x, 0, &shape)?, view_at(&inputs.residual, 0, &shape)?);
    let mut sum = view_mut_at(&mut out.sum, 0, &shape)?;
    let mut normed = view_mut_at(&mut out.normed, 0, &shape)?;
    let call = Forward::new(&x, &mut normed).weight(&inputs.weight).residual(&residual, &mut sum);
    Norm::new().forward(stream, NormKind::RmsNorm, 1e-6, call)?;
    let normed = view_at(&out.normed, 0, &shape)?;
    softmax::softmax(stream, &normed, &mut view_mut_at(&mut out.probs, 0, &shape)?)?;
    elementwise::silu(stream, &view_at(&out.probs, 0, &shape)?, &mut view_mut_at(&mut out.act, 0, &shape)?)?;
    softmax::cross_entropy(stream, &normed, &inputs.target, &mut out.loss)?;
    Ok(())
}

/// Elements whose bits differ between the two runs' outputs, and the first output that has
/// one.
fn differing_bits(a: &Outputs, b: &Outputs) -> rill::Result<(usize, &'static str)> {
    let counts = [
        ("the sum", differing_elements(&a.sum, &b.sum)?),
        ("the norm", differing_elements(&a.normed, &b.normed)?),
        ("the softmax", differing_elements(&a.probs, &b.probs)?),
        ("the SiLU", differing_elements(&a.act, &b.act)?),
        ("the loss", differing_elements(&a.loss, &b.loss)?),
    ];
    let total = counts.iter().map(|c| c.1).sum();
    Ok((total, counts.iter().find(|c| c.1 > 0).map_or("", |c| c.0)))
}

/// How many elements of `x` and `y` differ in their bits.
pub(crate) fn differing_elements<T: Element>(x: &Tensor<T>, y: &Tensor<T>) -> rill::Result<usize> {
    let (x, y) = (x.to_vec()?, y.to_vec()?);
    Ok(x.iter().zip(&y).filter(|(p, q)| p.to_f64().to_bits() != q.to_f64().to_bits()).count())
}
