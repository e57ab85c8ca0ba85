//! The row engine: the path bodies every row-wise op (softmax, the norms) runs on,
//! written once over the op's hooks ([`forward`], [`backward`]), and the machinery under
//! them: where a thread's rows and columns are on each of OneFlow's three paths, loading a
//! row into registers or a cache, and reductions over a row.
//! - warp: a group of `width` lanes (1 to 32) owns one row (two in the 8-element tier), the
//!   row held in registers, `E` elements per lane;
//! - shared: a block owns a row, cached in dynamic shared memory (filled by `cp.async`
//!   where the load has a source);
//! - cluster (sm_90): a cluster of blocks owns a row, each caching a slice of it;
//! - uncached: a block owns a row and re-reads it from global memory (any width).
//!
//! One idea a file: [`forward`] and [`backward`] the path bodies; `warp` the warp path's
//! rows in registers; `split` which rows a block or cluster takes and which packs each
//! thread takes; `cache` the row caches in shared memory.

use crate::abi::RowShape;
use crate::pack::RowMajor;
use crate::scalar::Scalar;

/// `$body` with `$e`, a `const usize`, the elements a lane holds on `$path` where it is a
/// warp path (the row kernels' warp bodies take them as a const parameter); nothing on the
/// block paths, whose bodies the caller matches first.
macro_rules! on_warp_path {
    ($path:expr, $e:ident => $body:expr) => {
        match $path {
            crate::table::RowPath::Warp8 => {
                const $e: usize = crate::table::RowPath::Warp8.warp_elements();
                $body
            }
            crate::table::RowPath::Warp16 => {
                const $e: usize = crate::table::RowPath::Warp16.warp_elements();
                $body
            }
            crate::table::RowPath::Warp24 => {
                const $e: usize = crate::table::RowPath::Warp24.warp_elements();
                $body
            }
            crate::table::RowPath::Warp32 => {
                const $e: usize = crate::table::RowPath::Warp32.warp_elements();
                $body
            }
            _ => {}
        }
    };
}

pub(crate) mod backward;
mod cache;
pub(crate) mod forward;
mod split;
mod warp;

pub(crate) use cache::{HeldRowCache, RowCache};
#[cfg(feature = "cluster")]
pub(crate) use split::ClusterSplit;
pub(crate) use split::{BlockRow, BlockSplit, RowSplit, Slice, block_packs, block_packs_loaded};
pub(crate) use warp::{WarpRows, request_ahead, warp_load, warp_row_reduce, warp_store};

/// A row-major `(rows, cols)` view of `T` at `address` as the kernel on `path` indexes it:
/// starting `shape.phase` elements past a 16-byte boundary on the phased paths (the host
/// passes a phase only to those), aligned on the others.
///
/// # Safety
/// `address` must be a generic address of global memory holding `shape.rows x shape.cols`
/// elements of `T`, aligned as the host's plan for `path` assumed.
#[inline(always)]
pub(crate) unsafe fn row_view<T: Scalar>(address: u64, shape: &RowShape, path: crate::table::RowPath) -> RowMajor<T> {
    let first = if path.phased() { shape.phase as u64 } else { 0 };
    // SAFETY: forwarded to the caller.
    unsafe { RowMajor::<T>::past_boundary(address, shape.cols, first) }
}

/// Calls `f(row)` for rows `first, first + step, ...` below `rows` (uniform across the
/// threads that share them, so barriers and shuffles inside stay converged).
#[inline(always)]
fn strided(first: u64, step: u64, rows: u64, mut f: impl FnMut(u64)) {
    let mut row = first;
    while row < rows {
        f(row);
        row += step;
    }
}
