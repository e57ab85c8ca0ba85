//! The norms' per-column work beside the row kernels: the weight and bias copied shifted for
//! rows run from their heads, and dweight and dbias summed over the rows in two
//! deterministic stages where the row kernel did not gather them.

use super::Plan;
use crate::Stream;
use crate::error::Result;
use crate::launch::{LaunchConfig, launch};
use crate::module::{Kernel, KernelKey};
use crate::ops::columns::{ColumnSumArgs, sum_chunks, sum_columns};
use crate::ops::rows::Prepared;
use crate::tensor::{DType, Element};
use crate::workspace::Workspace;
use rill_kernels_gpu::abi::{COLUMN_COPY_BLOCK_SIZE, ColumnCopyArgs, NormArgs, NormParamGradArgs};
use rill_kernels_gpu::layout::{column_copy_stride, phased_columns_copied};

impl ColumnSumArgs for NormParamGradArgs {
    fn set_chunking(&mut self, rows_per_chunk: u64, chunks: u64, partial: u64) {
        (self.rows_per_chunk, self.chunks, self.partial) = (rows_per_chunk, chunks, partial);
    }
}

/// Launches a norm's row kernel. Where its rows run from their heads (a phased plan), each
/// row's packs start at another column; where the pack is one that
/// [`phased_columns_copied`], the weight and bias (where given) are first copied once
/// shifted by each column a pack can start at, into stream-ordered scratch that the kernel
/// then reads them from in whole aligned accesses
/// (the device's `ColumnLoad::shifted`).
pub(super) fn launch_reading_copies<G: Element>(
    stream: &Stream,
    op: &str,
    mut prepared: Prepared<'_, NormArgs>,
) -> Result<Plan> {
    if !prepared.launches() || !prepared.plan.phased || !phased_columns_copied(prepared.plan.pack) {
        return prepared.launch();
    }
    // The given vectors, gamma before beta, 0 past them.
    let (mut sources, mut vectors) = ([0; 2], 0);
    for vector in [prepared.args.gamma, prepared.args.beta].into_iter().filter(|&v| v != 0) {
        (sources[vectors], vectors) = (vector, vectors + 1);
    }
    if vectors == 0 {
        return prepared.launch();
    }
    let kernel = column_kernel(stream, op, KernelKey::NormColumnCopies { param: G::DTYPE }, G::DTYPE)?;
    let cols = prepared.args.shape.cols;
    let (copies, stride) = (prepared.plan.pack, column_copy_stride(cols) as usize);
    let copy_bytes = copies * stride * size_of::<G>();
    let config = LaunchConfig {
        grid: stride.div_ceil(COLUMN_COPY_BLOCK_SIZE as usize) as u32,
        block: COLUMN_COPY_BLOCK_SIZE,
        shared_bytes: 0,
        cluster: 1,
    };
    Workspace::scoped(stream, (vectors * copy_bytes).div_ceil(size_of::<f32>()), |scratch| {
        let args = ColumnCopyArgs { sources, output: scratch, cols, copies: copies as u32, vectors: vectors as u32 };
        let mut next = scratch;
        for vector in [&mut prepared.args.gamma, &mut prepared.args.beta] {
            if *vector != 0 {
                (*vector, next) = (next, next + copy_bytes as u64);
            }
        }
        // SAFETY: the kernel takes ColumnCopyArgs; the op checked each vector to hold `cols`
        // elements of `G`, and the scratch holds every copy of each, 16-byte aligned (the pool
        // aligns allocations, and a copy's bytes are a multiple of 16); the row kernel then
        // reads the copies on the same stream.
        unsafe { launch(stream, kernel, config, &args) }.and_then(|()| prepared.launch())
    })
}

/// The per-column kernel `key` (parameter gradients, shifted copies); `Unsupported` naming
/// `op` and `dtype` where there is none.
pub(super) fn column_kernel(stream: &Stream, op: &str, key: KernelKey, dtype: DType) -> Result<Kernel> {
    stream
        .gpu()
        .modules()
        .kernel(key)
        .map_err(|error| error.reword_unsupported(|| format!("`{op}`: no per-column kernel for {}", dtype.name())))
}

/// Stage 2 alone: dweight (and dbias) as the sums of `args.chunks` partial rows, in order.
///
/// # Safety
/// `args.partial` must hold the `[sums, chunks, cols]` f32 rows, written before this call on
/// `stream`; dweight and dbias, where not 0, `cols` elements of `G`.
pub(super) unsafe fn chunk_totals<G: Element>(stream: &Stream, op: &str, args: NormParamGradArgs) -> Result<()> {
    let totals = column_kernel(stream, op, KernelKey::NormParamGradSum { param: G::DTYPE }, G::DTYPE)?;
    // SAFETY: forwarded to the caller.
    unsafe { sum_chunks(stream, totals, args, args.cols as usize) }
}

/// dweight (and dbias): the column sums of `dy * x̂` (and `dy`).
pub(super) fn param_grads<T: Element, G: Element>(
    stream: &Stream,
    op: &str,
    args: NormParamGradArgs,
    pack: usize,
) -> Result<()> {
    let chunks = column_kernel(stream, op, KernelKey::NormParamGrad { x: T::DTYPE, pack }, T::DTYPE)?;
    let totals = column_kernel(stream, op, KernelKey::NormParamGradSum { param: G::DTYPE }, T::DTYPE)?;
    // SAFETY: both kernels take NormParamGradArgs; the caller checked x and dy (rows x cols,
    // aligned to `pack`), mean and rstd (rows), dweight and dbias (cols).
    unsafe { sum_columns(stream, (chunks, totals), args, (args.rows as usize, args.cols as usize, pack)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shifted copies as the copy kernel lays them out hold, for every pack a phased row
    /// reads (from each row's head), the vector's elements where the kernel's read of that
    /// pack looks: copy `col % pack`, element `col - col % pack`, from a 16-byte boundary.
    #[test]
    fn shifted_copies_hold_every_pack_a_phased_row_reads() {
        use rill_kernels_gpu::abi::RowShape;
        for (cols, pack) in [(50257u64, 8u64), (32001, 8), (4099, 8), (9, 8), (17, 4)] {
            let stride = column_copy_stride(cols);
            assert!((stride * 2).is_multiple_of(16) && stride >= cols);
            let copies: Vec<Option<u64>> = (0..pack * stride)
                .map(|at| {
                    let (copy, i) = (at / stride, at % stride);
                    (i + copy < cols).then_some(i + copy)
                })
                .collect();
            for phase in 0..pack as u32 {
                let shape = RowShape { rows: 0, cols, width: 0, phase, ahead: 0, stages: 0 };
                for row in 0..pack {
                    let head = shape.head(row, pack);
                    for k in 0..shape.aligned_packs(pack) {
                        let col = head + k * pack;
                        let first = (col % pack) * stride + col - col % pack;
                        assert!(first.is_multiple_of(pack), "{cols} {pack}: column {col}");
                        for j in 0..pack {
                            assert_eq!(copies[(first + j) as usize], Some(col + j), "{cols} {pack}: column {col}");
                        }
                    }
                }
            }
        }
        assert!(phased_columns_copied(8) && !phased_columns_copied(4) && !phased_columns_copied(1));
    }
}
