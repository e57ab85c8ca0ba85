//! `rill-bench`: effective bandwidth of every op on main against the device-to-device
//! copy measured in the same process, and a profile of a transformer block's ops.
//!
//! ```text
//! rill-bench [--quick] [--filter TEXT] [--dtype f32|f16|bf16] [--cols W,W,..] [--json PATH] [--plot-dir DIR] [--perf PATH] [--profile]
//! ```
//! - elementwise ops over lengths 2^16..2^28, the softmax family over the seed articles'
//!   sweep (49152 rows of 32..32768 columns, 768, 1000; 4096 rows of 50257..262144),
//!   LayerNorm and RMSNorm (plain, with residual add, backward with and without the
//!   parameter gradients) over 49152 rows of 32..32768 columns, 768, 1000 and 4096 rows of
//!   50257, the RMSNorm optimization ladder's rungs (`rms_norm_ladder/<rung>`, 49152 rows of
//!   128..32768 columns, 768, 1000), in f32, f16 and bf16; `--quick` a one-minute subset,
//!   `--filter` ops or families by name, `--dtype` one dtype, `--cols` some row widths;
//! - the table on stdout (op, dtype, shape, path, time, GB/s, % of copy), progress on
//!   stderr, the records as JSON (`--json`, default target/bench/bench.json), one SVG plot
//!   per op (`--plot-dir`), and the tables spliced into a Markdown file between
//!   `<!-- bench:begin -->` and `<!-- bench:end -->` (`--perf`, e.g. docs/PERF.md);
//! - `--profile`: the profile table instead of the sweep.
//!
//! Effective bandwidth counts each input read once and each output written once. Each
//! figure is the median of 15 batches timed with CUDA events, after warm-up, cycling
//! through buffer sets four times the L2 size. Without a GPU it prints "no CUDA device"
//! and exits 0.

mod elementwise;
mod measure;
mod norm;
mod norm_ladder;
mod profile;
mod report;
mod softmax;

use half::{bf16, f16};
use measure::Bench;
use rill::Gpu;
use std::path::PathBuf;

#[derive(Default)]
struct Options {
    quick: bool,
    profile: bool,
    filter: Option<String>,
    /// Only this dtype (f32, f16 or bf16).
    dtype: Option<String>,
    /// Only shapes of these row widths.
    cols: Option<Vec<usize>>,
    json: Option<PathBuf>,
    plot_dir: Option<PathBuf>,
    perf: Option<PathBuf>,
    /// Regenerate the report from a recorded run instead of measuring (no GPU needed).
    from_json: Option<PathBuf>,
    /// The device line for a regenerated report.
    device: Option<String>,
}

fn main() {
    let options = match parse_args(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(message) => {
            eprintln!(
                "error: {message}\nusage: rill-bench [--quick] [--filter TEXT] [--dtype f32|f16|bf16] [--cols W,W,..] [--json PATH] [--plot-dir DIR] [--perf PATH] [--profile]\n       rill-bench --from-json PATH --device TEXT [--plot-dir DIR] [--perf PATH]"
            );
            std::process::exit(2);
        }
    };
    if let Some(path) = options.from_json.clone() {
        let regenerated = std::fs::read_to_string(&path)
            .map_err(|e| format!("{}: {e}", path.display()))
            .and_then(|json| report::parse(&json).map_err(|e| format!("{}: {e}", path.display())))
            .map_err(|e| e.into())
            .and_then(|records| {
                let device = options.device.clone().unwrap_or_else(|| "an unnamed GPU".into());
                report_records(&records, &device, &Options { json: None, ..options })
            });
        if let Err(error) = regenerated {
            eprintln!("error: {error}");
            std::process::exit(1);
        }
        return;
    }
    let gpu = match Gpu::new(0) {
        Ok(gpu) => gpu,
        Err(error) => {
            println!("no CUDA device ({error}): nothing measured");
            return;
        }
    };
    if let Err(error) = run(gpu, options) {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut options = Options::default();
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or(format!("{flag} needs a value"));
        match arg.as_str() {
            "--quick" => options.quick = true,
            "--profile" => options.profile = true,
            "--filter" => options.filter = Some(value("--filter")?),
            "--cols" => {
                let list = value("--cols")?;
                let cols = list.split(',').map(|c| c.trim().parse::<usize>()).collect::<Result<Vec<_>, _>>();
                options.cols = Some(cols.map_err(|_| format!("--cols takes widths like 768,1024, not `{list}`"))?);
            }
            "--dtype" => match value("--dtype")?.as_str() {
                dtype @ ("f32" | "f16" | "bf16") => options.dtype = Some(dtype.to_string()),
                other => return Err(format!("--dtype takes f32, f16 or bf16, not `{other}`")),
            },
            "--json" => options.json = Some(value("--json")?.into()),
            "--plot-dir" => options.plot_dir = Some(value("--plot-dir")?.into()),
            "--perf" => options.perf = Some(value("--perf")?.into()),
            "--from-json" => options.from_json = Some(value("--from-json")?.into()),
            "--device" => options.device = Some(value("--device")?),
            // Passed by `cargo bench`.
            "--bench" => {}
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(options)
}

fn run(gpu: Gpu, options: Options) -> Result<(), Box<dyn std::error::Error>> {
    let info = gpu.info().clone();
    let (major, minor) = info.driver_api;
    let device = format!(
        "{} ({} SMs, {} MB L2; driver for CUDA {major}.{minor})",
        info.name,
        info.multiprocessors,
        info.l2_bytes >> 20
    );
    println!("device: {device}");
    let mut bench = Bench::new(gpu, options.quick, options.filter.clone(), options.cols.clone())?;
    if options.profile {
        profile::run(&mut bench)?;
        return Ok(());
    }
    sweep_dtype::<f32>(&mut bench, &options)?;
    sweep_dtype::<f16>(&mut bench, &options)?;
    sweep_dtype::<bf16>(&mut bench, &options)?;
    eprintln!();
    let json = options.json.clone().unwrap_or_else(|| PathBuf::from("target/bench/bench.json"));
    write(&json, &report::to_json(&bench.records)?)?;
    report_records(&bench.records, &device, &options)
}

/// Every family's sweep in dtype `T`, unless `--dtype` names another.
fn sweep_dtype<T: rill::Element>(bench: &mut Bench, options: &Options) -> rill::Result<()> {
    if options.dtype.as_ref().is_some_and(|d| d != T::DTYPE.name()) {
        return Ok(());
    }
    elementwise::sweep::<T>(bench)?;
    softmax::sweep::<T>(bench)?;
    norm::sweep::<T>(bench)?;
    norm_ladder::sweep::<T>(bench)
}

/// The plots, the PERF.md section and the table of `records`.
fn report_records(
    records: &[report::Record],
    device: &str,
    options: &Options,
) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(dir) = &options.plot_dir {
        for (name, svg) in report::plots(records, device)? {
            write(&dir.join(name), &svg)?;
        }
    }
    if let Some(perf) = &options.perf {
        let date = std::process::Command::new("date")
            .arg("+%Y-%m-%d")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let doc = std::fs::read_to_string(perf).unwrap_or_default();
        write(perf, &report::splice(&doc, &report::markdown(records, device, &date)))?;
    }

    println!("\n{:<31} {:<5} {:>16} {:>10} {:>9} {:>7}  path", "op", "dtype", "shape", "time(us)", "GB/s", "%copy");
    for r in records {
        let shape = format!("{:?}", r.shape);
        let percent = 100.0 * r.of_copy;
        println!(
            "{:<31} {:<5} {shape:>16} {:>10.2} {:>9.1} {percent:>6.1}%  {}",
            r.op, r.dtype, r.micros, r.gbps, r.path
        );
    }
    if let Some(note) = norm_ladder::footnote(records) {
        println!("{note}");
    }
    Ok(())
}

fn write(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, text)
}
