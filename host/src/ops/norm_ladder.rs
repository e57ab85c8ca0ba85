//! The RMSNorm optimization ladder: benchmark comparators, not rill's RMSNorm.
//!
//! Four deliberately simple forward kernels, written the way the profiling article's steps
//! are, so the benchmark table (`rill-bench --filter rms_norm_ladder`) shows what each idea
//! buys beside the dispatched kernel and the copy:
//! 1. [`Rung::ThreadPerRow`]: one thread per row, two scalar passes over it;
//! 2. [`Rung::SharedTree`]: one block of 256 threads per row, a strided loop, a tree
//!    reduction in shared memory;
//! 3. [`Rung::WarpStrided`]: as 2, reducing by warp shuffles;
//! 4. [`Rung::WarpVectorized`]: as 3, with 16-byte loads and stores (a float4 for f32, eight
//!    halves for f16 and bf16).
//!
//! `y[r, c] = x[r, c] * rsqrt(mean_c(x[r, :]^2) + eps) * gamma[c]`, computed in f32, over the
//! last axis; `x`, `gamma` and `y` share one dtype (f32, f16 or bf16). No per-row `inv_rms`
//! is written. Each rung is correct for any shape; none is tuned: use the norm ops for work.
//!
//! Rung 4 needs `cols` to be a multiple of its pack (4 for f32, 8 for the 16-bit types) and
//! `x`, `gamma` and `y` to start on 16-byte boundaries; where they do not,
//! [`rms_norm_rung`] runs rung 3 instead (what rung 4 would do with scalar accesses), and
//! [`rung_run`] says which rung a call runs.

use crate::Stream;
use crate::error::{Error, Result, invalid};
use crate::launch::{LaunchConfig, launch};
use crate::module::KernelKey;
use crate::tensor::{AsView, AsViewMut, DType, Element};
use rill_kernels_gpu::abi::{NORM_LADDER_BLOCK_SIZE, NormLadderArgs, PACK_BYTES};

pub use rill_kernels_gpu::table::LadderRung as Rung;

/// The rung a call of [`rms_norm_rung`] runs for `rung` asked of a row of `cols` elements of
/// `dtype` at `addresses` (x, gamma, y): rung 4 only where `cols` is a multiple of its pack
/// and every address is 16-byte aligned, else rung 3; the other rungs as asked.
pub fn rung_run(rung: Rung, dtype: DType, cols: usize, addresses: &[u64]) -> Rung {
    if rung != Rung::WarpVectorized {
        return rung;
    }
    let pack = PACK_BYTES / dtype.size();
    let aligned = addresses.iter().all(|&a| a.is_multiple_of(PACK_BYTES as u64));
    if cols.is_multiple_of(pack) && aligned { rung } else { Rung::WarpStrided }
}

/// Most blocks a launch asks for (the grid's x limit); the kernels loop over further rows.
const MAX_GRID: u64 = i32::MAX as u64;

/// The launch geometry of `rung` over `rows` rows: rung 1 a thread per row, the others a
/// block of [`NORM_LADDER_BLOCK_SIZE`] per row (rung 2 with a shared f32 per thread).
pub fn launch_config(rung: Rung, rows: usize) -> LaunchConfig {
    let block = NORM_LADDER_BLOCK_SIZE;
    let blocks = match rung {
        Rung::ThreadPerRow => (rows as u64).div_ceil(block as u64),
        _ => rows as u64,
    };
    let shared_bytes = if rung == Rung::SharedTree { block * size_of::<f32>() as u32 } else { 0 };
    LaunchConfig { grid: blocks.clamp(1, MAX_GRID) as u32, block, shared_bytes, cluster: 1 }
}

/// `y = x * rsqrt(mean(x^2) + eps) * gamma` over the last axis of `x` (two or more
/// dimensions, not empty), with the ladder's `rung`; `gamma` is `[cols]`, `y` has the shape
/// of `x`. Queued on `stream`. Rung 4 falls back to rung 3 where its 16-byte accesses do not
/// fit (see [`rung_run`]).
///
/// Errors: `InvalidInput` for a shape that does not fit, an empty tensor, or an `eps` that is
/// negative or not finite; `Unsupported` for an element type without kernels (i64).
pub fn rms_norm_rung<T: Element>(
    stream: &Stream,
    rung: Rung,
    x: &impl AsView<T>,
    gamma: &impl AsView<T>,
    eps: f32,
    y: &mut impl AsViewMut<T>,
) -> Result<()> {
    let (x, gamma, y) = (x.as_view(), gamma.as_view(), y.as_view_mut());
    let op = format!("rms_norm ladder `{}`", rung.name());
    let (cols, outer) = match x.shape().split_last() {
        Some((&cols, outer)) if !outer.is_empty() => (cols, outer),
        _ => invalid!("{op}: x needs two or more dimensions (rows..., cols); got shape {:?}", x.shape()),
    };
    let rows: usize = outer.iter().product();
    if rows == 0 || cols == 0 {
        invalid!("{op}: x has shape {:?}, which is empty; give at least one row and one column", x.shape());
    }
    if gamma.shape() != [cols] {
        invalid!("{op}: gamma has shape {:?} but must be [{cols}], the last dimension of x", gamma.shape());
    }
    if y.shape() != x.shape() {
        invalid!("{op}: y has shape {:?} but must have the shape of x, {:?}", y.shape(), x.shape());
    }
    if !eps.is_finite() || eps < 0.0 {
        invalid!("{op}: eps is {eps}; give a finite, non-negative value");
    }
    let addresses = [x.address(), gamma.address(), y.address()];
    if let Some(a) = addresses.iter().find(|&&a| !a.is_multiple_of(size_of::<T>() as u64)) {
        invalid!("{op}: address {a:#x} is not aligned to its {}-byte elements", size_of::<T>());
    }
    let ran = rung_run(rung, T::DTYPE, cols, &addresses);
    if ran.pack(T::DTYPE).is_none() {
        return Err(Error::Unsupported(format!(
            "RMSNorm ladder rung `{}` has no {} kernel; it has f32, f16 and bf16",
            ran.name(),
            T::DTYPE.name()
        )));
    }
    let gpu = stream.gpu();
    gpu.bind()?;
    let kernel = gpu.modules().kernel(KernelKey::NormLadder { rung: ran, dtype: T::DTYPE })?;
    let config = launch_config(ran, rows);
    if kernel.max_threads_per_block < config.block {
        return Err(Error::Unsupported(format!(
            "{op}: kernel `{}` launches at most {} threads per block on this device; it needs {}",
            kernel.symbol, kernel.max_threads_per_block, config.block
        )));
    }
    let args = NormLadderArgs {
        rows: rows as u64,
        cols: cols as u64,
        input: x.address(),
        gamma: gamma.address(),
        output: y.address(),
        eps,
        inv_cols: (1.0 / cols as f64) as f32,
    };
    // SAFETY: the rung's kernel takes NormLadderArgs for T; x and y hold rows x cols elements
    // and gamma cols (checked above), all aligned to T, and y is borrowed mutably so it
    // overlaps neither input; rung 4 runs only with cols a multiple of its pack and every
    // address 16-byte aligned; the geometry is the one the rung is written for (a block of
    // 256, the shared memory rung 2 indexes).
    unsafe { launch(stream, kernel, config, &args) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rung_has_a_kernel_per_float_dtype() {
        for rung in Rung::ALL {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let symbol = KernelKey::NormLadder { rung, dtype }.symbol();
                assert_eq!(symbol, Some(format!("rill_norm_ladder_{}_{}", rung.name(), dtype.name())).as_deref());
                let pack = if rung == Rung::WarpVectorized { PACK_BYTES / dtype.size() } else { 1 };
                assert_eq!(rung.pack(dtype), Some(pack));
            }
            assert!(rung.pack(DType::I64).is_none());
        }
        let numbers: Vec<usize> = Rung::ALL.iter().map(|r| r.number()).collect();
        assert_eq!(numbers, [1, 2, 3, 4]);
    }

    #[test]
    fn rung_4_falls_back_to_rung_3_where_packs_do_not_fit() {
        let aligned = [0x1000, 0x2000, 0x3000];
        assert_eq!(rung_run(Rung::WarpVectorized, DType::F32, 1024, &aligned), Rung::WarpVectorized);
        assert_eq!(rung_run(Rung::WarpVectorized, DType::F16, 1000, &aligned), Rung::WarpVectorized);
        assert_eq!(rung_run(Rung::WarpVectorized, DType::F32, 1022, &aligned), Rung::WarpStrided);
        assert_eq!(rung_run(Rung::WarpVectorized, DType::BF16, 12, &aligned), Rung::WarpStrided);
        assert_eq!(rung_run(Rung::WarpVectorized, DType::F32, 1024, &[0x1000, 0x2004, 0x3000]), Rung::WarpStrided);
        assert_eq!(rung_run(Rung::SharedTree, DType::F32, 3, &[0x1002]), Rung::SharedTree);
    }

    #[test]
    fn geometry_is_a_thread_or_a_block_per_row() {
        let one = launch_config(Rung::ThreadPerRow, 257);
        assert_eq!((one.grid, one.block, one.shared_bytes), (2, 256, 0));
        let tree = launch_config(Rung::SharedTree, 49152);
        assert_eq!((tree.grid, tree.block, tree.shared_bytes), (49152, 256, 1024));
        let shuffle = launch_config(Rung::WarpVectorized, 3);
        assert_eq!((shuffle.grid, shuffle.block, shuffle.shared_bytes), (3, 256, 0));
        assert_eq!(launch_config(Rung::WarpStrided, usize::MAX).grid, i32::MAX as u32);
    }
}
