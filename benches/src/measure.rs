//! Timing: CUDA events around batches of launches, median of batches, inputs rotated
//! through enough buffer sets that no launch reads from L2.

use crate::report::Record;
use rill::norm::Norm;
use rill::softmax::{PathKind, Softmax};
use rill::{Element, Gpu, Stream, Tensor};
use rill_tests::shapes::softmax_bench_shapes;

/// What every sweep shares: the device, options, the results so far, and progress.
pub struct Bench {
    pub gpu: Gpu,
    pub stream: Stream,
    pub quick: bool,
    /// `--filter`: an op runs if its name or family contains one of these.
    pub filter: Option<Vec<String>>,
    /// Only shapes with these row widths (`--cols`).
    pub cols: Option<Vec<usize>>,
    /// The rows of every row op's shape (`--rows`), instead of the sweep's.
    pub rows: Option<usize>,
    /// The row path the softmax family and the norms run on (`--path`); the dispatcher's
    /// choice where `None`.
    pub force: Option<PathKind>,
    pub records: Vec<Record>,
    done: usize,
    total: usize,
}

impl Bench {
    pub fn new(gpu: Gpu, quick: bool, filter: Option<Vec<String>>, cols: Option<Vec<usize>>) -> rill::Result<Bench> {
        let stream = gpu.stream()?;
        Ok(Bench { gpu, stream, quick, filter, cols, rows: None, force: None, records: Vec::new(), done: 0, total: 0 })
    }

    /// The softmax family's ops on `--path`, if given.
    pub fn softmax(&self) -> Softmax {
        self.force.map_or_else(Softmax::new, Softmax::forced)
    }

    /// The norms on `--path`, if given.
    pub fn norm(&self) -> Norm {
        self.force.map_or_else(Norm::new, Norm::forced)
    }

    /// The `(rows, cols)` shapes of the row ops' sweep that `keep` and `--cols` (if given)
    /// accept: the softmax family's (49152 rows of 32 to 32768 columns, 768 and 1000; 4096 rows
    /// of 32001 and 50257 to 262144), with `--quick` 49152 rows of 1024 and 8192; see
    /// [`chosen_shapes`] for widths outside the sweep and `--rows`.
    pub fn row_shapes(&self, keep: impl Fn(usize, usize) -> bool) -> Vec<(usize, usize)> {
        let sweep = if self.quick { vec![(49152, 1024), (49152, 8192)] } else { softmax_bench_shapes() };
        let shapes = chosen_shapes(sweep, self.cols.as_deref(), self.rows);
        shapes.into_iter().filter(|&(rows, cols)| keep(rows, cols)).collect()
    }

    /// Whether `--cols` names width `cols`: an op's sweep takes such a width past its own
    /// widest.
    pub fn asks_for(&self, cols: usize) -> bool {
        self.cols.as_ref().is_some_and(|widths| widths.contains(&cols))
    }

    /// Whether the filter (if any) selects op `name` of `family`.
    pub fn wants(&self, family: &str, name: &str) -> bool {
        let matches = |f: &String| name.contains(f.as_str()) || family.contains(f.as_str());
        self.filter.as_ref().is_none_or(|texts| texts.iter().any(matches))
    }

    /// Announces `steps` more measurements for the progress line.
    pub fn plan(&mut self, steps: usize) {
        self.total += steps;
    }

    /// Buffer sets cycled through so their total is at least four L2 caches.
    pub fn buffer_sets(&self, bytes_per_set: usize) -> usize {
        (4 * self.gpu.info().l2_bytes as usize).div_ceil(bytes_per_set.max(1)).clamp(1, 64)
    }

    /// `sets` tensors of `shape` holding `host`.
    pub fn upload<T: Element>(&self, sets: usize, host: &[T], shape: &[usize]) -> rill::Result<Vec<Tensor<T>>> {
        (0..sets).map(|_| Tensor::from_slice(&self.gpu, host, shape)).collect()
    }

    /// `sets` zeroed tensors of `shape`.
    pub fn zeros<T: Element>(&self, sets: usize, shape: &[usize]) -> rill::Result<Vec<Tensor<T>>> {
        (0..sets).map(|_| Tensor::zeros(&self.gpu, shape)).collect()
    }

    /// Measures and records the copy of each of `inputs` to the output of its set, the ceiling
    /// of the ops at their shape; returns its GB/s.
    pub fn copy<T: Element>(&mut self, inputs: &[Tensor<T>], outputs: &mut [Tensor<T>]) -> rill::Result<f64> {
        let (shape, bytes) = (inputs[0].shape().to_vec(), 2 * inputs[0].len() * size_of::<T>());
        let (micros, ()) =
            self.time(inputs.len(), bytes, |stream, s| rill::copy(stream, &inputs[s], &mut outputs[s]))?;
        Ok(self.record::<T>("copy", &shape, "-", bytes, micros, None))
    }

    /// Median device time of one `launch(stream, set)`, in microseconds, over 15 timed
    /// batches of about 2 ms (the launches go on the timed stream), and what the first launch
    /// returned.
    pub fn time<R>(
        &mut self,
        sets: usize,
        bytes: usize,
        launch: impl FnMut(&Stream, usize) -> rill::Result<R>,
    ) -> rill::Result<(f64, R)> {
        self.time_batches(sets, bytes, 15, 2e-3, launch)
    }

    /// [`Bench::time`] over `batches` batches of about `seconds` each at 3 TB/s.
    pub fn time_batches<R>(
        &mut self,
        sets: usize,
        bytes: usize,
        batches: usize,
        seconds: f64,
        launch: impl FnMut(&Stream, usize) -> rill::Result<R>,
    ) -> rill::Result<(f64, R)> {
        let per_batch = (seconds * 3e12 / bytes as f64).ceil().clamp(1.0, 500.0) as usize;
        self.time_per_batch(sets, per_batch, batches, launch)
    }

    /// Median device time of one `launch(stream, set)`, in microseconds, over `batches`
    /// batches of `per_batch` launches (after one launch of each set), and what the first
    /// launch returned.
    pub fn time_per_batch<R>(
        &mut self,
        sets: usize,
        per_batch: usize,
        batches: usize,
        mut launch: impl FnMut(&Stream, usize) -> rill::Result<R>,
    ) -> rill::Result<(f64, R)> {
        let first = launch(&self.stream, 0)?;
        for set in 1..sets.max(3) {
            launch(&self.stream, set % sets)?;
        }
        let mut samples = Vec::with_capacity(batches);
        for batch in 0..batches {
            let ms = self
                .stream
                .time_ms(|s| (0..per_batch).try_for_each(|i| launch(s, (batch * per_batch + i) % sets).map(drop)))?;
            samples.push(1e3 * ms as f64 / per_batch as f64);
        }
        samples.sort_by(f64::total_cmp);
        Ok((samples[samples.len() / 2], first))
    }

    /// Records a measurement in dtype `T` of `bytes` moved in `micros` (against `copy_gbps`;
    /// `None` for the copy itself) and advances the progress line; returns the GB/s.
    pub fn record<T: Element>(
        &mut self,
        op: &str,
        shape: &[usize],
        path: &str,
        bytes: usize,
        micros: f64,
        copy_gbps: Option<f64>,
    ) -> f64 {
        let (dtype, gbps) = (T::DTYPE.name(), bytes as f64 / micros / 1e3);
        self.records.push(Record {
            op: op.into(),
            dtype: dtype.into(),
            shape: shape.to_vec(),
            path: path.into(),
            micros,
            gbps,
            of_copy: copy_gbps.map_or(1.0, |copy| gbps / copy),
            implementation: crate::report::RILL.into(),
        });
        self.done += 1;
        eprint!("\r[{:>4}/{:>4}] {op} {dtype} {shape:?}                    ", self.done, self.total.max(self.done));
        gbps
    }
}

/// The rows of the sweep's row-op shapes of `cols` columns: 49152, 4096 past 32768 columns.
pub fn sweep_rows(cols: usize) -> usize {
    if cols > 32768 { 4096 } else { 49152 }
}

/// The `(rows, cols)` shapes of `sweep` whose widths `cols` names (all without it), widths
/// it names outside the sweep added at the sweep's rows for their size (4096 past 32768
/// columns, else 49152), every shape at `rows` where given.
fn chosen_shapes(mut sweep: Vec<(usize, usize)>, cols: Option<&[usize]>, rows: Option<usize>) -> Vec<(usize, usize)> {
    if let Some(wanted) = cols {
        for &width in wanted {
            if sweep.iter().all(|&(_, swept)| swept != width) {
                sweep.push((sweep_rows(width), width));
            }
        }
        sweep.retain(|(_, width)| wanted.contains(width));
    }
    sweep.into_iter().map(|(swept, width)| (rows.unwrap_or(swept), width)).collect()
}

#[cfg(test)]
mod tests {
    use super::chosen_shapes;

    #[test]
    fn shapes_follow_the_widths_and_rows_asked_for() {
        let sweep = vec![(49152, 256), (49152, 1024), (4096, 50257)];
        assert_eq!(chosen_shapes(sweep.clone(), None, None), sweep);
        assert_eq!(
            chosen_shapes(sweep.clone(), Some(&[1024, 50256, 100]), None),
            [(49152, 1024), (4096, 50256), (49152, 100)]
        );
        assert_eq!(chosen_shapes(sweep, Some(&[50257]), Some(16384)), [(16384, 50257)]);
    }
}
