//! `sanitize`: compute-sanitizer's four tools over the subset of the GPU suite that launches
//! every kernel rill exports.
//!
//! The whole suite (about 14,500 cases, 390 s on an H100) would take hours under the
//! sanitizers, so the suite first runs natively with `--cover FILE`: the planner tells which
//! kernel each row-wise case would launch before it runs, a case runs only for a kernel not
//! yet launched (small row counts come first), and the cheapest cases that launch every
//! kernel are written to FILE. Each tool then runs the suite over `--cases FILE`, counting
//! launches per kernel; its log ends with the kernels reached and those not.

use crate::{release_tests, workspace_root};
use clap::ValueEnum;
use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Options {
    /// The GPU suite's executable (`./gpu` in a `gpu-bundle` folder); without it, the suite is
    /// built from the workspace.
    #[arg(long)]
    gpu: Option<PathBuf>,
    /// The tools to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "memcheck,racecheck,synccheck,initcheck")]
    tools: Vec<Tool>,
    /// How many tools run at once (each its own process on the one GPU; 1 gives each tool's
    /// time alone).
    #[arg(long, default_value_t = 4)]
    jobs: usize,
    /// Where the case list and the logs go (default: `sanitize/` beside `--gpu`, else
    /// `target/sanitize/`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The compute-sanitizer executable.
    #[arg(long, default_value = "compute-sanitizer")]
    sanitizer: PathBuf,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Tool {
    Memcheck,
    Racecheck,
    Synccheck,
    Initcheck,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Memcheck => "memcheck",
            Tool::Racecheck => "racecheck",
            Tool::Synccheck => "synccheck",
            Tool::Initcheck => "initcheck",
        }
    }
}

/// The exit status compute-sanitizer gives where its tool found an error.
const SANITIZER_ERROR_EXIT: i32 = 9;

pub fn run(options: Options) -> Result<(), String> {
    if let Err(error) = Command::new(&options.sanitizer).arg("--version").output() {
        println!(
            "sanitize: skipped, cannot run {} ({error}); it comes with the CUDA toolkit",
            options.sanitizer.display()
        );
        return Ok(());
    }
    let (gpu, out) = match options.gpu {
        Some(gpu) => {
            let out = options.out.unwrap_or_else(|| gpu.parent().unwrap_or(Path::new(".")).join("sanitize"));
            (gpu, out)
        }
        None => {
            let root = workspace_root();
            let gpu = release_tests(&root, &["--test", "gpu"])?.pop().ok_or("cargo built no `gpu` test")?;
            (gpu, options.out.unwrap_or_else(|| root.join("target").join("sanitize")))
        }
    };
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let cases = out.join("cases.txt");

    let mut native = Command::new(&gpu);
    native.args(["--quick", "--cover"]).arg(&cases);
    let cover = logged(native, &out.join("cover.log"), None)?;
    if let Some(reason) = &cover.report.skipped {
        println!("sanitize: skipped, {reason}");
        return Ok(());
    }
    println!("{}", cover.line());
    if !cases.exists() {
        return Err(format!("the suite wrote no case list (see {})", out.join("cover.log").display()));
    }

    println!("sanitize: {} over {} (logs in {})", names(&options.tools), cases.display(), out.display());
    let mut runs = Vec::new();
    for batch in options.tools.chunks(options.jobs.max(1)) {
        let batch_runs: Vec<Result<Logged, String>> = std::thread::scope(|scope| {
            let handles: Vec<_> = batch
                .iter()
                .map(|&tool| {
                    let mut command = Command::new(&options.sanitizer);
                    command
                        .args(["--tool", tool.name(), "--error-exitcode", &SANITIZER_ERROR_EXIT.to_string()])
                        .arg(&gpu)
                        .args(["--quick", "--cases"])
                        .arg(&cases);
                    let log = out.join(format!("{}.log", tool.name()));
                    scope.spawn(move || logged(command, &log, Some(tool)))
                })
                .collect();
            handles.into_iter().map(|handle| handle.join().expect("a tool's thread panicked")).collect()
        });
        for (&tool, result) in batch.iter().zip(batch_runs) {
            runs.push((tool, result?));
        }
    }

    let mut clean = cover.problems().is_empty();
    let mut unreached = BTreeSet::new();
    for (_, run) in &runs {
        println!("{}", run.line());
        clean &= run.problems().is_empty();
        unreached.extend(&run.report.unreached);
    }
    for symbol in &unreached {
        println!("unreached: {symbol}");
    }
    if clean { Ok(()) } else { Err(format!("sanitize found problems; the logs are in {}", out.display())) }
}

fn names(tools: &[Tool]) -> String {
    tools.iter().map(|tool| tool.name()).collect::<Vec<_>>().join(", ")
}

/// A finished run of the suite, natively (`tool` `None`) or under a tool: what its log
/// said, its exit status and its wall time.
struct Logged {
    tool: Option<Tool>,
    report: Report,
    status: ExitStatus,
    seconds: f64,
    log: PathBuf,
}

/// Runs `command` (the suite, under `tool` if any) with its output (stdout and stderr) into
/// `log`.
fn logged(mut command: Command, log: &Path, tool: Option<Tool>) -> Result<Logged, String> {
    let file = File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = file.try_clone().map_err(|e| format!("{}: {e}", log.display()))?;
    let start = Instant::now();
    let status = command
        .stdout(Stdio::from(file))
        .stderr(Stdio::from(err))
        .status()
        .map_err(|e| format!("could not run {:?}: {e}", command.get_program()))?;
    let seconds = start.elapsed().as_secs_f64();
    let text = std::fs::read(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let report = Report::parse(&String::from_utf8_lossy(&text));
    Ok(Logged { tool, report, status, seconds, log: log.to_path_buf() })
}

impl Logged {
    /// What is wrong with the run: the report's problems, a tool's summary missing, and an
    /// exit status those do not explain.
    fn problems(&self) -> Vec<String> {
        let mut problems = self.report.problems();
        if self.tool.is_some() && self.report.sanitizer.is_none() {
            problems.push("no sanitizer summary".into());
        }
        if !self.status.success() && problems.is_empty() {
            problems.push(format!("exited with {}", self.status));
        }
        problems
    }

    /// Its summary line: the tool (or `native`), the verdict, errors, cases, kernels, time
    /// and, where it failed, its log.
    fn line(&self) -> String {
        let what = self.tool.map_or("native", Tool::name);
        let problems = self.problems();
        let verdict = if problems.is_empty() { "ok".to_string() } else { format!("FAILED ({})", problems.join("; ")) };
        let where_ = if problems.is_empty() { String::new() } else { format!(", log {}", self.log.display()) };
        format!("{what:<10} {verdict}: {}{where_}, {:.0} s", self.report.describe(), self.seconds)
    }
}

/// What a log of the suite says, its own lines and compute-sanitizer's: the lines
/// `gpu: P passed, F failed` and `gpu: skipped, REASON` (tests/gpu/harness.rs),
/// `cover: K of the M cases run, ...`, `kernels: R of N reached` and `unreached: SYMBOL`
/// (tests/src/coverage.rs), and the
/// sanitizer's `ERROR SUMMARY: N errors` or `RACECHECK SUMMARY: ... (N errors, M warnings)`.
#[derive(Debug, Default, PartialEq, Eq)]
struct Report {
    /// The sanitizer's errors (none where it ran no tool); `None` in a sanitizer run that
    /// ended before its summary.
    sanitizer: Option<Hazards>,
    /// Cases passed and failed; `None` where the suite ended before its summary.
    cases: Option<(u64, u64)>,
    /// Kernels reached, of those exported.
    kernels: Option<(u64, u64)>,
    unreached: Vec<String>,
    /// Cases the cover chose (under `--cover`).
    chosen: Option<u64>,
    /// Why the suite did not run (no CUDA device).
    skipped: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Hazards {
    errors: u64,
    warnings: u64,
}

impl Report {
    fn parse(log: &str) -> Report {
        let mut report = Report::default();
        for line in log.lines() {
            if let Some(summary) =
                line.split("ERROR SUMMARY:").nth(1).or_else(|| line.split("RACECHECK SUMMARY:").nth(1))
            {
                let found = Hazards {
                    errors: count_before(summary, "error").unwrap_or(0),
                    warnings: count_before(summary, "warning").unwrap_or(0),
                };
                let known = report.sanitizer.unwrap_or_default();
                report.sanitizer = Some(Hazards {
                    errors: known.errors.max(found.errors),
                    warnings: known.warnings.max(found.warnings),
                });
            } else if let Some(reason) = line.strip_prefix("gpu: skipped, ") {
                report.skipped = Some(reason.to_string());
            } else if let Some(counts) = line.strip_prefix("gpu: ") {
                if let (Some(passed), Some(failed)) = (count_before(counts, "passed"), count_before(counts, "failed")) {
                    report.cases = Some((passed, failed));
                }
            } else if let Some(kernels) = line.strip_prefix("kernels: ") {
                let numbers: Vec<u64> = kernels.split(' ').filter_map(|word| word.parse().ok()).collect();
                if let [reached, exported] = numbers[..] {
                    report.kernels = Some((reached, exported));
                }
            } else if let Some(cover) = line.strip_prefix("cover: ") {
                report.chosen = count_before(cover, "of");
            } else if let Some(symbol) = line.strip_prefix("unreached: ") {
                report.unreached.push(symbol.trim().to_string());
            }
        }
        report
    }

    /// Everything the run must not have: sanitizer errors, failed cases, unreached kernels,
    /// or a summary missing (the run ended early).
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(Hazards { errors, .. }) = self.sanitizer.filter(|hazards| hazards.errors > 0) {
            problems.push(format!("{errors} sanitizer errors"));
        }
        match self.cases {
            Some((_, failed)) if failed > 0 => problems.push(format!("{failed} cases failed")),
            Some(_) => {}
            None => problems.push("the suite ended before its summary".into()),
        }
        match self.kernels {
            Some((reached, exported)) if reached < exported => {
                problems.push(format!("{} kernels unreached", exported - reached))
            }
            Some(_) => {}
            None => problems.push("no kernel count".into()),
        }
        problems
    }

    /// Errors, cases and kernels, in a few words.
    fn describe(&self) -> String {
        let sanitizer = match self.sanitizer {
            Some(Hazards { errors, warnings: 0 }) => format!("{errors} errors, "),
            Some(Hazards { errors, warnings }) => format!("{errors} errors, {warnings} warnings, "),
            None => String::new(),
        };
        let cases = self
            .cases
            .map_or("no case count".into(), |(passed, failed)| format!("{} cases ({failed} failed)", passed + failed));
        let kernels = self
            .kernels
            .map_or(String::new(), |(reached, exported)| format!(", {reached} of {exported} kernels reached"));
        let chosen = self.chosen.map_or(String::new(), |chosen| format!(", {chosen} cases chosen"));
        format!("{sanitizer}{cases}{kernels}{chosen}")
    }
}

/// The number just before the first word of `text` that starts with `word`.
fn count_before(text: &str, word: &str) -> Option<u64> {
    let words: Vec<&str> = text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).collect();
    let at = words.iter().position(|w| w.starts_with(word))?;
    words.get(at.checked_sub(1)?)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLEAN_RACECHECK: &str = "\
========= COMPUTE-SANITIZER
gpu: NVIDIA H100 80GB HBM3 (sm_90), seed 7
launches: 2 rill_relu_f32_f32
launches: 1 rill_softmax_forward_warp8_f32_p4
kernels: 2 of 2 reached
gpu: 701 passed, 0 failed
========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)
";

    #[test]
    fn a_clean_run_has_no_problems() {
        let report = Report::parse(CLEAN_RACECHECK);
        assert_eq!(
            report,
            Report {
                sanitizer: Some(Hazards::default()),
                cases: Some((701, 0)),
                kernels: Some((2, 2)),
                unreached: Vec::new(),
                chosen: None,
                skipped: None,
            }
        );
        assert!(report.problems().is_empty());
        assert_eq!(report.describe(), "0 errors, 701 cases (0 failed), 2 of 2 kernels reached");
    }

    #[test]
    fn errors_failures_and_unreached_kernels_are_problems() {
        let log = "\
========= Invalid __global__ read of size 16 bytes
launches: 0 rill_softmax_forward_cluster_f32_p1
kernels: 805 of 806 reached
unreached: rill_softmax_forward_cluster_f32_p1
FAILED softmax/softmax/f32/[1, 33]/auto: max relative error
gpu: 700 passed, 1 failed
========= ERROR SUMMARY: 1 error
";
        let report = Report::parse(log);
        assert_eq!(report.sanitizer, Some(Hazards { errors: 1, warnings: 0 }));
        assert_eq!(report.unreached, ["rill_softmax_forward_cluster_f32_p1"]);
        assert_eq!(report.problems(), ["1 sanitizer errors", "1 cases failed", "1 kernels unreached"]);
    }

    #[test]
    fn racecheck_warnings_are_counted_but_pass() {
        let report = Report::parse(&CLEAN_RACECHECK.replace("(0 errors, 0 warnings)", "(0 errors, 3 warnings)"));
        assert_eq!(report.sanitizer, Some(Hazards { errors: 0, warnings: 3 }));
        assert!(report.problems().is_empty());
        assert!(report.describe().starts_with("0 errors, 3 warnings, "));
    }

    #[test]
    fn the_native_run_tells_the_cases_chosen() {
        let log = "kernels: 2 of 2 reached\ncover: 734 of the 2950 cases run, in sanitize/cases.txt\ngpu: 2950 passed, 0 failed\n";
        let report = Report::parse(log);
        assert_eq!((report.chosen, report.sanitizer), (Some(734), None));
        assert_eq!(report.describe(), "2950 cases (0 failed), 2 of 2 kernels reached, 734 cases chosen");
    }

    #[test]
    fn a_run_cut_short_or_skipped_says_so() {
        let cut = Report::parse("gpu: NVIDIA H100 (sm_90), seed 1\n========= Error: process didn't terminate\n");
        assert_eq!(cut.problems(), ["the suite ended before its summary", "no kernel count"]);
        let skipped = Report::parse("gpu: skipped, no CUDA device (CUDA_ERROR_NO_DEVICE)\n");
        assert_eq!(skipped.skipped.as_deref(), Some("no CUDA device (CUDA_ERROR_NO_DEVICE)"));
    }

    #[test]
    fn counts_are_the_numbers_before_their_words() {
        assert_eq!(count_before(" 0 hazards displayed (2 errors, 5 warnings)", "error"), Some(2));
        assert_eq!(count_before(" 0 hazards displayed (2 errors, 5 warnings)", "warning"), Some(5));
        assert_eq!(count_before(" 12 errors", "error"), Some(12));
        assert_eq!(count_before("errors", "error"), None);
    }

    #[test]
    fn the_command_line_takes_a_subset_of_tools() {
        use clap::Parser;
        let task =
            crate::Task::try_parse_from(["xtask", "sanitize", "--gpu", "./gpu", "--tools", "memcheck,initcheck"]);
        let Ok(crate::Task::Sanitize(options)) = task else { panic!("sanitize did not parse") };
        assert_eq!(options.tools, [Tool::Memcheck, Tool::Initcheck]);
        assert_eq!(options.gpu.as_deref(), Some(Path::new("./gpu")));
        let bench = crate::Task::try_parse_from(["xtask", "bench", "--quick", "--help"]);
        assert!(matches!(bench, Ok(crate::Task::Bench { args }) if args == ["--quick", "--help"]));
    }
}
