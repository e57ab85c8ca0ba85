//! Softmax of dequantized logits in one kernel: `softmax(q * scale[row] + bias)` over rows
//! of int8 `q`, with an f32 scale per row and a bf16 bias per column, written as bf16.
//!
//! What a user writes: the parameters (shared with the host), a Load functor that
//! dequantizes as it reads, and one `fused_softmax!` line; rill's row engine does the rest
//! on every path. The same functors go into rill's norms (`fused_norm!`), and an
//! elementwise functor of the user's own into rill's elementwise body
//! (`fused_elementwise!`). Plus, for the benchmark's unfused chain, a plain dequantize
//! kernel.
#![cfg_attr(target_arch = "nvptx64", no_std)]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]
#![cfg_attr(target_arch = "nvptx64", feature(adt_const_params))]

/// The kernels' parameters: device addresses of the arrays.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Dequant {
    /// int8 `rows x cols`.
    pub logits: u64,
    /// f32 per row.
    pub scale: u64,
    /// bf16 per column.
    pub bias: u64,
    /// bf16 `rows x cols`.
    pub out: u64,
}

/// The plain dequantization's parameters: [`Dequant`] and the view.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Dequantize {
    pub arrays: Dequant,
    pub rows: u64,
    pub cols: u64,
}

/// Elements a pack of the fused kernel holds: 8 bytes of int8, 16 of bf16.
pub const PACK: usize = 8;

#[cfg(target_arch = "nvptx64")]
mod device {
    use super::{Dequant, Dequantize, PACK};
    use rill_kernels_gpu::arch::{block_dim_x, block_idx_x, grid_dim_x, thread_idx_x};
    use rill_kernels_gpu::fuse::*;

    /// `q * scale[row] + bias[col]` as f32.
    pub struct DequantLoad {
        logits: DirectLoad<i8>,
        scale: *const f32,
        bias: DirectLoad<bf16>,
    }

    impl DequantLoad {
        #[inline(always)]
        fn dequantize<const N: usize>(q: [f32; N], scale: f32, bias: [f32; N]) -> [f32; N] {
            core::array::from_fn(|j| fma(q[j], scale, bias[j]))
        }
    }

    impl<const N: usize> Load<N> for DequantLoad {
        /// Every read of a cached row dequantizes it again.
        const TRANSFORMS: bool = true;
        /// The pack's int8 values, the row's scale and the columns' bias.
        type Fetched = (Pack<i8, N>, f32, Pack<bf16, N>);
        /// The source's dtype: the shared path caches the raw int8 row (1 byte a column,
        /// copied by `cp.async`) and dequantizes it on every read ([`Load::transform`]).
        type Exact = i8;

        #[inline(always)]
        fn source(&self) -> Option<RowMajor<i8>> {
            Some(self.logits.0)
        }

        #[inline(always)]
        unsafe fn fetch(&self, row: u64, col: u64) -> Self::Fetched {
            // SAFETY: the host planned packs of N where every pack is N-aligned; the row and
            // column are inside the arrays the parameters name.
            unsafe { (self.logits.fetch(row, col), self.scale.add(row as usize).read(), self.bias.fetch(0, col)) }
        }

        #[inline(always)]
        unsafe fn convert(&self, (q, scale, bias): Self::Fetched, _row: u64, _col: u64) -> [f32; N] {
            Self::dequantize(q.to_f32(), scale, bias.to_f32())
        }

        #[inline(always)]
        unsafe fn transform(&self, q: [f32; N], row: u64, col: u64) -> [f32; N] {
            // SAFETY: as `fetch`.
            unsafe {
                let bias: Pack<bf16, N> = self.bias.fetch(0, col);
                Self::dequantize(q, self.scale.add(row as usize).read(), bias.to_f32())
            }
        }
    }

    /// The functors of one launch (`PATH` unused: every path reads rows from their first
    /// element, as the host never asks for a phased plan here).
    unsafe fn make<const PATH: RowPath>(shape: &RowShape, e: &Dequant) -> (DequantLoad, DirectStore<bf16>) {
        // SAFETY: the host passes arrays of the view's shape (bias: one row, read by every
        // row, hence a row stride of 0).
        unsafe {
            let load = DequantLoad {
                logits: DirectLoad(RowMajor::new(e.logits, shape.cols)),
                scale: e.scale as *const f32,
                bias: DirectLoad(RowMajor::new(e.bias, 0)),
            };
            (load, DirectStore(RowMajor::new(e.out, shape.cols)))
        }
    }

    rill_kernels_gpu::fused_softmax!(dequant_softmax, Dequant, DequantLoad, make, 8);
    // The same functors in rill's norms: LayerNorm or RMSNorm of the dequantized row, with
    // an f32 weight and bias.
    rill_kernels_gpu::fused_norm!(dequant_norm, Dequant, DequantLoad, make, 8, f32);

    /// `max(x, 0)^2` (Primer's squared ReLU), an elementwise functor of the user's own.
    pub struct SquaredRelu;

    impl Functor<1> for SquaredRelu {
        #[inline(always)]
        fn apply([x]: [f32; 1]) -> f32 {
            let relu = if x < 0.0 { 0.0 } else { x };
            relu * relu
        }
    }

    rill_kernels_gpu::fused_elementwise!(squared_relu, SquaredRelu, 1, (f32 f32) (bf16 bf16) (f32 bf16));

    /// The unfused chain's first kernel: the dequantized logits written as bf16, a block
    /// per row at a time, packs of [`PACK`].
    ///
    /// # Safety
    /// The arrays hold the view, `cols` a multiple of [`PACK`] and every array aligned to
    /// its pack.
    #[unsafe(no_mangle)]
    pub unsafe extern "ptx-kernel" fn dequantize(args: Dequantize) {
        let Dequantize { arrays, rows, cols } = args;
        let shape = RowShape { rows, cols, width: 0, phase: 0, ahead: 0, stages: 0 };
        // SAFETY: as the function's contract.
        unsafe {
            let (load, store) = make::<{ RowPath::Uncached }>(&shape, &arrays);
            let mut row = block_idx_x() as u64;
            while row < rows {
                let mut col = thread_idx_x() as u64 * PACK as u64;
                while col < cols {
                    let values: [f32; PACK] = Load::<PACK>::load(&load, row, col);
                    store.store(values, row, col);
                    col += block_dim_x() as u64 * PACK as u64;
                }
                row += grid_dim_x() as u64;
            }
        }
    }
}
