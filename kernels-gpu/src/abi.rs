//! What host and device must agree on: kernel symbols, parameter layouts, and the launch
//! constants the kernels are written for. Both sides compile this module, so nothing here is
//! re-declared with a "must match" comment.

/// Bytes moved by the widest vectorized access (`ld.global.v4.u32`).
pub const PACK_BYTES: usize = 16;

/// Threads per block of the elementwise kernels.
pub const ELEMENTWISE_BLOCK_SIZE: u32 = 256;

/// Packs each thread keeps in flight per loop iteration in the elementwise kernels: all
/// their loads are issued before any arithmetic.
pub const ELEMENTWISE_PACKS_PER_THREAD: usize = 2;

/// The most inputs an elementwise kernel reads.
pub const ELEMENTWISE_MAX_INPUTS: usize = 3;

/// Parameters of every elementwise kernel, passed by value as its only parameter.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ElementwiseArgs {
    /// Output elements.
    pub len: u64,
    /// Device address of the output.
    pub output: u64,
    /// Device addresses of the inputs; unused ones are 0.
    pub inputs: [u64; ELEMENTWISE_MAX_INPUTS],
    /// Length of the row-broadcast last input, for functors that broadcast it; else 0.
    pub broadcast_len: u64,
    /// Elements per vectorized access: 1, 2, 4 or 8, at most [`PACK_BYTES`] per access.
    /// Every address must be aligned to `pack * element size` (the host checks).
    pub pack: u32,
    pub reserved: u32,
}

/// Element types the kernels are instantiated for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    /// Class indices (cross entropy targets).
    I64,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
        }
    }

    /// The name used in kernel symbols and messages.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
        }
    }
}

/// The `DType` of a dtype token of the kernel tables (`f32`, `f16`, `bf16`).
#[macro_export]
macro_rules! dtype_of {
    (f32) => {
        $crate::abi::DType::F32
    };
    (f16) => {
        $crate::abi::DType::F16
    };
    (bf16) => {
        $crate::abi::DType::BF16
    };
}

/// The exported symbol of a kernel: `rill_<op>_<input dtype>_<output dtype>`.
#[macro_export]
macro_rules! kernel_symbol {
    ($op:ident, $input:ident, $output:ident) => {
        concat!("rill_", stringify!($op), "_", stringify!($input), "_", stringify!($output))
    };
}

/// Every elementwise kernel, as `op Functor arity: input output, ...;`. The device
/// instantiates an entry point per line and dtype pair; the host builds its symbol table
/// from the same list. All inputs of a kernel share one dtype.
#[macro_export]
macro_rules! for_each_elementwise_kernel {
    ($apply:ident) => {
        $apply! {
            relu Relu 1: f32 f32, f16 f16, bf16 bf16;
            gelu Gelu 1: f32 f32, f16 f16, bf16 bf16;
            gelu_tanh GeluTanh 1: f32 f32, f16 f16, bf16 bf16;
            silu Silu 1: f32 f32, f16 f16, bf16 bf16;
            sigmoid Sigmoid 1: f32 f32, f16 f16, bf16 bf16;
            cast Cast 1: f32 f16, f32 bf16, f16 f32, bf16 f32, f16 bf16, bf16 f16;
            add Add 2: f32 f32, f16 f16, bf16 bf16;
            sub Sub 2: f32 f32, f16 f16, bf16 bf16;
            mul Mul 2: f32 f32, f16 f16, bf16 bf16;
            div Div 2: f32 f32, f16 f16, bf16 bf16;
            fma Fma 3: f32 f32, f16 f16, bf16 bf16;
            bias_add_gelu BiasAddGelu 2: f32 f32, f16 f16, bf16 bf16;
        }
    };
}

/// Elements per access of the widest pack for elements of `in_bytes` and `out_bytes`.
pub const fn max_pack(in_bytes: usize, out_bytes: usize) -> usize {
    let widest = if in_bytes > out_bytes { in_bytes } else { out_bytes };
    PACK_BYTES / widest
}

/// Threads per block of the row-wise ops' warp path (groups of `width` lanes, one or two
/// rows each).
pub const ROW_WARP_BLOCK_SIZE: u32 = 128;

/// Rows a lane group handles per access on the warp path: two in the 8-element tier, so a
/// lane keeps two packs in flight (with one, 16-bit rows of 256 columns, a pack per lane,
/// ran at 70% of copy on the H100), else one (the wider tiers already hold two or more
/// packs a row, and a second row would double their registers).
pub const fn rows_per_access(elements: usize) -> u64 {
    if elements <= 8 { 2 } else { 1 }
}

/// Path codes of the row-wise kernels (softmax, norms): a warp path holds `code` elements
/// per thread per row in registers (8, 16 or 32); these two are the block paths.
pub const ROW_PATH_SHARED: usize = 1;
pub const ROW_PATH_UNCACHED: usize = 0;
/// A cluster of blocks per row, each caching a slice of it: rows too long for one block's
/// shared memory (sm_90; the cluster module holds these kernels).
pub const ROW_PATH_CLUSTER: usize = 2;

/// The block paths' codes for rows that start past a 16-byte boundary, each row run from
/// its head in aligned packs ([`RowShape::phase`]; softmax only, at the dtype's widest
/// pack). Kernels of their own: the head and the edge elements cost the aligned kernels
/// registers (measured on the H100: causal and cross-entropy kernels 8-16 more, 5-10 points
/// of copy at aligned widths).
pub const ROW_PATH_UNCACHED_PHASED: usize = 3;
pub const ROW_PATH_SHARED_PHASED: usize = 4;
pub const ROW_PATH_CLUSTER_PHASED: usize = 5;

/// Whether path code `path` runs rows from their heads.
pub const fn runs_phased(path: usize) -> bool {
    matches!(path, ROW_PATH_UNCACHED_PHASED | ROW_PATH_SHARED_PHASED | ROW_PATH_CLUSTER_PHASED)
}

/// Blocks per cluster the cluster path is launched with. 16 is past the portable limit of
/// 8: the H100 runs it once the kernel allows non-portable sizes, and the occupancy query
/// answers 0 on GPUs that cannot, so the planner never picks it there.
pub const ROW_CLUSTER_SIZES: [u32; 4] = [2, 4, 8, 16];

/// The most blocks a cluster kernel may be launched with.
pub const MAX_CLUSTER_BLOCKS: u32 = ROW_CLUSTER_SIZES[ROW_CLUSTER_SIZES.len() - 1];

/// Static shared memory a cluster kernel exchanges reduction partials through: two
/// alternating sets of an 8-byte slot per block of the cluster, and an 8-byte mbarrier per set.
pub const CLUSTER_EXCHANGE_BYTES: u32 = 2 * (MAX_CLUSTER_BLOCKS * 8 + 8);

/// Packs of y and of dy each thread of a softmax backward cluster kernel keeps in registers
/// rather than shared memory, so a block's slice may exceed its shared memory by that many
/// packs a thread of each (the planner counts them). The forwards hold none: a held pack
/// cost them up to 28 registers where the backward paid 10.
pub const SOFTMAX_BACKWARD_HELD_PACKS: usize = 1;

/// The `(rows, cols)` view a row-wise kernel works on, and its warp path's group width.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowShape {
    pub rows: u64,
    pub cols: u64,
    /// Lanes per row on the warp path (a power of two up to 32).
    pub width: u32,
    /// Elements by which the first row starts past a 16-byte boundary, the same for every
    /// array the kernel reads or writes along its rows. With it the block paths run rows of
    /// any width and offset in aligned packs: each row's packs start at its [`RowShape::head`],
    /// and the few elements outside them go one at a time. 0 where every row is aligned.
    pub phase: u32,
}

impl RowShape {
    /// Columns of `row` before its first element aligned to a pack of `pack` (a power of two).
    pub const fn head(&self, row: u64, pack: u64) -> u64 {
        (self.phase as u64 + row * self.cols).wrapping_neg() & (pack - 1)
    }

    /// Aligned packs the block paths take from every row, starting at its head: all of a
    /// row where every row is aligned, else as many as the row with the longest head holds,
    /// so every row has the same (and the cluster path the same slices).
    pub const fn aligned_packs(&self, pack: u64) -> u64 {
        if pack == 1 || (self.phase == 0 && self.cols.is_multiple_of(pack)) {
            self.cols / pack
        } else {
            (self.cols + 1).saturating_sub(pack) / pack
        }
    }

    /// Elements of each row outside its aligned packs: at most `2 * pack - 2`.
    pub const fn edges(&self, pack: u64) -> u64 {
        self.cols - self.aligned_packs(pack) * pack
    }

    /// The column of edge `edge` (below [`RowShape::edges`]) of `row`: the head's
    /// elements, then those after the last aligned pack.
    pub const fn edge_col(&self, row: u64, pack: u64, edge: u64) -> u64 {
        if edge < self.head(row, pack) { edge } else { self.aligned_packs(pack) * pack + edge }
    }
}

/// Kernel parameter structs that start with a [`RowShape`].
pub trait RowArgs: Copy {
    fn shape_mut(&mut self) -> &mut RowShape;
}

/// `target` value whose row is ignored by cross entropy (loss 0, gradient 0), as PyTorch's
/// default `ignore_index`.
pub const CROSS_ENTROPY_IGNORE_INDEX: i64 = -100;

/// Parameters of every softmax-family kernel, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SoftmaxArgs {
    pub shape: RowShape,
    /// x (forward) or y (backward).
    pub input: u64,
    /// dy (backward) or the additive mask (scale_mask).
    pub second: u64,
    /// y (forward), dx (backward), dlogits (cross-entropy backward); unused by cross entropy.
    pub output: u64,
    /// i64 class per row (cross entropy).
    pub target: u64,
    /// f32 per row: the loss (cross entropy, written) or its gradient (backward, read).
    pub row_values: u64,
    /// Rows of the mask, broadcast over `rows` (scale_mask); query length (causal).
    pub period: u64,
    pub scale: f32,
    /// 1 for log-softmax.
    pub log: u32,
}

impl RowArgs for SoftmaxArgs {
    fn shape_mut(&mut self) -> &mut RowShape {
        &mut self.shape
    }
}

/// The exported symbol of a softmax kernel.
#[macro_export]
macro_rules! softmax_symbol {
    ($kind:ident, $path:ident, $dtype:ident, $pack:literal) => {
        concat!(
            "rill_softmax_",
            stringify!($kind),
            "_",
            stringify!($path),
            "_",
            stringify!($dtype),
            "_p",
            stringify!($pack)
        )
    };
}

/// Calls `$apply!(kind path code dtype pack)` for every softmax kernel of the main module:
/// each kind, each path, each dtype with its widest pack and with pack 1 (for rows not
/// aligned to a pack), and each phased block path at the widest pack. `@paths [...] [...]`
/// gives the same table for other paths.
#[macro_export]
macro_rules! for_each_softmax_kernel {
    ($apply:ident) => {
        $crate::for_each_softmax_kernel!(@paths $apply
            [(warp8 8) (warp16 16) (warp24 24) (warp32 32) (shared 1) (uncached 0)]
            [(shared_phased 4) (uncached_phased 3)]);
    };
    (@paths $apply:ident $paths:tt $phased:tt) => {
        $crate::for_each_softmax_kernel!(@kinds $apply
            [forward backward scale_mask causal cross_entropy cross_entropy_backward]
            $paths $phased
            [(f32 4) (f16 8) (bf16 8)]);
    };
    (@kinds $apply:ident [$($kind:ident)*] $paths:tt $phased:tt $dtypes:tt) => {
        $($crate::for_each_softmax_kernel!(@kind $apply $kind $paths $phased $dtypes);)*
    };
    (@kind $apply:ident $kind:ident [$(($path:ident $code:literal))*] [$(($phased:ident $phased_code:literal))*]
        $dtypes:tt) => {
        $($crate::for_each_softmax_kernel!(@dtypes $apply $kind $path $code $dtypes);)*
        $($crate::for_each_softmax_kernel!(@widest $apply $kind $phased $phased_code $dtypes);)*
    };
    (@dtypes $apply:ident $kind:ident $path:ident $code:literal [$(($dtype:ident $pack:literal))*]) => {
        $($apply!($kind $path $code $dtype $pack); $apply!($kind $path $code $dtype 1);)*
    };
    (@widest $apply:ident $kind:ident $path:ident $code:literal [$(($dtype:ident $pack:literal))*]) => {
        $($apply!($kind $path $code $dtype $pack);)*
    };
}

/// [`for_each_softmax_kernel`] for the cluster path: the cluster module's kernels.
#[macro_export]
macro_rules! for_each_softmax_cluster_kernel {
    ($apply:ident) => {
        $crate::for_each_softmax_kernel!(@paths $apply [(cluster 2)] [(cluster_phased 5)]);
    };
}

/// Parameters of the LayerNorm and RMSNorm row kernels (forward, residual-add forward,
/// backward), passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NormArgs {
    pub shape: RowShape,
    /// x.
    pub input: u64,
    /// The residual (add_forward) or dy (backward).
    pub second: u64,
    /// y (forward) or dx (backward).
    pub output: u64,
    /// `x + residual`, written by add_forward.
    pub sum: u64,
    /// Per-column scale and shift, 0 for none (beta is LayerNorm only).
    pub gamma: u64,
    pub beta: u64,
    /// f32 per row: written by the forward where not 0, read by the backward. RMSNorm has
    /// no mean.
    pub mean: u64,
    pub rstd: u64,
    pub eps: f32,
    /// `1 / cols`, so no kernel divides.
    pub inv_cols: f32,
    /// 1 for RMSNorm.
    pub rms: u32,
    pub reserved: u32,
}

impl RowArgs for NormArgs {
    fn shape_mut(&mut self) -> &mut RowShape {
        &mut self.shape
    }
}

/// Threads per block of the parameter-gradient kernels: [`NORM_PARAM_GRAD_WARPS`] warps,
/// each lane owning one pack of columns.
pub const NORM_PARAM_GRAD_WARPS: u32 = 8;

/// Parameters of the two-stage dgamma/dbeta reduction: stage 1 (`param_grad`) writes
/// per-chunk column sums to `partial`; stage 2 (`param_grad_sum`) adds the chunks in order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NormParamGradArgs {
    pub rows: u64,
    pub cols: u64,
    /// Rows each chunk sums (the last may have fewer).
    pub rows_per_chunk: u64,
    pub chunks: u64,
    /// x and dy (stage 1).
    pub input: u64,
    pub grad: u64,
    /// f32 per row, as the forward wrote them.
    pub mean: u64,
    pub rstd: u64,
    /// f32 `[2, chunks, cols]`: dgamma's chunk sums, then dbeta's.
    pub partial: u64,
    /// Outputs of stage 2 (dbeta 0 for none).
    pub dgamma: u64,
    pub dbeta: u64,
    /// 1 for RMSNorm (no mean, no beta).
    pub rms: u32,
    pub reserved: u32,
}

/// The exported symbol of a norm kernel: `rill_norm_<kind>_<path>_<x>_<y>_<param>_p<pack>`.
#[macro_export]
macro_rules! norm_symbol {
    ($kind:ident, $path:ident, $x:ident, $y:ident, $param:ident, $pack:literal) => {
        concat!(
            "rill_norm_",
            stringify!($kind),
            "_",
            stringify!($path),
            "_",
            stringify!($x),
            "_",
            stringify!($y),
            "_",
            stringify!($param),
            "_p",
            stringify!($pack)
        )
    };
}

/// Calls `$apply!(kind path code x y param pack)` for every norm row kernel of the main
/// module: the forwards for each (x, y, gamma/beta) dtype triple, output casts included;
/// the backward for the triples whose output is the input dtype; each path; the widest pack
/// and pack 1. `@paths [...]` gives the same table for other paths.
#[macro_export]
macro_rules! for_each_norm_kernel {
    ($apply:ident) => {
        $crate::for_each_norm_kernel!(@paths $apply
            [(warp8 8) (warp16 16) (warp24 24) (warp32 32) (shared 1) (uncached 0)]);
    };
    (@paths $apply:ident $paths:tt) => {
        $crate::for_each_norm_kernel!(@kinds $apply [forward add_forward] $paths
            [(f32 f32 f32 4) (f16 f16 f16 8) (f16 f16 f32 8) (bf16 bf16 bf16 8) (bf16 bf16 f32 8)
             (f32 f16 f32 4) (f32 bf16 f32 4)]);
        $crate::for_each_norm_kernel!(@kinds $apply [backward] $paths
            [(f32 f32 f32 4) (f16 f16 f16 8) (f16 f16 f32 8) (bf16 bf16 bf16 8) (bf16 bf16 f32 8)]);
    };
    (@kinds $apply:ident [$($kind:ident)*] $paths:tt $types:tt) => {
        $($crate::for_each_norm_kernel!(@kind $apply $kind $paths $types);)*
    };
    (@kind $apply:ident $kind:ident [$(($path:ident $code:literal))*] $types:tt) => {
        $($crate::for_each_norm_kernel!(@types $apply $kind $path $code $types);)*
    };
    (@types $apply:ident $kind:ident $path:ident $code:literal [$(($x:ident $y:ident $param:ident $pack:literal))*]) => {
        $($apply!($kind $path $code $x $y $param $pack); $apply!($kind $path $code $x $y $param 1);)*
    };
}

/// [`for_each_norm_kernel`] for the cluster path: the cluster module's kernels.
#[macro_export]
macro_rules! for_each_norm_cluster_kernel {
    ($apply:ident) => {
        $crate::for_each_norm_kernel!(@paths $apply [(cluster 2)]);
    };
}

/// Calls `$apply!(x pack)` for each parameter-gradient stage-1 kernel (per input dtype) and
/// `$apply!(param)` through `$sum` for each stage-2 kernel (per parameter dtype).
#[macro_export]
macro_rules! for_each_norm_param_grad_kernel {
    ($stage1:ident, $stage2:ident) => {
        $stage1!(f32 4); $stage1!(f32 1); $stage1!(f16 8); $stage1!(f16 1); $stage1!(bf16 8); $stage1!(bf16 1);
        $stage2!(f32); $stage2!(f16); $stage2!(bf16);
    };
}

// ---------------------------------------------------------------------------------------------
// The RMSNorm optimization ladder (benchmark comparators)
// ---------------------------------------------------------------------------------------------

/// Threads per block of the ladder's kernels (rung 1: rows per block; rungs 2-4: threads
/// per row). A power of two, as rung 2's tree reduction needs.
pub const NORM_LADDER_BLOCK_SIZE: u32 = 256;

/// Parameters of the RMSNorm optimization ladder's kernels, passed by value: the forward
/// `y = x * rsqrt(mean(x^2) + eps) * gamma` over rows of a contiguous `[rows, cols]` `x`,
/// with `gamma` of `[cols]` and `y` like `x`, all of one dtype. These naive kernels are the
/// benchmark's comparators (one thread per row; shared-memory tree; warp shuffle; warp
/// shuffle with 16-byte accesses), not the dispatched RMSNorm, which takes `NormArgs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NormLadderArgs {
    pub rows: u64,
    pub cols: u64,
    /// Device addresses of x, gamma and y.
    pub input: u64,
    pub gamma: u64,
    pub output: u64,
    pub eps: f32,
    /// `1 / cols`, so no kernel divides.
    pub inv_cols: f32,
}

/// The exported symbol of a ladder kernel: `rill_norm_ladder_<rung>_<dtype>`.
#[macro_export]
macro_rules! norm_ladder_symbol {
    ($rung:ident, $dtype:ident) => {
        concat!("rill_norm_ladder_", stringify!($rung), "_", stringify!($dtype))
    };
}

/// Every ladder kernel, as `rung: dtype pack, ...;` (pack: elements per access, 1 but for
/// the vectorized rung's 16 bytes). The device instantiates an entry point per rung and
/// dtype; the host builds its symbol table from the same list.
#[macro_export]
macro_rules! for_each_norm_ladder_kernel {
    ($apply:ident) => {
        $apply! {
            thread_per_row: f32 1, f16 1, bf16 1;
            shared_tree: f32 1, f16 1, bf16 1;
            warp_strided: f32 1, f16 1, bf16 1;
            warp_vectorized: f32 4, f16 8, bf16 8;
        }
    };
}
