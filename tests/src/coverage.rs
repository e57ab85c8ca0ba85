//! Which of rill's kernels a run of the GPU suite reached, and the cases that reach them
//! all: the subset `cargo xtask sanitize` runs under compute-sanitizer, where the whole
//! suite would take hours.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

/// Every kernel rill's embedded PTX modules export (each `.entry`), module by module; a
/// module this build does not embed exports none.
pub fn exported_kernels() -> Vec<&'static str> {
    rill::Module::ALL.into_iter().filter_map(rill::ptx).flat_map(entries).collect()
}

/// The entry points `ptx` declares, in its order.
pub fn entries(ptx: &str) -> impl Iterator<Item = &str> {
    ptx.match_indices(".entry ").map(move |(at, found)| {
        let name = &ptx[at + found.len()..];
        &name[..name.find(|c: char| c == '(' || c.is_whitespace()).unwrap_or(name.len())]
    })
}

/// How a run's launches cover the exported kernels. Its `Display` is the lines the suite
/// ends with, which `cargo xtask sanitize` reads: `launches: N SYMBOL` per kernel, then
/// `kernels: R of N reached` and `unreached: SYMBOL` per kernel no case launched.
#[derive(Debug, PartialEq, Eq)]
pub struct Coverage {
    /// Each exported kernel with its launches (0: unreached), in the modules' order.
    pub kernels: Vec<(&'static str, u64)>,
    /// Kernels launched that rill's modules do not export (users' fused kernels), with their
    /// launches: listed, never required.
    pub outside: Vec<(&'static str, u64)>,
}

impl Coverage {
    /// `exported` (the kernels to reach) against `launched` (launches by symbol).
    pub fn of(exported: &[&'static str], launched: &BTreeMap<&'static str, u64>) -> Coverage {
        let kernels = exported.iter().map(|&symbol| (symbol, launched.get(symbol).copied().unwrap_or(0))).collect();
        let outside =
            launched.iter().filter(|(symbol, _)| !exported.contains(symbol)).map(|(&symbol, &n)| (symbol, n)).collect();
        Coverage { kernels, outside }
    }

    /// The exported kernels no launch reached.
    pub fn unreached(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.kernels.iter().filter(|&&(_, launches)| launches == 0).map(|&(symbol, _)| symbol)
    }
}

impl fmt::Display for Coverage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (symbol, launches) in &self.kernels {
            writeln!(f, "launches: {launches} {symbol}")?;
        }
        for (symbol, launches) in &self.outside {
            writeln!(f, "launches: {launches} {symbol} (outside rill's modules)")?;
        }
        let unreached: Vec<&str> = self.unreached().collect();
        writeln!(f, "kernels: {} of {} reached", self.kernels.len() - unreached.len(), self.kernels.len())?;
        unreached.iter().try_for_each(|symbol| writeln!(f, "unreached: {symbol}"))
    }
}

/// One case as a cover weighs it: what it cost when run natively, the kernels it launched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    pub name: String,
    pub cost: Duration,
    pub kernels: Vec<&'static str>,
}

/// Cases of `runs` that together launch every kernel any of them did, cheap ones preferred:
/// cheapest first, each case that adds a kernel; then, dearest first, each chosen case whose
/// kernels the others chosen all launch too is dropped.
pub fn cover(runs: &[Run]) -> Vec<&Run> {
    let mut by_cost: Vec<&Run> = runs.iter().collect();
    by_cost.sort_by_key(|run| run.cost);
    let mut launching: HashMap<&str, usize> = HashMap::new();
    let mut chosen = Vec::new();
    for run in by_cost {
        if run.kernels.iter().any(|kernel| !launching.contains_key(kernel)) {
            run.kernels.iter().for_each(|kernel| *launching.entry(*kernel).or_default() += 1);
            chosen.push(run);
        }
    }
    let mut kept = vec![true; chosen.len()];
    for (run, keep) in chosen.iter().zip(&mut kept).rev() {
        if run.kernels.iter().all(|kernel| launching[kernel] > 1) {
            run.kernels.iter().for_each(|kernel| *launching.get_mut(kernel).expect("counted") -= 1);
            *keep = false;
        }
    }
    chosen.into_iter().zip(kept).filter_map(|(run, keep)| keep.then_some(run)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_the_declared_kernels() {
        let ptx = ".version 8.1\n.visible .entry rill_a_p4(\n\t.param .b64 p\n)\n{\n}\n\
                   .func helper()\n.visible .entry rill_b_p1(\n)\n";
        assert_eq!(entries(ptx).collect::<Vec<_>>(), ["rill_a_p4", "rill_b_p1"]);
    }

    #[test]
    fn every_embedded_module_exports_kernels() {
        let kernels = exported_kernels();
        assert!(kernels.iter().all(|symbol| symbol.starts_with("rill_")), "{kernels:?}");
        for module in rill::Module::ALL {
            let ptx = rill::ptx(module).expect("the tests embed every module");
            assert!(entries(ptx).count() > 0, "{}", module.name());
        }
    }

    #[test]
    fn coverage_lists_the_unreached_and_the_outsiders() {
        let launched = BTreeMap::from([("a", 3), ("fused", 1)]);
        let coverage = Coverage::of(&["a", "b"], &launched);
        assert_eq!(coverage.unreached().collect::<Vec<_>>(), ["b"]);
        assert_eq!(
            coverage.to_string(),
            "launches: 3 a\nlaunches: 0 b\nlaunches: 1 fused (outside rill's modules)\n\
             kernels: 1 of 2 reached\nunreached: b\n"
        );
    }

    fn run(name: &str, micros: u64, kernels: &[&'static str]) -> Run {
        Run { name: name.into(), cost: Duration::from_micros(micros), kernels: kernels.to_vec() }
    }

    fn names<'a>(runs: &[&'a Run]) -> Vec<&'a str> {
        runs.iter().map(|run| run.name.as_str()).collect()
    }

    #[test]
    fn cover_prefers_cheap_cases_and_drops_the_redundant() {
        let runs = [
            run("big", 900, &["a", "b", "c"]),
            run("small a", 10, &["a"]),
            run("small b", 20, &["b"]),
            run("again a", 5, &["a"]),
            run("nothing", 1, &[]),
        ];
        // Cheapest first: "again a", "small b", then "big" for c, which launches a and b too.
        assert_eq!(names(&cover(&runs)), ["big"]);
        let cheap = [run("big", 900, &["a", "b"]), run("small a", 10, &["a"]), run("small b", 20, &["b"])];
        assert_eq!(names(&cover(&cheap)), ["small a", "small b"]);
        assert!(cover(&[]).is_empty());
    }
}
