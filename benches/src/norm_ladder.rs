//! The RMSNorm optimization ladder (`rill::norm_ladder`): each rung of the profiling
//! article's naive kernels over the norms' sweep (49152 rows of 128 to 32768 columns, plus
//! 768 and 1000), in f32, f16 and bf16, recorded as `rms_norm_ladder/<rung>` beside the copy
//! (and the dispatched RMSNorm, where the norm sweep runs), so the table shows what each
//! idea buys.
//!
//! Bytes moved: x read and y written once each, gamma read once. Rung 1 (a thread per row)
//! takes tens of milliseconds a launch on wide rows, so it is measured up to
//! [`RUNG_1_MAX_COLS`] columns only; the table's footnote ([`footnote`]) says so.

use crate::measure::Bench;
use crate::report::Record;
use rill::norm_ladder::{Rung, rms_norm_rung, rung_run};
use rill::{Element, Tensor};
use rill_tests::random::Rng;

/// The record name prefix and filter family.
const FAMILY: &str = "rms_norm_ladder";

/// The widest rows rung 1 is measured on.
pub const RUNG_1_MAX_COLS: usize = 4096;

const ROWS: usize = 49152;
const EPS: f32 = 1e-6;

fn op_name(rung: Rung) -> String {
    format!("{FAMILY}/{}", rung.name())
}

/// The rungs measured at `cols`.
fn rungs_at(cols: usize) -> impl Iterator<Item = Rung> {
    Rung::ALL.into_iter().filter(move |&rung| rung != Rung::ThreadPerRow || cols <= RUNG_1_MAX_COLS)
}

pub fn sweep<T: Element>(bench: &mut Bench) -> rill::Result<()> {
    let dtype = T::DTYPE.name();
    let rungs: Vec<Rung> = Rung::ALL.into_iter().filter(|&r| bench.wants(FAMILY, &op_name(r))).collect();
    if rungs.is_empty() {
        return Ok(());
    }
    // 49152 rows of 128 to 32768 columns, 768 and 1000 (with `--quick`, 1024 and 8192).
    let shapes = bench.row_shapes(|rows, cols| rows == ROWS && cols >= 128);
    // The copies are planned as they are measured (none where another sweep has one).
    let steps: usize = shapes.iter().map(|&(_, cols)| rungs_at(cols).filter(|r| rungs.contains(r)).count()).sum();
    bench.plan(steps);
    for (rows, cols) in shapes {
        let (len, size, shape) = (rows * cols, size_of::<T>(), [rows, cols]);
        let sets = bench.buffer_sets(2 * len * size);
        let mut rng = Rng::new(len as u64 ^ 0x6e6f726d);
        let host: Vec<T> = (0..len).map(|_| T::from_f64(rng.uniform(-2.0, 2.0))).collect();
        let gamma: Vec<T> = (0..cols).map(|_| T::from_f64(rng.uniform(0.5, 1.5))).collect();
        let gamma = Tensor::from_slice(&bench.gpu, &gamma, &[cols])?;
        let inputs = bench.upload(sets, &host, &shape)?;
        drop(host);
        let mut outputs = bench.zeros(sets, &shape)?;

        // The copy at this shape: the one another sweep recorded, else measured here.
        let recorded = bench.records.iter().find(|r| r.op == "copy" && r.dtype == dtype && r.shape == shape);
        let copy = match recorded {
            Some(r) => r.gbps,
            None => {
                bench.plan(1);
                bench.copy(&inputs, &mut outputs)?
            }
        };

        let bytes = 2 * len * size + cols * size;
        let addresses = [inputs[0].view().address(), gamma.view().address(), outputs[0].view().address()];
        for rung in rungs_at(cols).filter(|r| rungs.contains(r)) {
            let ran = rung_run(rung, T::DTYPE, cols, &addresses);
            let (micros, ()) = bench
                .time(sets, bytes, |stream, s| rms_norm_rung(stream, rung, &inputs[s], &gamma, EPS, &mut outputs[s]))?;
            let path =
                if ran == rung { rung.describe().to_string() } else { format!("{} (as rung 3)", rung.describe()) };
            bench.record::<T>(&op_name(rung), &shape, &path, bytes, micros, Some(copy));
        }
    }
    Ok(())
}

/// The line printed under the table when the ladder ran on rows rung 1 skips.
pub fn footnote(records: &[Record]) -> Option<String> {
    let wide = records.iter().any(|r| r.op.starts_with(FAMILY) && r.shape.last().is_some_and(|&c| c > RUNG_1_MAX_COLS));
    wide.then(|| {
        format!(
            "{FAMILY}/{}: not measured above {RUNG_1_MAX_COLS} columns (one thread per row takes tens of ms a launch there)",
            Rung::ThreadPerRow.name()
        )
    })
}
