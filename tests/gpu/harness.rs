//! Case bookkeeping for the GPU suite: filtering, seeds, tolerances, the summary line, and
//! the subset that compute-sanitizer runs ([`Selection`]).

use rill::softmax::PathKind;
use rill::{Element, Gpu, Stream, Tensor, View, ViewMut};
use rill_tests::check::{max_relative_error, poison, tolerance};
use rill_tests::coverage::{Coverage, Run, cover, exported_kernels};
use rill_tests::paths::{Forced, Paths};
use rill_tests::random::{Domain, Rng, case_seed, run_seed};
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Instant;

pub struct Options {
    pub filter: Option<String>,
    /// Largest length to test (lower under `--quick`).
    pub max_len: usize,
    pub selection: Selection,
    /// `--shard K/N`: the `K`th of `N` parts of the cases, each case in one part by its
    /// name ([`Options::keeps`]), so that a run too long for one sitting (the whole suite
    /// takes about ten minutes on an H100) can be split into runs of a part each.
    pub shard: Option<(u64, u64)>,
}

/// Which of the filter's cases run. Under compute-sanitizer the whole suite would take
/// hours, so `cargo xtask sanitize` first runs `--cover FILE` natively, then each tool over
/// `--cases FILE`: several hundred small cases that still launch every kernel.
pub enum Selection {
    /// Every case.
    All,
    /// The row-wise cases on every path that plans a kernel no case has launched yet (the
    /// planner answers before anything runs; small row counts come first in every table),
    /// and all the others; at the end, the cheapest of them that launch every kernel any did
    /// ([`cover`]) are written to the file, one name a line.
    Cover(PathBuf),
    /// The cases the file names (row-wise cases on every path the planner takes, as under
    /// `Cover`).
    Cases(HashSet<String>),
}

impl Options {
    /// The options from the command line: `[FILTER] [--quick] [--shard K/N] [--cover FILE |
    /// --cases FILE]`; exits with a line saying why where `--cases`' file cannot be read or
    /// the shard is not `K/N` with `K < N`.
    pub fn from_args() -> Options {
        let mut options = Options { filter: None, max_len: usize::MAX, selection: Selection::All, shard: None };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => options.max_len = 1 << 20,
                "--cover" | "--cases" => {
                    let Some(file) = args.next() else { exit_with(&format!("{arg} needs a file")) };
                    options.selection = if arg == "--cover" {
                        Selection::Cover(file.into())
                    } else {
                        let names = std::fs::read_to_string(&file)
                            .unwrap_or_else(|error| exit_with(&format!("--cases {file}: {error}")));
                        Selection::Cases(names.lines().map(str::to_string).collect())
                    };
                }
                "--shard" => {
                    let part = args.next().unwrap_or_default();
                    options.shard = Some(parse_shard(&part).unwrap_or_else(|| {
                        exit_with(&format!(
                            "--shard takes K/N with K < N (0/2 and 1/2 split the cases in two), not `{part}`"
                        ))
                    }));
                }
                // Flags cargo's test runner passes to every test binary.
                flag if flag.starts_with('-') => {}
                filter => options.filter = Some(filter.to_string()),
            }
        }
        options
    }

    /// Whether the run is one of the sanitizer's selections: it asks every path of each
    /// row-wise case and ends with the kernels it reached.
    pub fn sanitizer_selection(&self) -> bool {
        !matches!(self.selection, Selection::All)
    }

    /// Whether the filter and the shard keep the case `name`. A case's shard is a hash of
    /// its name alone (the high bits of FNV-1a, whose low bits follow the bytes' parities),
    /// so the parts of one run are disjoint and together the whole, whatever the seed.
    fn keeps(&self, name: &str) -> bool {
        self.filter.as_ref().is_none_or(|f| name.contains(f.as_str()))
            && self.shard.is_none_or(|(part, parts)| (case_seed(0, name) >> 32) % parts == part)
    }
}

/// `K/N` with `K < N`.
fn parse_shard(part: &str) -> Option<(u64, u64)> {
    let (part, parts) = part.split_once('/')?;
    let (part, parts) = (part.parse().ok()?, parts.parse().ok()?);
    (part < parts).then_some((part, parts))
}

fn exit_with(message: &str) -> ! {
    println!("gpu: {message}");
    std::process::exit(2);
}

pub struct Suite {
    pub gpu: Gpu,
    pub stream: Stream,
    pub options: Options,
    seed: u64,
    passed: usize,
    failed: Vec<String>,
    /// Under [`Selection::Cover`]: each case run, with its cost and the kernels it launched.
    runs: Vec<Run>,
    /// Under [`Selection::Cover`]: the kernels launched, or planned by a path kept to run.
    claimed: HashSet<&'static str>,
}

/// What a case measured: its max relative error, with the worst element.
pub struct Measured {
    pub error: f64,
    pub detail: String,
}

impl Suite {
    pub fn new(gpu: Gpu, options: Options) -> rill::Result<Suite> {
        let stream = gpu.stream()?;
        let seed = run_seed();
        println!(
            "gpu: {} (sm_{}{}), seed {seed}",
            gpu.info().name,
            gpu.info().compute_capability.0,
            gpu.info().compute_capability.1
        );
        // Always counted: the fuzz checks that a refused call launched nothing, and the
        // sanitizer's selections report the kernels they reached.
        rill::count_launches(true);
        Ok(Suite {
            gpu,
            stream,
            options,
            seed,
            passed: 0,
            failed: Vec::new(),
            runs: Vec::new(),
            claimed: HashSet::new(),
        })
    }

    pub fn wants(&self, name: &str) -> bool {
        let listed = match &self.options.selection {
            Selection::Cases(names) => names.contains(name),
            _ => true,
        };
        listed && self.options.keeps(name)
    }

    /// Runs one case: `body` gets the case's rng and returns the measured error, which must
    /// stay under `limit`.
    pub fn case(&mut self, name: &str, limit: f64, body: impl FnOnce(&mut Self, &mut Rng) -> rill::Result<Measured>) {
        if !self.wants(name) {
            return;
        }
        let seed = case_seed(self.seed, name);
        let mut rng = Rng::new(seed);
        let before = self.covering().then(|| (rill::launch_counts(), Instant::now()));
        let outcome = body(self, &mut rng);
        if let Some((counted, start)) = before {
            let kernels: Vec<&'static str> = rill::launch_counts().since(&counted).launched.into_keys().collect();
            self.claimed.extend(&kernels);
            self.runs.push(Run { name: name.to_string(), cost: start.elapsed(), kernels });
        }
        match outcome {
            Ok(m) if m.error < limit => self.passed += 1,
            Ok(m) => self.fail(format!(
                "{name}: max relative error {:e} over {limit:e} ({}) [RILL_SEED={}]",
                m.error, m.detail, self.seed
            )),
            Err(error) => self.fail(format!("{name}: {error} [RILL_SEED={}]", self.seed)),
        }
    }

    /// Runs one case that must fail with `rill::Error::InvalidInput` or `Unsupported`.
    pub fn rejects(&mut self, name: &str, body: impl FnOnce(&mut Self) -> rill::Result<()>) {
        if !self.wants(name) {
            return;
        }
        match body(self) {
            Err(rill::Error::InvalidInput(_) | rill::Error::Unsupported(_)) => self.passed += 1,
            Err(other) => self.fail(format!("{name}: expected a bad-input error, got {other}")),
            Ok(()) => self.fail(format!("{name}: expected a bad-input error, got success")),
        }
    }

    /// The paths to run a row-wise case on, asked of the planner rather than restated: the
    /// dispatcher's choice (`None`) alone, or with the forced paths `forced` keeps of those
    /// the planner takes the call on ([`Paths::ask`]: `ask` makes the case's call plan-only
    /// on arrays of its shapes and offsets). `name` names the case on a path; where the
    /// filter keeps it on none, nothing is asked. An error other than a forced path's refusal
    /// fails the case on the dispatcher's path, and it runs on none.
    ///
    /// Under the sanitizer's selections every path the planner takes is a case, so that the
    /// tables' smallest row counts (listed first) reach every kernel; [`Selection::Cover`]
    /// keeps a path only where its kernel is one no case has launched or will launch.
    pub fn paths(
        &mut self,
        forced: Option<Forced>,
        name: impl Fn(Option<PathKind>) -> String,
        ask: impl FnOnce(&Self) -> rill::Result<Paths>,
    ) -> Vec<Option<PathKind>> {
        let forced = if self.options.sanitizer_selection() { Some(forced.unwrap_or(Forced::All)) } else { forced };
        let Some(forced) = forced else { return vec![None] };
        let mut every = std::iter::once(None).chain(PathKind::ALL.map(Some));
        if !every.any(|path| self.wants(&name(path))) {
            return Vec::new();
        }
        let paths = match ask(self) {
            Ok(paths) => paths,
            Err(error) => {
                self.fail(format!("{}: asking the planner for its paths: {error}", name(None)));
                return Vec::new();
            }
        };
        let runs = paths.runs(forced);
        if !self.covering() {
            return runs;
        }
        // A path the filter keeps runs where its kernel is new, or unknown.
        runs.into_iter()
            .filter(|&path| {
                self.wants(&name(path)) && paths.kernel(path).is_none_or(|kernel| self.claimed.insert(kernel))
            })
            .collect()
    }

    fn covering(&self) -> bool {
        matches!(self.options.selection, Selection::Cover(_))
    }

    fn fail(&mut self, message: String) {
        println!("FAILED {message}");
        self.failed.push(message);
    }

    /// Prints the summary line, after the kernels reached where launches are counted (and
    /// writes the cover under [`Selection::Cover`]); returns the exit code: 1 where a case
    /// failed, a kernel went unreached or the cover could not be written.
    pub fn finish(&self) -> i32 {
        let mut failed = !self.failed.is_empty();
        if self.options.sanitizer_selection() {
            let coverage = Coverage::of(&exported_kernels(), &rill::launch_counts().launched);
            print!("{coverage}");
            failed |= coverage.unreached().next().is_some();
        }
        if let Selection::Cover(file) = &self.options.selection {
            let chosen = cover(&self.runs);
            let names: String = chosen.iter().map(|run| format!("{}\n", run.name)).collect();
            match std::fs::write(file, names) {
                Ok(()) => {
                    println!("cover: {} of the {} cases run, in {}", chosen.len(), self.runs.len(), file.display())
                }
                Err(error) => {
                    println!("cover: could not write {}: {error}", file.display());
                    failed = true;
                }
            }
        }
        println!("gpu: {} passed, {} failed", self.passed, self.failed.len());
        i32::from(failed)
    }

    /// Values drawn from `domain`, rounded to `T` (so the reference sees what the GPU sees).
    pub fn random<T: Element>(rng: &mut Rng, domain: Domain, len: usize) -> Vec<T> {
        (0..len).map(|_| T::from_f64(domain.sample(rng))).collect()
    }

    /// A device copy of `data` starting `offset` elements into its allocation (offset 1
    /// makes a view less aligned than any pack).
    pub fn upload<T: Element>(&self, data: &[T], offset: usize) -> rill::Result<Tensor<T>> {
        let mut padded = vec![poison::<T>(); offset];
        padded.extend_from_slice(data);
        Tensor::from_slice(&self.gpu, &padded, &[padded.len()])
    }

    /// An output of `len` elements `offset` into its allocation, filled with poison.
    pub fn poisoned<T: Element>(&self, len: usize, offset: usize) -> rill::Result<Tensor<T>> {
        Tensor::from_slice(&self.gpu, &vec![poison::<T>(); len + offset], &[len + offset])
    }
}

/// `tensor` without its first `offset` elements, as a view of `shape`.
pub fn view_at<'a, T: Element>(tensor: &'a Tensor<T>, offset: usize, shape: &[usize]) -> rill::Result<View<'a, T>> {
    tensor.view().slice(offset..tensor.len())?.reshape(shape)
}

/// Mutable [`view_at`].
pub fn view_mut_at<'a, T: Element>(
    tensor: &'a mut Tensor<T>,
    offset: usize,
    shape: &[usize],
) -> rill::Result<ViewMut<'a, T>> {
    let len = tensor.len();
    tensor.view_mut().slice(offset..len)?.reshape(shape)
}

/// Compares `got` (the output without its offset) with `want`, in parallel for long outputs.
pub fn measure<T: Element>(got: &[T], want: &[f64]) -> Measured {
    match max_relative_error(got, want) {
        Some(w) => {
            Measured { error: w.error, detail: format!("element {}: got {:e}, want {:e}", w.index, w.got, w.want) }
        }
        None => Measured { error: 0.0, detail: "empty".into() },
    }
}

/// `f(i)` for every `i < len`, computed on all cores.
pub fn parallel_map(len: usize, f: impl Fn(usize) -> f64 + Sync) -> Vec<f64> {
    let mut out = vec![0.0; len];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = len.div_ceil(threads).max(1 << 14);
    std::thread::scope(|scope| {
        for (c, slice) in out.chunks_mut(chunk).enumerate() {
            let f = &f;
            scope.spawn(move || {
                for (j, v) in slice.iter_mut().enumerate() {
                    *v = f(c * chunk + j);
                }
            });
        }
    });
    out
}

pub fn tolerance_of<T: Element>() -> f64 {
    tolerance(T::DTYPE)
}
