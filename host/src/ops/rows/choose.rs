//! The chooser: a row call's plan from the GPU's tuning table where it has an entry for the
//! call's bucket ([`super::tuning`]), its knobs fitted to the call's shape and the device's
//! limits; else, or where they do not fit, the fallback's ([`Fallback`]).

use super::dispatch::{
    self, BLOCK_SIZES, MAX_COLS, Occupancies, Path, Plan, Problem, STREAMING_BLOCK_SIZES, block_grid,
    cluster_shape_plan, fits_a_block, padded_shared_bytes, warp_tier_plan,
};
use super::tuning::{Bucket, Knobs, TuningTable};
use crate::DeviceInfo;
use rill_kernels_gpu::abi::{ROW_CACHE_STAGES, ROW_CLUSTER_SIZES, WARP_SIZE};
use rill_kernels_gpu::table::RowPath;

/// What plans a call its GPU's tuning table has no entry for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// The measured rules ([`dispatch::plan`]), until the checked-in tables cover the GPUs
    /// they were measured on.
    Rules,
    /// The ladder alone ([`dispatch::ladder_plan`]): `RILL_TUNING_TABLE=ladder`, to see
    /// what the tables and rules are worth.
    Ladder,
}

/// Whether a plan asks for rows ahead into L2, and who sizes the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ahead {
    None,
    /// A wave of the resident warps' rows, where the kernel holds the request
    /// ([`dispatch::wave_ahead`]): a table entry's `ahead`.
    Wave,
    /// As the rules decide ([`dispatch::rows_ahead`]).
    ByRules,
}

/// The plan for `problem`, and whether it asks for rows ahead (the engine sizes the request
/// once its kernel's occupancy is known): its table entry's knobs fitted to it, where the
/// table has an entry for its bucket and they fit; else `fallback`'s. A forced path and a
/// row too wide for any path are the rules' to plan or refuse.
pub fn plan(
    problem: &Problem,
    device: &DeviceInfo,
    occupancy: Occupancies<'_>,
    table: Option<&TuningTable>,
    fallback: Fallback,
) -> crate::Result<(Plan, Ahead)> {
    let free = problem.force.is_none() && problem.cols <= MAX_COLS;
    if free
        && let Some(knobs) = table.and_then(|table| table.knobs(&Bucket::of(problem)))
        && let Some((plan, ahead)) = fit(knobs, problem, device, occupancy)?
    {
        return Ok((plan, if ahead { Ahead::Wave } else { Ahead::None }));
    }
    Ok(match fallback {
        Fallback::Ladder if free => (dispatch::ladder_plan(problem, device, occupancy)?, Ahead::None),
        _ => (dispatch::plan(problem, device, occupancy)?, Ahead::ByRules),
    })
}

/// `knobs` fitted to `problem`: the plan they give where its launch fits the device and the
/// call's kernels, with whether it asks for the rows ahead; `None` where it does not (a
/// bucket's entry measured at another width of the bucket). Blocks larger than the kernels
/// launch with come down to the largest they do; a cluster whose slices do not fit a block
/// grows to the next size that does.
pub fn fit(
    knobs: Knobs,
    problem: &Problem,
    device: &DeviceInfo,
    occupancy: Occupancies<'_>,
) -> crate::Result<Option<(Plan, bool)>> {
    let most_threads = |block: u32| block.min(problem.block_limit.max(WARP_SIZE));
    Ok(match knobs {
        Knobs::Warp { elements, ahead } => {
            let tier = RowPath::WARP.into_iter().any(|path| path.warp_elements() == elements as usize);
            let holds = tier && problem.cols <= (WARP_SIZE * elements) as usize;
            holds.then(|| (warp_tier_plan(problem, elements, device), ahead))
        }
        Knobs::Shared { block, stages, most_blocks_an_sm } => {
            let block = most_threads(block);
            let staged = stages == 1 || (stages == ROW_CACHE_STAGES && problem.stages_rows());
            let bytes = problem.staged_block_bytes(problem.cols as u64, stages);
            if !staged || !fits_a_block(bytes, device) {
                return Ok(None);
            }
            let Some(shared_bytes) =
                padded_shared_bytes(bytes as u32, block, most_blocks_an_sm, device, occupancy.shared)?
            else {
                return Ok(None);
            };
            let plan =
                problem.block_plan(Path::Shared { block, shared_bytes }, block_grid(problem.rows, block, device));
            Some((Plan { stages, ..plan }, false))
        }
        Knobs::Cluster { cluster, block } => {
            let sizes = ROW_CLUSTER_SIZES.into_iter().filter(|&size| size >= cluster);
            let mut fitted = None;
            for size in sizes {
                fitted = cluster_shape_plan(problem, device, occupancy.cluster, size, most_threads(block))?;
                if fitted.is_some() {
                    break;
                }
            }
            fitted.map(|plan| (plan, false))
        }
        Knobs::Uncached { block } => {
            let block = most_threads(block);
            // Blocks below the block sizes only for rows read once (each block's row in flight).
            let streaming = STREAMING_BLOCK_SIZES.into_iter().filter(|_| problem.spec.reads_once);
            let mut sizes = BLOCK_SIZES.into_iter().chain(streaming);
            sizes.any(|size| size == block).then(|| {
                let plan = problem.block_plan(Path::Uncached { block }, block_grid(problem.rows, block, device));
                (plan, false)
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::dispatch::tests::{OCCUPANCY, problem, with};
    use super::super::dispatch::{PathKind, SHARED_ALLOCATION_BYTES};
    use super::*;
    use crate::launch::tests::h100;

    fn fitted(knobs: &str, problem: &Problem) -> Option<(Plan, bool)> {
        fit(knobs.parse().unwrap(), problem, &h100(), OCCUPANCY).unwrap()
    }

    #[test]
    fn knobs_fit_where_their_launch_does_and_not_elsewhere() {
        // The warp tier holds the row or does not fit.
        let (plan, ahead) = fitted("warp 32 ahead", &problem(49152, 1024, 8)).unwrap();
        assert_eq!((plan.path, ahead), (Path::Warp { width: 32, elements: 32 }, true));
        assert_eq!(fitted("warp 16", &problem(49152, 1024, 8)), None);
        assert_eq!(fitted("warp 12", &problem(49152, 64, 8)), None);
        // Shared: the block, its stages where the op stages rows, its cap padded to.
        let (plan, _) = fitted("shared 256", &problem(49152, 4096, 4)).unwrap();
        assert_eq!((plan.path, plan.stages), (Path::Shared { block: 256, shared_bytes: 16384 }, 1));
        assert_eq!(fitted("shared 256 stages 2", &problem(49152, 4096, 4)), None);
        let gathering = with(problem(49152, 4096, 4), |s| s.column_sums = 1);
        let (plan, _) = fitted("shared 256 stages 2", &gathering).unwrap();
        assert_eq!(plan.stages, 2);
        let (capped, _) = fitted("shared 128 blocks<=4", &problem(49152, 4096, 4)).unwrap();
        assert_eq!((OCCUPANCY.shared)(128, capped.shared_bytes()).unwrap(), 4);
        assert_eq!((OCCUPANCY.shared)(128, capped.shared_bytes() - SHARED_ALLOCATION_BYTES).unwrap(), 5);
        // A cap above what the cache allows changes nothing.
        let (uncapped, _) = fitted("shared 128 blocks<=16", &problem(49152, 4096, 4)).unwrap();
        assert_eq!(uncapped.shared_bytes(), 16384);
        // Blocks past the kernels' limit come down to it; rows too wide for a block do not fit.
        let limited = Problem { block_limit: 512, ..problem(49152, 4096, 4) };
        assert_eq!(fitted("shared 1024", &limited).unwrap().0.block(), 512);
        assert_eq!(fitted("shared 128", &problem(4096, 131072, 4)), None);
        // A cluster too small for the row grows to the next size that holds it.
        let (plan, _) = fitted("cluster 2x1024", &problem(4096, 131072, 4)).unwrap();
        assert_eq!(plan.path, Path::Cluster { cluster: 4, block: 1024, shared_bytes: 131072 });
        // Blocks below the block sizes stream rows read once, and nothing else.
        assert_eq!(fitted("uncached 64", &problem(49152, 4096, 4)), None);
        let once = with(problem(49152, 4096, 4), |s| s.reads_once = true);
        assert_eq!(fitted("uncached 64", &once).unwrap().0.path, Path::Uncached { block: 64 });
    }

    #[test]
    fn a_table_plans_its_buckets_and_the_ladder_the_rest_and_forced_paths() {
        let table = TuningTable::parse("softmax 32-bit 4096 * aligned uncached 256\n* * * * * warp 8").unwrap();
        let planned = |problem: &Problem, fallback| plan(problem, &h100(), OCCUPANCY, Some(&table), fallback).unwrap();
        let (tuned, ahead) = planned(&problem(49152, 4096, 4), Fallback::Rules);
        assert_eq!((tuned.path, ahead), (Path::Uncached { block: 256 }, Ahead::None));
        assert_eq!(planned(&problem(49152, 200, 4), Fallback::Rules).0.path, Path::Warp { width: 32, elements: 8 });
        // The catch-all's warp tier does not hold 8192 columns: the fallback plans them.
        let wide = problem(49152, 8192, 4);
        let rules = dispatch::plan(&wide, &h100(), OCCUPANCY).unwrap();
        assert_eq!(planned(&wide, Fallback::Rules), (rules, Ahead::ByRules));
        let ladder = dispatch::ladder_plan(&wide, &h100(), OCCUPANCY).unwrap();
        assert_eq!(planned(&wide, Fallback::Ladder), (ladder, Ahead::None));
        // A forced path is the rules' to plan.
        let forced = Problem { force: Some(PathKind::Uncached), ..problem(49152, 4096, 4) };
        assert_eq!(planned(&forced, Fallback::Ladder).0, dispatch::plan(&forced, &h100(), OCCUPANCY).unwrap());
    }
}
