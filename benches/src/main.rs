//! Effective bandwidth of every elementwise op, against the device-to-device copy measured
//! in the same process, over lengths 2^16 to 2^28, f32 and f16.
//!
//! `rill-bench [--quick] [--filter TEXT] [--json PATH]`. Effective bandwidth counts each
//! input read once and the output written once. Each figure is the median over batches
//! timed with CUDA events, after warm-up, cycling through enough buffer sets that
//! together exceed the L2 cache several times over, so no run reads a cached input.
//! Without a GPU it prints "no CUDA device" and exits 0.

use half::f16;
use rill::{Element, Gpu, Stream, Tensor};
use rill_tests::reference::ELEMENTWISE_OPS;
use rill_tests::shapes::ELEMENTWISE_BENCH_LENGTHS;
use std::fmt::Write as _;

struct Options {
    quick: bool,
    filter: Option<String>,
    json: String,
}

impl Options {
    /// Whether the filter (if any) selects `name`, or the family it belongs to.
    fn wants(&self, name: &str) -> bool {
        self.filter.as_ref().is_none_or(|f| name.contains(f.as_str()) || f.contains(name))
    }
}

struct Row {
    op: String,
    dtype: &'static str,
    shape: String,
    /// The implementation that ran (softmax family), or "-".
    path: String,
    micros: f64,
    gbps: f64,
    of_copy: f64,
}

impl Row {
    /// A measurement of `bytes` moved in `micros`, against the copy's GB/s (`None`: this
    /// row is the copy).
    fn new(
        op: &str,
        dtype: &'static str,
        shape: &str,
        path: &str,
        bytes: usize,
        micros: f64,
        copy_gbps: Option<f64>,
    ) -> Row {
        let gbps = bytes as f64 / micros / 1e3;
        Row {
            op: op.into(),
            dtype,
            shape: shape.into(),
            path: path.into(),
            micros,
            gbps,
            of_copy: copy_gbps.map_or(1.0, |copy| gbps / copy),
        }
    }
}

fn main() {
    let options = parse_args();
    let gpu = match Gpu::new(0) {
        Ok(gpu) => gpu,
        Err(error) => {
            println!("no CUDA device ({error}): nothing measured");
            return;
        }
    };
    if let Err(error) = run(&gpu, &options) {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}

fn parse_args() -> Options {
    let mut options = Options { quick: false, filter: None, json: "target/bench/elementwise.json".into() };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => options.quick = true,
            "--filter" => options.filter = args.next(),
            "--json" => options.json = args.next().unwrap_or(options.json),
            "--bench" => {}
            other => {
                eprintln!("usage: rill-bench [--quick] [--filter TEXT] [--json PATH] (unknown argument `{other}`)");
                std::process::exit(2);
            }
        }
    }
    options
}

fn run(gpu: &Gpu, options: &Options) -> rill::Result<()> {
    let stream = gpu.stream()?;
    let info = gpu.info();
    println!("device: {} ({} SMs, {} MB L2)", info.name, info.multiprocessors, info.l2_bytes >> 20);
    let mut rows = Vec::new();
    if options.wants("elementwise") {
        sweep::<f32>(gpu, &stream, options, &mut rows)?;
        sweep::<f16>(gpu, &stream, options, &mut rows)?;
    }
    if options.wants("softmax") {
        softmax_sweep::<f32>(gpu, &stream, options, &mut rows)?;
        softmax_sweep::<f16>(gpu, &stream, options, &mut rows)?;
    }

    let mut json = String::from("[\n");
    for (i, r) in rows.iter().enumerate() {
        let comma = if i + 1 < rows.len() { "," } else { "" };
        let _ = writeln!(
            json,
            "  {{\"op\": \"{}\", \"dtype\": \"{}\", \"shape\": \"{}\", \"path\": \"{}\", \"micros\": {:.3}, \"gbps\": {:.1}, \"of_copy\": {:.4}}}{comma}",
            r.op, r.dtype, r.shape, r.path, r.micros, r.gbps, r.of_copy
        );
    }
    json.push_str("]\n");
    if let Some(dir) = std::path::Path::new(&options.json).parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(error) = std::fs::write(&options.json, json) {
        eprintln!("could not write {}: {error}", options.json);
    }

    println!("\n{:<22} {:<5} {:>15} {:>10} {:>9} {:>7}  path", "op", "dtype", "shape", "time(us)", "GB/s", "%copy");
    for r in &rows {
        let percent = 100.0 * r.of_copy;
        println!(
            "{:<22} {:<5} {:>15} {:>10.2} {:>9.1} {percent:>6.1}%  {}",
            r.op, r.dtype, r.shape, r.micros, r.gbps, r.path
        );
    }
    Ok(())
}

/// Buffer sets cycled through so their total is at least four L2 caches.
fn buffer_sets(gpu: &Gpu, bytes_per_set: usize) -> usize {
    (4 * gpu.info().l2_bytes as usize).div_ceil(bytes_per_set).clamp(1, 64)
}

/// Median device time of one call of `launch(set)`, in microseconds.
fn median_micros(
    stream: &Stream,
    sets: usize,
    bytes: usize,
    mut launch: impl FnMut(usize) -> rill::Result<()>,
) -> rill::Result<f64> {
    // Enough launches per timed batch for about 2 ms at 3 TB/s.
    let per_batch = (2e-3 * 3e12 / bytes as f64).ceil().clamp(1.0, 500.0) as usize;
    for set in 0..sets.max(3) {
        launch(set % sets)?;
    }
    let mut samples = Vec::with_capacity(15);
    for batch in 0..15 {
        let ms = stream.time_ms(|_| (0..per_batch).try_for_each(|i| launch((batch * per_batch + i) % sets)))?;
        samples.push(1e3 * ms as f64 / per_batch as f64);
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

fn sweep<T: Element>(gpu: &Gpu, stream: &Stream, options: &Options, rows: &mut Vec<Row>) -> rill::Result<()> {
    use rill::elementwise as ew;
    let dtype = T::DTYPE.name();
    let lengths: Vec<usize> = if options.quick { vec![1 << 20, 1 << 24] } else { ELEMENTWISE_BENCH_LENGTHS.to_vec() };
    for &len in &lengths {
        let size = size_of::<T>();
        let sets = buffer_sets(gpu, 4 * len * size);
        // Inputs kept away from zero so divisions stay finite.
        let mut rng = rill_tests::random::Rng::new(len as u64);
        let domain = rill_tests::random::Domain::AwayFromZero(0.5, 2.0);
        let host: Vec<T> = (0..len).map(|_| T::from_f64(domain.sample(&mut rng))).collect();
        let tensors: Vec<[Tensor<T>; 4]> = (0..sets)
            .map(|_| -> rill::Result<[Tensor<T>; 4]> {
                let t = || Tensor::from_slice(gpu, &host, &[len]);
                Ok([t()?, t()?, t()?, t()?])
            })
            .collect::<rill::Result<_>>()?;
        let mut outputs: Vec<Tensor<T>> =
            tensors.iter().map(|_| Tensor::zeros(gpu, &[len])).collect::<rill::Result<_>>()?;

        let copy_bytes = 2 * len * size;
        let copy_us = median_micros(stream, sets, copy_bytes, |s| {
            let [x, ..] = &tensors[s];
            rill::copy(stream, x, &mut outputs[s])
        })?;
        let shape = format!("[{len}]");
        let copy = Row::new("copy", dtype, &shape, "-", copy_bytes, copy_us, None);
        let copy_gbps = copy.gbps;
        rows.push(copy);

        for op in ELEMENTWISE_OPS {
            if !options.wants(op.name) && !options.wants("elementwise") {
                continue;
            }
            let cols = 4096.min(len);
            let bytes = if op.broadcasts_last { 2 * len * size + cols * size } else { (op.arity + 1) * len * size };
            let micros = median_micros(stream, sets, bytes, |s| {
                let [a, b, c, bias] = &tensors[s];
                let y = &mut outputs[s];
                match op.name {
                    "relu" => ew::relu(stream, a, y),
                    "gelu" => ew::gelu(stream, a, y),
                    "gelu_tanh" => ew::gelu_tanh(stream, a, y),
                    "silu" => ew::silu(stream, a, y),
                    "sigmoid" => ew::sigmoid(stream, a, y),
                    "add" => ew::add(stream, a, b, y),
                    "sub" => ew::sub(stream, a, b, y),
                    "mul" => ew::mul(stream, a, b, y),
                    "div" => ew::div(stream, a, b, y),
                    "fma" => ew::fma(stream, a, b, c, y),
                    "bias_add_gelu" => ew::bias_add_gelu(
                        stream,
                        &a.view().reshape(&[len / cols, cols])?,
                        &bias.view().slice(0..cols)?,
                        &mut y.view_mut().reshape(&[len / cols, cols])?,
                    ),
                    other => Err(rill::Error::Unsupported(format!("no benchmark for `{other}`"))),
                }
            })?;
            rows.push(Row::new(op.name, dtype, &shape, "-", bytes, micros, Some(copy_gbps)));
        }
        eprintln!("{dtype} n={len}: done");
    }
    Ok(())
}

/// Softmax forward and backward over the rows of `(rows, cols)` tensors.
fn softmax_sweep<T: Element>(
    gpu: &Gpu,
    stream: &Stream,
    options: &Options,
    rows_out: &mut Vec<Row>,
) -> rill::Result<()> {
    use rill::softmax;
    let dtype = T::DTYPE.name();
    let shapes: Vec<(usize, usize)> =
        if options.quick { vec![(49152, 1024), (49152, 8192)] } else { rill_tests::shapes::softmax_bench_shapes() };
    for (rows, cols) in shapes {
        let len = rows * cols;
        let size = size_of::<T>();
        let sets = buffer_sets(gpu, 3 * len * size);
        let mut rng = rill_tests::random::Rng::new(len as u64);
        let host: Vec<T> = (0..len).map(|_| T::from_f64(rng.uniform(-8.0, 8.0))).collect();
        let inputs: Vec<[Tensor<T>; 2]> = (0..sets)
            .map(|_| -> rill::Result<[Tensor<T>; 2]> {
                let t = || Tensor::from_slice(gpu, &host, &[rows, cols]);
                Ok([t()?, t()?])
            })
            .collect::<rill::Result<_>>()?;
        let mut outputs: Vec<Tensor<T>> =
            (0..sets).map(|_| Tensor::zeros(gpu, &[rows, cols])).collect::<rill::Result<_>>()?;
        let shape = format!("[{rows}, {cols}]");

        let copy_bytes = 2 * len * size;
        let copy_us = median_micros(stream, sets, copy_bytes, |s| rill::copy(stream, &inputs[s][0], &mut outputs[s]))?;
        let copy = Row::new("copy", dtype, &shape, "-", copy_bytes, copy_us, None);
        let copy_gbps = copy.gbps;
        rows_out.push(copy);

        for (op, arrays) in [("softmax", 2), ("log_softmax", 2), ("softmax_backward", 3)] {
            if !options.wants(op) && !options.wants("softmax") {
                continue;
            }
            let bytes = arrays * len * size;
            let mut plan = None;
            let micros = median_micros(stream, sets, bytes, |s| {
                let [x, dy] = &inputs[s];
                let y = &mut outputs[s];
                plan = Some(match op {
                    "softmax" => softmax::softmax(stream, x, y)?,
                    "log_softmax" => softmax::log_softmax(stream, x, y)?,
                    _ => softmax::softmax_backward(stream, x, dy, y)?,
                });
                Ok(())
            })?;
            let path = plan.map_or("-".into(), |p| p.describe());
            rows_out.push(Row::new(op, dtype, &shape, &path, bytes, micros, Some(copy_gbps)));
        }
        eprintln!("softmax {dtype} {shape}: done");
    }
    Ok(())
}
