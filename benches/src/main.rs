//! `rill-bench`: effective bandwidth of every op on main against the device-to-device copy
//! measured in the same process, and a profile of a transformer block's ops.
//!
//! ```text
//! rill-bench [--quick] [--filter TEXT,..] [--dtype f32|f16|bf16] [--cols W,W,..] [--rows N] [--peers [--python PATH]] [--json PATH] [--plot-dir DIR] [--perf PATH] [--profile]
//! rill-bench --from-json PATH [--from-json PATH ..] [--device TEXT] [--plot-dir DIR] [--perf PATH]
//! rill-bench --tune PATH [--filter CLASS,..] [--dtype f32|bf16]
//! rill-bench --compare BASE.json NEW.json
//! rill-bench --first-use
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
//!   stderr, the run's record file (`--json`, default target/bench/bench.json: a header with
//!   the date, commit, GPU, driver and peers' versions, then the records), one SVG plot per
//!   op (`--plot-dir`), and the report spliced into a Markdown file between
//!   `<!-- bench:begin -->` and `<!-- bench:end -->` (`--perf`, e.g. docs/PERF.md);
//! - `--peers`: after rill's sweep, the same ops, dtypes and shapes timed for PyTorch eager
//!   and torch.compile, and Liger and QuACK where installed (`benches/peers/rows.py`, run by
//!   `--python`, default python3), merged into the table, the record file, the plots (a line
//!   per implementation) and the report (each row's best peer and rill's ratio to it);
//!   without python3 or torch one line says so and rill's figures stand alone;
//! - `--tune`: the GPU's tuning table instead of the sweep (see `tune.rs`); `--compare`: one
//!   recorded run against another, per op (see `compare.rs`); `--first-use`: how long each op
//!   family's first call takes in a new process (see `first_use.rs`);
//! - `--profile`: the profile table instead of the sweep; `--from-json`: the report of
//!   recorded runs, without measuring (no GPU needed): a section per record file, in the
//!   order given (one GPU's runs, the newest figure of each op, dtype and shape), `--device`
//!   naming the GPU of runs recorded without a header.
//!
//! The run's commit is compiled in by the build script (`RILL_COMMIT` where the build sets
//! it, else `git describe --always --dirty` of the checkout it was built in); the driver's
//! release is read from `/proc/driver/nvidia/version` where the system
//! has it.
//!
//! Effective bandwidth counts each input read once and each output written once. Each
//! figure is the median of 15 batches timed with CUDA events, after warm-up, cycling
//! through buffer sets four times the L2 size. Without a GPU it prints "no CUDA device"
//! and exits 0; bad arguments exit 2.

mod batch_norm;
mod compare;
mod elementwise;
mod first_use;
mod fused;
mod measure;
mod norm;
mod norm_ladder;
mod peers;
mod profile;
mod report;
mod small;
mod softmax;
mod tune;

use clap::Parser;
use half::{bf16, f16};
use measure::Bench;
use rill::Gpu;
use rill::softmax::PathKind;
use std::collections::BTreeMap;
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
    /// Where the run's record file is written.
    #[arg(long, value_name = "PATH", default_value = "target/bench/bench.json")]
    json: PathBuf,
    /// Where one SVG plot per op is written (with several record files, a directory each).
    #[arg(long, value_name = "DIR")]
    plot_dir: Option<PathBuf>,
    /// A Markdown file whose part between the bench markers gets the report.
    #[arg(long, value_name = "PATH")]
    perf: Option<PathBuf>,
    /// Report the runs recorded in PATH instead of measuring (no GPU needed); each file given
    /// is a section of the report, in the order given.
    #[arg(long, value_name = "PATH", action = clap::ArgAction::Append)]
    from_json: Vec<PathBuf>,
    /// The GPU of recorded runs whose header names none.
    #[arg(long, value_name = "TEXT")]
    device: Option<String>,
    /// Compare two recorded runs (BASE, then NEW) instead of measuring: per op the
    /// distribution of new / base bandwidth, and the shapes slower by more than 2%.
    #[arg(long, num_args = 2, value_names = ["BASE", "NEW"])]
    compare: Option<Vec<PathBuf>>,
    /// Tune instead of the sweep: time every plan the knobs give each bucket of row calls
    /// and write the GPU's tuning table to PATH (`--filter` picks classes, `--dtype` one of
    /// f32 and bf16).
    #[arg(long, value_name = "PATH")]
    tune: Option<PathBuf>,
    /// Time each op family's first call from `Gpu::new` instead of the sweep (its module's
    /// load; `CUDA_CACHE_DISABLE=1` for an empty JIT cache).
    #[arg(long)]
    first_use: bool,
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
    let result = if let Some(paths) = &options.compare {
        compare_runs(paths)
    } else if options.first_use {
        first_use::run()
    } else if options.from_json.is_empty() {
        match Gpu::new(0) {
            Ok(gpu) => run(gpu, &options),
            Err(error) => return println!("no CUDA device ({error}): nothing measured"),
        }
    } else {
        regenerate(&options)
    };
    if let Err(error) = result {
        eprintln!("error: {error}");
        std::process::exit(1);
    }
}

/// The report of the runs recorded in `--from-json`'s files, a section each.
fn regenerate(options: &Options) -> Result<(), Box<dyn Error>> {
    let mut sections = Vec::new();
    for path in &options.from_json {
        let mut runs = std::fs::read_to_string(path)
            .map_err(Box::<dyn Error>::from)
            .and_then(|json| Ok(report::parse(&json)?))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let device = options.device.as_deref().unwrap_or("an unnamed GPU");
        for header in runs.iter_mut().map(|run| &mut run.header).filter(|header| header.gpu.is_empty()) {
            header.gpu = device.to_string();
        }
        sections.push(report::Section::new(&stem(path), runs));
    }
    report_sections(&sections, options)
}

/// `--compare`'s text: the second record file's runs against the first's.
fn compare_runs(paths: &[PathBuf]) -> Result<(), Box<dyn Error>> {
    let section = |path: &PathBuf| -> Result<report::Section, Box<dyn Error>> {
        let json = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let runs = report::parse(&json).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(report::Section::new(&stem(path), runs))
    };
    let (base, new) = (section(&paths[0])?, section(&paths[1])?);
    println!("{} against {}", new.title(), base.title());
    print!("{}", compare::compare(&base, &new));
    Ok(())
}

/// A record file's name without its directory and extension: its section's name.
fn stem(path: &Path) -> String {
    path.file_stem().map_or_else(|| path.display().to_string(), |stem| stem.to_string_lossy().into_owned())
}

fn run(gpu: Gpu, options: &Options) -> Result<(), Box<dyn Error>> {
    let info = gpu.info().clone();
    let (major, minor) = info.driver_api;
    let release = std::fs::read_to_string("/proc/driver/nvidia/version").ok().and_then(|text| driver_release(&text));
    let mut header = report::Header {
        date: report::utc_date(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs()),
        commit: commit(),
        gpu: info.name.clone(),
        device: format!(
            "{} SMs, {} MB L2, DRAM {:.2} TB/s peak",
            info.multiprocessors,
            info.l2_bytes >> 20,
            info.dram_bytes_per_second as f64 * 1e-12
        ),
        driver: match release {
            Some(release) => format!("{release}, CUDA {major}.{minor}"),
            None => format!("CUDA {major}.{minor}"),
        },
        ..report::Header::default()
    };
    println!("device: {} ({}; driver {}); commit {}", header.gpu, header.device, header.driver, header.commit);
    let mut bench = Bench::new(gpu, options.quick, options.filter.clone(), options.cols.clone())?;
    bench.force = options.path;
    bench.rows = options.rows;
    if options.profile {
        profile::run(&mut bench)?;
        return Ok(());
    }
    if let Some(path) = &options.tune {
        let table = tune::run(&mut bench, options.dtype.as_deref(), path)?;
        println!("tuning table: {} entries written to {}", table.entries.len(), path.display());
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
        // rows.py writes the peers' versions beside its times: a file left from an earlier
        // run must not pass for this one's.
        let versions = scratch.join("versions.json");
        let _ = std::fs::remove_file(&versions);
        match peers::measure(&bench.records, &options.python, &scratch) {
            Ok((records, failures)) => {
                println!("peers: {} figures, {} not measured", records.len(), failures.len());
                failures.iter().for_each(|failure| println!("  not measured: {failure}"));
                bench.records.extend(records);
                header.peers = std::fs::read_to_string(&versions)
                    .ok()
                    .and_then(|json| serde_json::from_str::<BTreeMap<String, String>>(&json).ok())
                    .unwrap_or_default();
            }
            Err(why) => println!("{why}; rill's figures only"),
        }
    }
    let run = report::Run { header, records: std::mem::take(&mut bench.records) };
    write(&options.json, &report::to_json(std::slice::from_ref(&run))?)?;
    report_sections(&[report::Section::new(&stem(&options.json), vec![run])], options)
}

/// The build's commit, compiled in by the build script (`build.rs`): a bundle may run in
/// another checkout, or in none.
fn commit() -> String {
    env!("RILL_COMMIT").trim().to_string()
}

/// The NVIDIA kernel module's release in the text of `/proc/driver/nvidia/version`
/// ("580.159.04"): the first word of its NVRM line made of digits and dots, a dot among them.
fn driver_release(text: &str) -> Option<String> {
    let line = text.lines().find(|line| line.starts_with("NVRM"))?;
    let is_release = |word: &&str| {
        word.contains('.')
            && word.bytes().any(|b| b.is_ascii_digit())
            && word.bytes().all(|b| b.is_ascii_digit() || b == b'.')
    };
    line.split_whitespace().find(is_release).map(str::to_string)
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

/// The plots, the report in `--perf` and the table of each section.
fn report_sections(sections: &[report::Section], options: &Options) -> Result<(), Box<dyn Error>> {
    if let Some(dir) = &options.plot_dir {
        for section in sections {
            let dir = if sections.len() > 1 { dir.join(&section.name) } else { dir.clone() };
            for (name, svg) in report::plots(&section.records, &section.title())? {
                write(&dir.join(name), &svg)?;
            }
        }
    }
    if let Some(perf) = &options.perf {
        let doc = std::fs::read_to_string(perf).unwrap_or_default();
        let command = command_line(std::env::args().skip(1));
        write(perf, &report::splice(&doc, &report::markdown(sections, &command)))?;
    }

    for section in sections {
        println!("\n{}", section.title());
        println!("{:<31} {:<5} {:>16} {:>10} {:>9} {:>7}  path", "op", "dtype", "shape", "time(us)", "GB/s", "%copy");
        for report::Record { op, dtype, shape, path, micros, gbps, of_copy, implementation } in &section.records {
            let (shape, percent) = (format!("{shape:?}"), 100.0 * of_copy);
            // A peer's row names the peer where rill's names its path.
            let path = if implementation == report::RILL { path } else { implementation };
            println!("{op:<31} {dtype:<5} {shape:>16} {micros:>10.2} {gbps:>9.1} {percent:>6.1}%  {path}");
        }
        if let Some(note) = norm_ladder::footnote(&section.records) {
            println!("{note}");
        }
    }
    Ok(())
}

/// `rill-bench` and `args` as a reader would type them, an argument in single quotes where it
/// is empty or holds a space or a quote.
fn command_line(args: impl IntoIterator<Item = String>) -> String {
    let quoted = args.into_iter().map(|arg| {
        let plain = !arg.is_empty() && !arg.contains([' ', '\t', '\'', '"', '`']);
        if plain { arg } else { format!("'{}'", arg.replace('\'', r"'\''")) }
    });
    std::iter::once("rill-bench".to_string()).chain(quoted).collect::<Vec<_>>().join(" ")
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
        assert_eq!((options.json.to_str(), options.device), (Some("target/bench/bench.json"), None));
        assert!(options.from_json.is_empty());
        let args = ["--from-json", "r.json", "--device", "H100", "--json", "j", "--plot-dir", "p", "--perf", "m"];
        let options = parse(&args).unwrap();
        assert_eq!((options.from_json, options.device.as_deref()), (vec![PathBuf::from("r.json")], Some("H100")));
        assert_eq!((options.json.to_str(), options.plot_dir.unwrap().to_str()), (Some("j"), Some("p")));
        assert_eq!(options.perf.unwrap().to_str(), Some("m"));
        assert_eq!(parse(&["--dtype", "f32", "--dtype", "f16"]).unwrap().dtype.as_deref(), Some("f16"));
        assert_eq!(parse(&["--filter", "softmax,rms_norm"]).unwrap().filter.unwrap(), ["softmax", "rms_norm"]);
        let options = parse(&["--peers", "--python", "/opt/py/bin/python3"]).unwrap();
        assert!(options.peers);
        assert_eq!(options.python, "/opt/py/bin/python3");
        assert_eq!(parse(&["--cols", "768", "--cols", "1024,2048"]).unwrap().cols, Some(vec![1024, 2048]));
    }

    /// Each `--from-json` is a section, in the order given; a comma is part of a path.
    #[test]
    fn from_json_may_be_given_several_times() {
        let options = parse(&["--from-json", "a.json", "--from-json", "b,c.json", "--perf", "P.md"]).unwrap();
        assert_eq!(options.from_json, [PathBuf::from("a.json"), PathBuf::from("b,c.json")]);
        assert_eq!(stem(&options.from_json[0]), "a");
        assert_eq!(stem(Path::new("docs/records/sweep-h100.json")), "sweep-h100");
    }

    #[test]
    fn rejects_bad_arguments_with_exit_status_2() {
        for args in [&["--dtype", "f64"][..], &["--cols", "768,x"], &["--filter"], &["--frobnicate"], &["stray"]] {
            let err = parse(args).err().unwrap_or_else(|| panic!("{args:?} was accepted"));
            assert_eq!(err.exit_code(), 2, "{args:?}: {err}");
        }
        assert_eq!(parse(&["--from-json"]).err().unwrap().exit_code(), 2);
    }

    #[test]
    fn the_driver_release_is_read_from_its_nvrm_line() {
        let proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Thu Oct 30 2025\n\
                           GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
        assert_eq!(driver_release(proprietary).as_deref(), Some("580.159.04"));
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build\n";
        assert_eq!(driver_release(open).as_deref(), Some("575.57.08"));
        assert_eq!(driver_release("GCC version: 12.2.0\n"), None, "no NVRM line");
        assert_eq!(driver_release("NVRM version: unknown . ..\n"), None, "dots alone are no release");
        assert_eq!(driver_release(""), None);
    }

    #[test]
    fn the_command_line_reads_back_as_typed() {
        let args = ["--from-json", "docs/records/sweep-h100.json", "--perf", "docs/PERF.md"].map(String::from);
        assert_eq!(command_line(args), "rill-bench --from-json docs/records/sweep-h100.json --perf docs/PERF.md");
        let odd = ["--device", "NVIDIA H100", "", "it's", "`x`"].map(String::from);
        assert_eq!(command_line(odd), r"rill-bench --device 'NVIDIA H100' '' 'it'\''s' '`x`'");
        assert_eq!(command_line(Vec::new()), "rill-bench");
    }

    /// The build script's commit: this checkout's where there is git; one line either way.
    #[test]
    fn the_commit_is_one_line() {
        let commit = commit();
        assert!(!commit.contains('\n'), "{commit:?}");
    }
}
