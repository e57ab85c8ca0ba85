//! Launches counted per kernel, for tests that must show which kernels a run reached (the
//! compute-sanitizer run of `cargo xtask sanitize` has to reach every one). Off unless a
//! test turns it on: a launch then pays one relaxed load.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

/// Kernels launched, and kernels plan-only calls chose (`Softmax::plan_only`,
/// `Norm::plan_only`: what they would have launched), each by PTX symbol with its count.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaunchCounts {
    pub launched: BTreeMap<&'static str, u64>,
    pub planned: BTreeMap<&'static str, u64>,
}

impl LaunchCounts {
    const NONE: LaunchCounts = LaunchCounts { launched: BTreeMap::new(), planned: BTreeMap::new() };

    /// What was counted after `earlier`, a snapshot of the same counting: the kernels whose
    /// count grew, with the growth.
    pub fn since(&self, earlier: &LaunchCounts) -> LaunchCounts {
        let grown = |now: &BTreeMap<&'static str, u64>, then: &BTreeMap<&'static str, u64>| {
            now.iter()
                .map(|(&symbol, &count)| (symbol, count.saturating_sub(then.get(symbol).copied().unwrap_or(0))))
                .filter(|&(_, added)| added > 0)
                .collect()
        };
        LaunchCounts {
            launched: grown(&self.launched, &earlier.launched),
            planned: grown(&self.planned, &earlier.planned),
        }
    }
}

/// Which tally a launch or plan goes to.
#[derive(Clone, Copy)]
pub(crate) enum Tally {
    Launched,
    Planned,
}

static COUNTING: AtomicBool = AtomicBool::new(false);
static COUNTS: Mutex<LaunchCounts> = Mutex::new(LaunchCounts::NONE);

/// Turns counting on, from zero, or off (the counts stay until it is turned on again).
/// Counts are process-wide: every GPU and thread adds to them.
pub fn count_launches(on: bool) {
    let mut counts = COUNTS.lock().unwrap_or_else(PoisonError::into_inner);
    if on {
        *counts = LaunchCounts::NONE;
    }
    COUNTING.store(on, Ordering::Relaxed);
}

/// The counts since counting was last turned on ([`count_launches`]); empty if it never was.
pub fn launch_counts() -> LaunchCounts {
    COUNTS.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// Adds one to `symbol`'s count in `tally`, while counting is on.
pub(crate) fn count(tally: Tally, symbol: &'static str) {
    if !COUNTING.load(Ordering::Relaxed) {
        return;
    }
    let mut counts = COUNTS.lock().unwrap_or_else(PoisonError::into_inner);
    let counts = match tally {
        Tally::Launched => &mut counts.launched,
        Tally::Planned => &mut counts.planned,
    };
    *counts.entry(symbol).or_default() += 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_keeps_what_grew() {
        let earlier =
            LaunchCounts { launched: BTreeMap::from([("a", 2), ("b", 1)]), planned: BTreeMap::from([("a", 1)]) };
        let now = LaunchCounts {
            launched: BTreeMap::from([("a", 5), ("b", 1), ("c", 1)]),
            planned: BTreeMap::from([("a", 1), ("d", 2)]),
        };
        let added = now.since(&earlier);
        assert_eq!(added.launched, BTreeMap::from([("a", 3), ("c", 1)]));
        assert_eq!(added.planned, BTreeMap::from([("d", 2)]));
        assert_eq!(now.since(&now), LaunchCounts::default());
    }

    #[test]
    fn counts_only_while_on() {
        // The only test that turns counting on: the counts are process-wide.
        count(Tally::Launched, "off");
        count_launches(true);
        count(Tally::Launched, "on");
        count(Tally::Launched, "on");
        count(Tally::Planned, "planned");
        count_launches(false);
        count(Tally::Launched, "on");
        let counts = launch_counts();
        assert_eq!(counts.launched, BTreeMap::from([("on", 2)]));
        assert_eq!(counts.planned, BTreeMap::from([("planned", 1)]));
    }
}
