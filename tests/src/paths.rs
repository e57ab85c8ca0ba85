//! Which paths the GPU suite runs a row-wise case on, asked of the planner through the
//! ops' plan-only calls (`Softmax::plan_only`, `Norm::plan_only`): the suite never restates
//! the dispatcher's ladder or its limits.

use rill::Error;
use rill::softmax::{PathKind, Plan};

/// What the planner answered about one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paths {
    /// The path the dispatcher chooses.
    pub dispatched: PathKind,
    /// Every path the planner takes the call on when forced, in [`PathKind::ALL`]'s order.
    pub forced: Vec<PathKind>,
    /// The kernel each answer chose, by path (`None`: the dispatcher's), where launches are
    /// counted ([`rill::count_launches`]); empty otherwise. The sanitizer's subset runs a
    /// path only for a kernel no case has launched yet.
    pub kernels: Vec<(Option<PathKind>, &'static str)>,
}

impl Paths {
    /// Asks `plan` (the call, plan-only, on the path given, or the dispatcher's for `None`)
    /// for the dispatcher's choice, then for each path forced. A forced path refused with
    /// [`Error::Unsupported`] does not take the call; any other error is returned.
    pub fn ask(mut plan: impl FnMut(Option<PathKind>) -> rill::Result<Plan>) -> rill::Result<Paths> {
        let mut kernels = Vec::new();
        let mut counted = rill::launch_counts();
        let mut answer = |path: Option<PathKind>| {
            let plan = plan(path);
            let now = rill::launch_counts();
            kernels.extend(now.since(&counted).planned.into_keys().map(|symbol| (path, symbol)));
            counted = now;
            plan
        };
        let dispatched = answer(None)?.kind();
        let mut forced = Vec::new();
        for path in PathKind::ALL {
            match answer(Some(path)) {
                Ok(_) => forced.push(path),
                Err(Error::Unsupported(_)) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(Paths { dispatched, forced, kernels })
    }

    /// The kernel the answer for `path` chose, where it is known.
    pub fn kernel(&self, path: Option<PathKind>) -> Option<&'static str> {
        self.kernels.iter().find(|&&(p, _)| p == path).map(|&(_, symbol)| symbol)
    }

    /// The dispatcher's choice (`None`), then the paths forced that `forced` keeps.
    pub fn runs(&self, forced: Forced) -> Vec<Option<PathKind>> {
        let kept = self.forced.iter().copied().filter(|&path| forced == Forced::All || path != self.dispatched);
        std::iter::once(None).chain(kept.map(Some)).collect()
    }
}

/// Which of the paths the planner takes forced a case runs on, after the dispatcher's choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forced {
    /// Every one, the dispatcher's own again.
    All,
    /// Every one but the dispatcher's own.
    Others,
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill::softmax::Path;

    fn plan(path: Path) -> rill::Result<Plan> {
        Ok(Plan { path, pack: 4, phased: false, grid: 1, ahead: 0, stages: 1 })
    }

    /// A planner that chooses the shared path and refuses the warp and cluster paths.
    fn wide_row(path: Option<PathKind>) -> rill::Result<Plan> {
        match path {
            None | Some(PathKind::Shared) => plan(Path::Shared { block: 256, shared_bytes: 16384 }),
            Some(PathKind::Uncached) => plan(Path::Uncached { block: 1024 }),
            Some(kind) => Err(Error::Unsupported(format!("{kind:?} does not take the row"))),
        }
    }

    #[test]
    fn forced_paths_are_those_the_planner_takes() {
        let paths = Paths::ask(wide_row).unwrap();
        let forced = vec![PathKind::Shared, PathKind::Uncached];
        assert_eq!(paths, Paths { dispatched: PathKind::Shared, forced, kernels: Vec::new() });
        assert_eq!(paths.runs(Forced::All), [None, Some(PathKind::Shared), Some(PathKind::Uncached)]);
        assert_eq!(paths.runs(Forced::Others), [None, Some(PathKind::Uncached)]);
    }

    #[test]
    fn errors_other_than_a_refusal_are_returned() {
        let driver = |path: Option<PathKind>| match path {
            Some(PathKind::Uncached) => Err(Error::Driver { call: "cuOccupancy", code: 1, message: "failed".into() }),
            path => wide_row(path),
        };
        assert!(matches!(Paths::ask(driver), Err(Error::Driver { .. })));
        let invalid = |_: Option<PathKind>| -> rill::Result<Plan> { Err(Error::InvalidInput("bad shape".into())) };
        assert!(matches!(Paths::ask(invalid), Err(Error::InvalidInput(_))));
    }
}
