//! `rill-bench --tune`: the tuning table of the GPU at hand (`rill::tuning`). For each op
//! class, dtype (f32, and bf16 for the 16-bit rows) and width bucket, it runs the class's op
//! at the bucket's bound over the sweep's rows (49152, 4096 past 32768 columns), and from
//! 2048 columns also at one column fewer (rows run from their heads, or unaligned) and over
//! 8 rows. Each setting of the knobs ([`Knobs::all`]) is fitted to the call (a planned call
//! launches nothing); each distinct plan they give is timed in one CUDA-event batch (sized by
//! one launch's time, inputs rotated past L2; a plan whose one launch takes over twice the
//! best's is passed untimed), and the few fastest again as the plan the GPU takes without a
//! table (its rules') is: the median of several batches.
//! The bucket's entry is the fastest plan's knobs, or the untuned plan's where it is within
//! [`UNTUNED_MARGIN`] of the fastest: a table then differs from what the GPU ran before only
//! where the measurement says it pays, and holds every bucket's plan.

use crate::measure::{Bench, sweep_rows};
use half::bf16;
use rill::norm::{Backward, Forward, Norm, NormKind};
use rill::softmax::{PathKind, Plan, Softmax};
use rill::tuning::{Alignment, Bucket, FEW_ROWS, Knobs, Pattern, RowsBucket, TuningTable, WIDTH_BUCKETS, width_bucket};
use rill::{Element, Stream, Tensor};
use rill_example_fused_dequant_softmax::DequantKernels;
use std::cell::RefCell;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::error::Error;
use std::path::Path;

/// How much slower than the fastest plan the untuned one may be and still be the entry.
const UNTUNED_MARGIN: f64 = 0.01;

/// Narrowest bucket tuned at odd widths and few rows: narrower rows take the warp path at
/// any alignment and row count, whose plans the fallback's are.
const ODD_FROM: u64 = 2048;

/// Rows of the few-rows calls.
const FEW: usize = 8;

/// Each class a table names and the op that stands for it.
const CLASSES: [(&str, &str); 12] = [
    ("softmax", "softmax"),
    ("masked_softmax", "scaled_masked_softmax"),
    ("causal_softmax", "scaled_causal_softmax"),
    ("softmax_backward", "softmax_backward"),
    ("row_statistics", "cross_entropy"),
    ("cross_entropy_backward", "cross_entropy_backward"),
    ("norm", "rms_norm"),
    ("add_norm", "add_rms_norm"),
    ("norm_backward", "rms_norm_backward"),
    ("norm_backward_dw", "rms_norm_backward+params"),
    ("norm_backward_dw_db", "layer_norm_backward+params"),
    ("fused_transforming", "fused_dequant_softmax"),
];

/// One measured bucket: its table entry and its row of the printed summary.
struct Tuned {
    bucket: Bucket,
    knobs: Knobs,
    untuned_micros: f64,
    best_micros: f64,
}

/// Tunes every class `bench`'s filter selects (by class or op name) in the dtypes `dtype`
/// allows, writing the table to `out` as each bucket is tuned (a run cut short leaves the
/// buckets done); returns the table.
pub fn run(bench: &mut Bench, dtype: Option<&str>, out: &Path) -> Result<TuningTable, Box<dyn Error>> {
    let info = bench.gpu.info().clone();
    let mut table =
        TuningTable { gpu: info.name.clone(), compute_capability: info.compute_capability, ..Default::default() };
    let classes: Vec<_> = CLASSES.into_iter().filter(|&(class, op)| bench.wants(class, op)).collect();
    let dequant = DequantKernels::load(&bench.gpu)?;
    println!(
        "{:<24} {:>6} {:>7} {:>5} {:<10} {:>11} {:>11} {:>6}  plan",
        "class", "dtype", "cols", "rows", "alignment", "untuned(us)", "best(us)", "gain"
    );
    // Each bucket's entry is written, and its row printed, as it is tuned: a run cut short
    // leaves the buckets done.
    let mut done = |t: Tuned| -> Result<(), Box<dyn Error>> {
        table.entries.push(rill::tuning::Entry { pattern: pattern(&t.bucket), knobs: t.knobs });
        crate::write(out, &table.to_string())?;
        let Bucket { class, bits, cols, rows, alignment } = t.bucket;
        println!(
            "{class:<24} {bits:>5}b {cols:>7} {:>5} {:<10} {:>11.2} {:>11.2} {:>6.3}  {}",
            format!("{rows:?}").to_lowercase(),
            format!("{alignment:?}").to_lowercase(),
            t.untuned_micros,
            t.best_micros,
            t.untuned_micros / t.best_micros,
            t.knobs
        );
        Ok(())
    };
    if dtype.is_none_or(|d| d == "f32") {
        tune_dtype::<f32>(bench, &classes, None, &mut done)?;
    }
    if dtype.is_none_or(|d| d == "bf16") {
        tune_dtype::<bf16>(bench, &classes, Some(&dequant), &mut done)?;
    }
    eprintln!();
    Ok(table)
}

/// Every bucket of `classes` in dtype `T` (the fused class where `dequant` is given), each
/// handed to `done` as it is tuned.
fn tune_dtype<T: Element>(
    bench: &mut Bench,
    classes: &[(&'static str, &'static str)],
    dequant: Option<&DequantKernels>,
    done: &mut impl FnMut(Tuned) -> Result<(), Box<dyn Error>>,
) -> Result<(), Box<dyn Error>> {
    let mut shapes = Vec::new();
    for bound in WIDTH_BUCKETS {
        let cols = bound as usize;
        let rows = sweep_rows(cols);
        shapes.push((rows, cols));
        if bound >= ODD_FROM {
            shapes.extend([(rows, cols - 1), (FEW, cols)]);
        }
    }
    bench.plan(shapes.len() * classes.len());
    for (rows, cols) in shapes {
        let calls = Calls::<T>::new(bench, rows, cols, dequant)?;
        for &(class, op) in classes {
            if op.starts_with("fused") && dequant.is_none() {
                continue;
            }
            done(tune_bucket(bench, &calls, class, op)?)?;
        }
    }
    Ok(())
}

/// The entry's pattern for a tuned bucket: exactly the bucket, but the sweep's rows stand for
/// every row count a few-rows entry does not cover.
fn pattern(bucket: &Bucket) -> Pattern {
    let exact = Pattern::exactly(bucket);
    match bucket.rows {
        RowsBucket::Many => Pattern { rows: None, ..exact },
        RowsBucket::Few => exact,
    }
}

/// Times the plan the GPU takes without a table (its rules') and every distinct plan the
/// knobs give for `op` over `calls` (few rows: no caps on blocks an SM, which a grid of
/// fewer blocks than SMs never meets).
fn tune_bucket<T: Element>(
    bench: &mut Bench,
    calls: &Calls<'_, T>,
    class: &'static str,
    op: &'static str,
) -> rill::Result<Tuned> {
    let (rows, cols) = (calls.rows, calls.cols);
    rill::tuning::set_tuning_table(&bench.gpu, None);
    let untuned = calls.launch(&bench.stream, op, 0, true)?;
    let untuned_micros = calls.time(bench, op, f64::INFINITY, TIMED_BATCHES)?.expect("nothing is faster than infinity");
    // Each plan seen, with the first knobs that gave it (none yet for the untuned one).
    let mut seen: HashMap<String, Option<Knobs>> = HashMap::from([(format!("{untuned:?}"), None)]);
    // Round one: each distinct plan in one batch, those over twice the fastest passed.
    let mut screened: Vec<(f64, Knobs)> = Vec::new();
    let mut alignment = None;
    let capped = |knobs: &Knobs| matches!(knobs, Knobs::Shared { most_blocks_an_sm: Some(_), .. });
    for knobs in Knobs::all().into_iter().filter(|knobs| rows > FEW_ROWS || !capped(knobs)) {
        rill::tuning::set_tuning_table(&bench.gpu, Some(TuningTable::uniform(knobs)));
        let fastest = screened.iter().map(|&(micros, _)| micros).fold(untuned_micros, f64::min);
        // A plan the kernels refuse (an error with no launch) is no candidate: said, and passed.
        let timed = calls.launch(&bench.stream, op, 0, true).and_then(|plan| {
            if plan.kind() != PathKind::Warp {
                alignment.get_or_insert(Alignment::of_block_plan(&plan));
            }
            match seen.entry(format!("{plan:?}")) {
                Entry::Vacant(new) => {
                    new.insert(Some(knobs));
                    calls.time(bench, op, fastest, 1)
                }
                Entry::Occupied(mut known) => {
                    known.get_mut().get_or_insert(knobs);
                    Ok(None)
                }
            }
        });
        match timed {
            Ok(Some(micros)) => screened.push((micros, knobs)),
            Ok(None) => {}
            Err(error) => eprintln!("\n{class} {rows} x {cols}, {knobs}: {error}"),
        }
    }
    // Round two: the fastest few, timed as the untuned plan was.
    screened.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut best_micros, mut best) = (f64::INFINITY, None);
    for &(_, knobs) in screened.iter().take(FINALISTS) {
        rill::tuning::set_tuning_table(&bench.gpu, Some(TuningTable::uniform(knobs)));
        let micros = calls.time(bench, op, f64::INFINITY, TIMED_BATCHES)?.expect("nothing is faster than infinity");
        if micros < best_micros {
            (best_micros, best) = (micros, Some(knobs));
        }
    }
    rill::tuning::set_tuning_table(&bench.gpu, None);
    // The untuned plan's knobs where it is within the margin of the fastest and some knobs
    // give it; else the fastest's.
    let untuned_knobs = seen.get(&format!("{untuned:?}")).copied().flatten();
    let knobs = match (untuned_knobs, best) {
        (Some(knobs), _) if untuned_micros <= best_micros * (1.0 + UNTUNED_MARGIN) => knobs,
        (_, Some(best)) if best_micros < untuned_micros => best,
        (untuned_knobs, best) => untuned_knobs.or(best).unwrap_or(Knobs::of(&untuned)),
    };
    // Rows in the widest pack are aligned; others as the block paths' plans ran them.
    let alignment = match (cols.is_multiple_of(16 / size_of::<T>()), alignment) {
        (true, _) => Alignment::Aligned,
        (false, Some(found)) => found,
        (false, None) => Alignment::Unaligned,
    };
    let bits = 8 * size_of::<T>() as u32;
    let bucket = Bucket { class, bits, cols: width_bucket(cols), rows: RowsBucket::of(rows), alignment };
    let best_micros = best_micros.min(untuned_micros);
    bench.record::<T>(&format!("tune/{class}"), &[rows, cols], &knobs.to_string(), 0, best_micros, None);
    Ok(Tuned { bucket, knobs, untuned_micros, best_micros })
}

/// The arrays every class's op reads and writes over `rows x cols` of `T`, `sets` of those
/// that are `rows x cols`, zeroed: values do not change how long a memory-bound op takes.
struct Calls<'a, T: Element> {
    rows: usize,
    cols: usize,
    sets: usize,
    xs: Vec<Tensor<T>>,
    seconds: Vec<Tensor<T>>,
    ys: Vec<RefCell<Tensor<T>>>,
    sums: Vec<RefCell<Tensor<T>>>,
    mask: Tensor<T>,
    target: Tensor<i64>,
    loss: RefCell<Tensor<f32>>,
    dloss: Tensor<f32>,
    weight: Tensor<T>,
    dweight: RefCell<Tensor<T>>,
    dbias: RefCell<Tensor<T>>,
    mean: Tensor<f32>,
    rstd: Tensor<f32>,
    fused: Option<Fused<'a>>,
}

/// The fused class's kernels and arrays: int8 logits in, bf16 out.
struct Fused<'a> {
    kernels: &'a DequantKernels,
    quantized: Vec<Tensor<i8>>,
    scale: Tensor<f32>,
    bias: Tensor<bf16>,
    outs: Vec<RefCell<Tensor<bf16>>>,
}

impl<'a, T: Element> Calls<'a, T> {
    fn new(bench: &Bench, rows: usize, cols: usize, dequant: Option<&'a DequantKernels>) -> rill::Result<Self> {
        let (gpu, shape) = (&bench.gpu, [rows, cols]);
        let sets = bench.buffer_sets(4 * rows * cols * size_of::<T>());
        let cells =
            || -> rill::Result<Vec<_>> { Ok(bench.zeros(sets, &shape)?.into_iter().map(RefCell::new).collect()) };
        let target: Vec<i64> = (0..rows).map(|r| (r * 7919 % cols) as i64).collect();
        let fused = match dequant {
            Some(kernels) => Some(Fused {
                kernels,
                quantized: bench.zeros(sets, &shape)?,
                scale: Tensor::from_slice(gpu, &vec![0.01f32; rows], &[rows])?,
                bias: Tensor::zeros(gpu, &[cols])?,
                outs: bench.zeros(sets, &shape)?.into_iter().map(RefCell::new).collect(),
            }),
            None => None,
        };
        Ok(Calls {
            rows,
            cols,
            sets,
            xs: bench.zeros(sets, &shape)?,
            seconds: bench.zeros(sets, &shape)?,
            ys: cells()?,
            sums: cells()?,
            mask: Tensor::zeros(gpu, &[1, cols])?,
            target: Tensor::from_slice(gpu, &target, &[rows])?,
            loss: Tensor::zeros(gpu, &[rows])?.into(),
            dloss: Tensor::from_slice(gpu, &vec![1.0f32; rows], &[rows])?,
            weight: Tensor::from_slice(gpu, &vec![T::from_f64(1.0); cols], &[cols])?,
            dweight: Tensor::zeros(gpu, &[cols])?.into(),
            dbias: Tensor::zeros(gpu, &[cols])?.into(),
            mean: Tensor::zeros(gpu, &[rows])?,
            rstd: Tensor::from_slice(gpu, &vec![1.0f32; rows], &[rows])?,
            fused,
        })
    }

    /// Median time of `op` by the table set now over `batches` batches, in microseconds;
    /// `None` where one launch takes more than [`REJECTED_ABOVE`] times `best`
    /// (microseconds), which cannot win. Batches are sized by that launch's time: a plan a
    /// thousand times slower than the best costs a few launches, not a thousand times the
    /// best's batches.
    fn time(&self, bench: &mut Bench, op: &str, best: f64, batches: usize) -> rill::Result<Option<f64>> {
        // One launch sets the plan up (kernel attributes, the remembered plan); the next,
        // timed alone, sizes the batches.
        self.launch(&bench.stream, op, 0, false)?;
        let once = bench.stream.time_ms(|stream| self.launch(stream, op, 1 % self.sets, false).map(drop))?;
        let once_micros = 1e3 * once as f64;
        if once_micros > REJECTED_ABOVE * best {
            return Ok(None);
        }
        let per_batch = (BATCH_SECONDS * 1e6 / once_micros.max(1e-3)).ceil().clamp(1.0, 500.0) as usize;
        let (micros, _) =
            bench.time_per_batch(self.sets, per_batch, batches, |stream, set| self.launch(stream, op, set, false))?;
        Ok(Some(micros))
    }

    /// `op` over buffer set `set`, planned and launched (planned only where `plan_only`, but
    /// for the fused class, whose kernels always launch); returns its plan.
    fn launch(&self, stream: &Stream, op: &str, set: usize, plan_only: bool) -> rill::Result<Plan> {
        let softmax = if plan_only { Softmax::new().plan_only() } else { Softmax::new() };
        let norm = if plan_only { Norm::new().plan_only() } else { Norm::new() };
        let (x, second, rstd) = (&self.xs[set], &self.seconds[set], &self.rstd);
        let (y, sum) = (&mut *self.ys[set].borrow_mut(), &mut *self.sums[set].borrow_mut());
        let (rows, cols) = (self.rows, self.cols);
        let weight = &self.weight;
        match op {
            "softmax" => softmax.forward(stream, x, y, false),
            "softmax_backward" => softmax.backward(stream, x, second, y, false),
            "scaled_masked_softmax" => softmax.scale_mask(stream, x, &self.mask, 0.125, y),
            "scaled_causal_softmax" => {
                let q = crate::softmax::queries(rows, cols);
                let x = x.view().reshape(&[rows / q, q, cols])?;
                softmax.causal(stream, &x, 0.125, &mut y.view_mut().reshape(&[rows / q, q, cols])?)
            }
            "cross_entropy" => softmax.cross_entropy(stream, x, &self.target, &mut *self.loss.borrow_mut()),
            "cross_entropy_backward" => softmax.cross_entropy_backward(stream, x, &self.target, &self.dloss, y),
            "rms_norm" => norm.forward(stream, NormKind::RmsNorm, 1e-6, Forward::new(x, y).weight(weight)),
            "add_rms_norm" => {
                let call = Forward::new(x, y).weight(weight).residual(second, sum);
                norm.forward(stream, NormKind::RmsNorm, 1e-6, call)
            }
            "rms_norm_backward" => {
                norm.backward(stream, NormKind::RmsNorm, Backward::new(x, second, rstd, sum).weight(weight))
            }
            "rms_norm_backward+params" => {
                let call = Backward::new(x, second, rstd, sum).weight(weight);
                norm.backward(stream, NormKind::RmsNorm, call.dweight(&mut *self.dweight.borrow_mut()))
            }
            "layer_norm_backward+params" => {
                let call = Backward::new(x, second, rstd, sum).weight(weight).mean(&self.mean);
                let (dweight, dbias) = (&mut *self.dweight.borrow_mut(), &mut *self.dbias.borrow_mut());
                norm.backward(stream, NormKind::LayerNorm, call.dweight(dweight).dbias(dbias))
            }
            _ => {
                let Fused { kernels, quantized, scale, bias, outs } =
                    self.fused.as_ref().expect("the fused class is tuned in bf16 alone");
                kernels.dequant_softmax(stream, &quantized[set], scale, bias, &mut *outs[set].borrow_mut())
            }
        }
    }
}

/// Batches a candidate is timed in, and how long each runs: enough for a median that ranks
/// plans apart by a percent, few enough that a GPU's table takes minutes.
const TIMED_BATCHES: usize = 5;
const BATCH_SECONDS: f64 = 0.5e-3;

/// Plans of the first round (one batch each) timed again as the untuned plan is: the
/// first round's order is right but for plans within a few percent of each other.
const FINALISTS: usize = 4;

/// How many times the best plan's time one launch of a candidate may take and still be
/// timed: a lone launch's time carries the launch's own latency, so a plan that can win may
/// look up to about twice as slow in it, never more.
const REJECTED_ABOVE: f64 = 2.0;

#[cfg(test)]
mod tests {
    use super::CLASSES;

    #[test]
    fn every_class_tuned_is_one_a_table_names_once() {
        for (i, (class, _)) in CLASSES.iter().enumerate() {
            assert!(rill::tuning::CLASSES.contains(class), "{class}");
            assert!(CLASSES[i + 1..].iter().all(|(other, _)| other != class), "{class} twice");
        }
    }
}
