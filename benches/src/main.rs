//! `rill-bench`: effective bandwidth of every op on main against the device-to-device
//! copy measured in the same process, and a profile of a transformer block's ops.
//!
//! ```text
//! rill-bench [--quick] [--filter TEXT,..] [--dtype f32|f16|bf16] [--cols W,W,..] [--rows N] [--peers [--python PATH]] [--json PATH] [--plot-dir DIR] [--perf PATH] [--profile]
//! rill-bench --from-json PATH [--device TEXT] [--plot-dir DIR] [--perf PATH]
//! ```
//! - elementwise ops over lengths 2^16..2^28, the softmax family over the seed articles'
//!   sweep (49152 rows of 32..32768 columns, 768, 1000; 4096 rows of 50257..262144),
//!   LayerNorm and RMSNorm (plain, with residual add, backward with and without the
//!   parameter gradients) over 49152 rows of 32..32768 columns, 768, 1000 and 4096 rows of
//!   50257 (and wider widths `--cols` names), the RMSNorm optimization ladder's rungs
//!   (`rms_norm_ladder/<rung>`, 49152 rows of 128..32768 columns, 768, 1000), in f32, f16
//!   and bf16; BatchNorm with ReLU and with Add + ReLU (forward, backward, both) and the
//!   mask-based ReLU backward at ResNet's shapes (see `batch_norm.rs`); a user's fused
//!   kernel (int8 dequantize + softmax, see `fused.rs`) against the unfused chain; `--quick`
//!   a one-minute subset, `--filter` ops or families by name (any of several texts),
//!   `--dtype` one dtype, `--cols` some row widths (widths outside the sweep too), `--rows`
//!   the row ops' rows;
//! - the table on stdout (op, dtype, shape, path, time, GB/s, % of copy), progress on
//!   stderr, the records as JSON (`--json`, default target/bench/bench.json), one SVG plot
//!   per op (`--plot-dir`), and the tables spliced into a Markdown file between
//!   `<!-- bench:begin -->` and `<!-- bench:end -->` (`--perf`, e.g. docs/PERF.md);
//! - `--peers`: after rill's sweep, the same ops, dtypes and shapes timed for PyTorch eager
//!   and torch.compile, and Liger and QuACK where installed (`benches/peers/rows.py`, run by
//!   `--python`, default python3), merged into the table, the JSON, the plots (a line per
//!   implementation) and the Markdown (a table per op against the best peer); without python3
//!   or torch one line says so and rill's figures stand alone;
//! - `--profile`: the profile table instead of the sweep; `--from-json`: the report of a
//!   recorded run, `--device` naming its GPU, without measuring (no GPU needed).
//!
//! Effective bandwidth counts each input read once and each output written once. Each
//! figure is the median of 15 batches timed with CUDA events, after warm-up, cycling
//! through buffer sets four times the L2 size. Without a GPU it prints "no CUDA device"
//! and exits 0; bad arguments exit 2.

mod batch_norm;
mod elementwise;
mod fused;
mod measure;
mod norm;
mod norm_ladder;
mod peers;
mod profile;
mod report;
mod small;
mod softmax;

use clap::Parser;
use half::{bf16, f16};
use measure::Bench;
use rill::Gpu;
use rill::softmax::PathKind;
use std::error::Error;
use std::path::{Path, PathBuf};

/// rill's bandwidth benchmarks: every op against the device-to-device copy measured in the
/// same run.
#[derive(Parser)]
#[command(name = "rill-bench", args_override_self = true)]
struct Options {
    /// A one-minute subset of the sweep.
    #[arg(long)]
    quick: bool,
    /// The profile of a transformer block's ops instead of the sweep.
    #[arg(long)]
    profile: bool,
    /// Only ops or families whose name contains one of the TEXTs.
    #[arg(long, value_name = "TEXT,..", value_delimiter = ',', action = clap::ArgAction::Set)]
    filter: Option<Vec<String>>,
    /// Only this dtype.
    #[arg(long, value_parser = ["f32", "f16", "bf16"])]
    dtype: Option<String>,
    /// Only shapes of these row widths.
    #[arg(long, value_name = "W,W,..", value_delimiter = ',', value_parser = width, action = clap::ArgAction::Set)]
    cols: Option<Vec<usize>>,
    /// Run the row ops at this many rows instead of the sweep's.
    #[arg(long, value_name = "N")]
    rows: Option<usize>,
    /// Run the sweep's softmax-family and norm rows on this path (a shape it does not take
    /// is an error), instead of the dispatcher's choice.
    #[arg(long, value_parser = path_kind)]
    path: Option<PathKind>,
    /// Also time PyTorch eager, torch.compile, Liger and QuACK on the same shapes.
    #[arg(long)]
    peers: bool,
    /// The Python interpreter that runs the peers.
    #[arg(long, value_name = "PATH", default_value = "python3")]
    python: String,
    /// Where the records are written.
    #[arg(long, value_name = "PATH", default_value = "target/bench/bench.json")]
    json: PathBuf,
    /// Where one SVG plot per op is written.
    #[arg(long, value_name = "DIR")]
    plot_dir: Option<PathBuf>,
    /// A Markdown file whose section between the bench markers gets the tables.
    #[arg(long, value_name = "PATH")]
    perf: Option<PathBuf>,
    /// Regenerate the report from a recorded run instead of measuring (no GPU needed).
    #[arg(long, value_name = "PATH")]
    from_json: Option<PathBuf>,
    /// The device line for a regenerated report.
    #[arg(long, value_name = "TEXT", default_value = "an unnamed GPU")]
    device: String,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// `--path`: a row path by its name.
fn path_kind(text: &str) -> Result<PathKind, String> {
    PathKind::ALL
        .into_iter()
        .find(|path| format!("{path:?}").eq_ignore_ascii_case(text.trim()))
        .ok_or_else(|| "takes warp, shared, uncached or cluster".to_string())
}

/// One width of `--cols`, spaces around it allowed.
fn width(text: &str) -> Result<usize, String> {
    text.trim().parse().map_err(|_| "takes widths like 768,1024".to_string())
}

fn main() {
    let options = Options::parse();
    let result = match &options.from_json {
        Some(path) => regenerate(path, &options),
        None => match Gpu::new(0) {
            Ok(gpu) => run(gpu, &options),
            Err(error) => return println!("no CUDA device ({error}): nothing measured"),
        },
    };
    if let Err(error) = result {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}

/// The report of the run recorded in `path`.
fn regenerate(path: &Path, options: &Options) -> Result<(), Box<dyn Error>> {
    let records = std::fs::read_to_string(path)
        .map_err(Box::<dyn Error>::from)
        .and_then(|json| Ok(report::parse(&json)?))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    report_records(&records, &options.device, options)
}

fn run(gpu: Gpu, options: &Options) -> Result<(), Box<dyn Error>> {
    let info = gpu.info().clone();
    let (major, minor) = info.driver_api;
    let device = format!(
        "{} ({} SMs, {} MB L2, DRAM {:.2} TB/s peak; driver for CUDA {major}.{minor})",
        info.name,
        info.multiprocessors,
        info.l2_bytes >> 20,
        info.dram_bytes_per_second as f64 * 1e-12
    );
    println!("device: {device}");
    let mut bench = Bench::new(gpu, options.quick, options.filter.clone(), options.cols.clone())?;
    bench.force = options.path;
    bench.rows = options.rows;
    if options.profile {
        profile::run(&mut bench)?;
        return Ok(());
    }
    sweep_dtype::<f32>(&mut bench, options)?;
    sweep_dtype::<f16>(&mut bench, options)?;
    sweep_dtype::<bf16>(&mut bench, options)?;
    if options.dtype.as_deref().is_none_or(|dtype| dtype == "bf16") {
        fused::sweep(&mut bench)?;
        small::sweep(&mut bench)?;
    }
    eprintln!();
    if options.peers {
        let scratch = options.json.with_file_name("peers");
        match peers::measure(&bench.records, &options.python, &scratch) {
            Ok((records, failures)) => {
                println!("peers: {} figures, {} not measured", records.len(), failures.len());
                failures.iter().for_each(|failure| println!("  not measured: {failure}"));
                bench.records.extend(records);
            }
            Err(why) => println!("{why}; rill's figures only"),
        }
    }
    write(&options.json, &report::to_json(&bench.records)?)?;
    report_records(&bench.records, &device, options)
}

/// Every family's sweep in dtype `T`, unless `--dtype` names another.
fn sweep_dtype<T: rill::Element>(bench: &mut Bench, options: &Options) -> rill::Result<()> {
    if options.dtype.as_ref().is_some_and(|d| d != T::DTYPE.name()) {
        return Ok(());
    }
    elementwise::sweep::<T>(bench)?;
    softmax::sweep::<T>(bench)?;
    norm::sweep::<T>(bench)?;
    norm_ladder::sweep::<T>(bench)?;
    batch_norm::sweep::<T>(bench)
}

/// The plots, the PERF.md section and the table of `records`.
fn report_records(records: &[report::Record], device: &str, options: &Options) -> Result<(), Box<dyn Error>> {
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
    for report::Record { op, dtype, shape, path, micros, gbps, of_copy, implementation } in records {
        let (shape, percent) = (format!("{shape:?}"), 100.0 * of_copy);
        // A peer's row names the peer where rill's names its path.
        let path = if implementation == report::RILL { path } else { implementation };
        println!("{op:<31} {dtype:<5} {shape:>16} {micros:>10.2} {gbps:>9.1} {percent:>6.1}%  {path}");
    }
    if let Some(note) = norm_ladder::footnote(records) {
        println!("{note}");
    }
    Ok(())
}

fn write(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        Options::try_parse_from(std::iter::once("rill-bench").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_is_well_formed() {
        Options::command().debug_assert();
    }

    #[test]
    fn takes_every_flag() {
        let args = [
            "--quick",
            "--profile",
            "--filter",
            "soft",
            "--dtype",
            "bf16",
            "--cols",
            "768, 1024",
            "--rows",
            "4096",
            "--bench",
        ];
        let options = parse(&args).unwrap();
        assert!(options.quick && options.profile && !options.peers);
        assert_eq!(options.python, "python3");
        assert_eq!((options.filter, options.dtype.as_deref()), (Some(vec!["soft".to_string()]), Some("bf16")));
        assert_eq!((options.cols, options.rows), (Some(vec![768, 1024]), Some(4096)));
        assert_eq!(
            (options.json.to_str(), options.device.as_str()),
            (Some("target/bench/bench.json"), "an unnamed GPU")
        );
        let args = ["--from-json", "r.json", "--device", "H100", "--json", "j", "--plot-dir", "p", "--perf", "m"];
        let options = parse(&args).unwrap();
        assert_eq!((options.from_json.unwrap().to_str(), options.device.as_str()), (Some("r.json"), "H100"));
        assert_eq!((options.json.to_str(), options.plot_dir.unwrap().to_str()), (Some("j"), Some("p")));
        assert_eq!(options.perf.unwrap().to_str(), Some("m"));
        assert_eq!(parse(&["--dtype", "f32", "--dtype", "f16"]).unwrap().dtype.as_deref(), Some("f16"));
        assert_eq!(parse(&["--filter", "softmax,rms_norm"]).unwrap().filter.unwrap(), ["softmax", "rms_norm"]);
        let options = parse(&["--peers", "--python", "/opt/py/bin/python3"]).unwrap();
        assert!(options.peers);
        assert_eq!(options.python, "/opt/py/bin/python3");
        assert_eq!(parse(&["--cols", "768", "--cols", "1024,2048"]).unwrap().cols, Some(vec![1024, 2048]));
    }

    #[test]
    fn rejects_bad_arguments_with_exit_status_2() {
        for args in [&["--dtype", "f64"][..], &["--cols", "768,x"], &["--filter"], &["--frobnicate"], &["stray"]] {
            let err = parse(args).err().unwrap_or_else(|| panic!("{args:?} was accepted"));
            assert_eq!(err.exit_code(), 2, "{args:?}: {err}");
        }
    }
}
