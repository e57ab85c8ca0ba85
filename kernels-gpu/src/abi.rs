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
    /// Bit masks (the ReLU mask of BatchNorm), 32 elements a word.
    U32,
    /// Quantized values, which users' fused kernels read (`crate::fuse`).
    I8,
}

impl DType {
    /// A code no dtype shares and 0 is not, for facts a PTX global carries
    /// ([`FusedFacts::weight`]).
    pub const fn code(self) -> u32 {
        self as u32 + 1
    }

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::U32 => 4,
            DType::I8 => 1,
        }
    }

    /// The name used in kernel symbols and messages.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::U32 => "u32",
            DType::I8 => "i8",
        }
    }
}

/// Elements per access of the widest pack for elements of `in_bytes` and `out_bytes`.
pub const fn max_pack(in_bytes: usize, out_bytes: usize) -> usize {
    let widest = if in_bytes > out_bytes { in_bytes } else { out_bytes };
    PACK_BYTES / widest
}

/// Threads in a warp.
pub const WARP_SIZE: u32 = 32;

/// Threads per block of the row-wise ops' warp path (groups of `width` lanes, one or two
/// rows each).
pub const ROW_WARP_BLOCK_SIZE: u32 = 128;

/// Blocks per cluster the cluster path is launched with. 16 is past the portable limit of
/// 8: the H100 runs it once the kernel allows non-portable sizes, and the occupancy query
/// answers 0 on GPUs that cannot, so the planner never picks it there.
pub const ROW_CLUSTER_SIZES: [u32; 4] = [2, 4, 8, 16];

/// The most blocks a cluster kernel may be launched with.
pub const MAX_CLUSTER_BLOCKS: u32 = ROW_CLUSTER_SIZES[ROW_CLUSTER_SIZES.len() - 1];

/// Static shared memory a cluster kernel exchanges reduction partials through: two
/// alternating sets of an 8-byte slot per block of the cluster, and an 8-byte mbarrier per set.
pub const CLUSTER_EXCHANGE_BYTES: u32 = 2 * (MAX_CLUSTER_BLOCKS * 8 + 8);

/// 32-bit words a block reduction moves per warp through shared memory: two, so the
/// cluster path merges a row's two statistics into one reduction.
pub const REDUCE_WORDS: usize = 2;

/// Static shared memory of every row-wise kernel: the block-reduction scratch,
/// [`REDUCE_WORDS`] words for each of 32 warps. The dynamic shared memory leaves room for it.
pub const ROW_STATIC_SHARED_BYTES: u32 = (REDUCE_WORDS * 4 * 32) as u32;

/// Static shared memory of the cluster kernels: the block-reduction scratch and where the
/// blocks exchange their reductions' partials.
pub const CLUSTER_STATIC_SHARED_BYTES: u32 = ROW_STATIC_SHARED_BYTES + CLUSTER_EXCHANGE_BYTES;

/// Packs of y and of dy each thread of a softmax backward cluster kernel keeps in registers
/// rather than shared memory, so a block's slice may exceed its shared memory by that many
/// packs a thread of each (the planner counts them). The forwards hold none: a held pack costs them
/// more registers than it costs the backward (docs/DECISIONS.md, "Held packs").
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
    /// Rows past each row it starts whose lines the warp path's widest tier requests into
    /// L2 (a wave of the resident warps' rows), so the warps that take those rows later wait
    /// on L2, not DRAM; 0 where the plan requests none (the host's `rows_ahead`).
    pub ahead: u64,
    /// Row caches a block keeps, used in turn ([`ROW_CACHE_STAGES`] or 1): with two, a
    /// backward that gathers column sums on the shared path over aligned rows copies each
    /// block's next row into one while it works on the row in the other (the host sizes
    /// shared memory for them). 0 or 1 elsewhere: one cache, as every other kernel.
    pub stages: u32,
}

/// Row caches a block of the gathering shared-path backward keeps where they fit
/// ([`RowShape::stages`]).
pub const ROW_CACHE_STAGES: u32 = 2;

/// Kernel parameter structs that start with a [`RowShape`].
pub trait RowArgs: Copy {
    fn shape(&self) -> &RowShape;
    fn shape_mut(&mut self) -> &mut RowShape;
}

/// Implements [`RowArgs`] for structs whose `shape` field is their [`RowShape`].
macro_rules! row_args {
    ($($args:ty),+) => {$(
        impl RowArgs for $args {
            fn shape(&self) -> &RowShape {
                &self.shape
            }
            fn shape_mut(&mut self) -> &mut RowShape {
                &mut self.shape
            }
        }
    )+};
}

row_args!(SoftmaxArgs, NormArgs);

/// The softmax's own parameters are the view alone.
impl RowArgs for RowShape {
    fn shape(&self) -> &RowShape {
        self
    }
    fn shape_mut(&mut self) -> &mut RowShape {
        self
    }
}

/// `target` value whose row is ignored by cross entropy (loss 0, gradient 0), as PyTorch's
/// default `ignore_index`.
pub const CROSS_ENTROPY_IGNORE_INDEX: i64 = -100;

/// The most rows a masked softmax takes: a row finds its mask row in 32 bits (a 64-bit
/// remainder cost its 32-element warp tier the registers of one block an SM in five).
pub const MASKED_MAX_ROWS: u64 = u32::MAX as u64;

/// Parameters of a user's fused row kernel (`fused_softmax!`, `fused_norm!`), passed by
/// value: the op's own parameters as rill's kernels take them (the view the host planned for
/// the softmax; [`NormArgs`] for the norms), and the user's own `#[repr(C)]` parameters
/// (their arrays' addresses, scales), whose size the host checks against the kernel's
/// ([`FusedFacts`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FusedArgs<E, Op = RowShape> {
    pub op: Op,
    pub extra: E,
}

impl<E: Copy, Op: RowArgs> RowArgs for FusedArgs<E, Op> {
    fn shape(&self) -> &RowShape {
        self.op.shape()
    }
    fn shape_mut(&mut self) -> &mut RowShape {
        self.op.shape_mut()
    }
}

/// Which of rill's bodies a user's fused kernels instantiate.
#[repr(u32)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FusedFamily {
    #[default]
    Softmax = 1,
    /// LayerNorm and RMSNorm forward (the kind is a runtime parameter, as rill's own).
    Norm = 2,
    Elementwise = 3,
}

/// What a user's fused kernels tell the host, as the global `<name>_facts` of their PTX:
/// written by the `fused_*!` macros from the types themselves, so the host restates
/// nothing.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FusedFacts {
    pub family: FusedFamily,
    /// Bytes of the user's parameter struct (0 for elementwise functors, which have none).
    pub extra_bytes: u32,
    /// Elements of the widest pack the kernels load (pack 1 kernels exist beside them).
    pub pack: u32,
    /// Bytes per column the shared path caches a row in (the load's exact dtype).
    pub cache_bytes_per_col: u32,
    /// The norms' weight and bias dtype ([`DType::code`]); 0 elsewhere.
    pub weight: u32,
    /// The elementwise functor's inputs.
    pub inputs: u32,
    /// Whether the elementwise functor's last input is a row broadcast along rows.
    pub broadcasts_last_input: u32,
    /// Whether the row families' load transforms every read of a cached row
    /// (`Load::TRANSFORMS`, in the device build's `pack` module): the planner then favours
    /// resident threads over rows in flight.
    pub transforms: u32,
}

/// Division by a number fixed for a launch without a division instruction: the host finds
/// a multiplier and a shift once ([`Divisor::new`]), and the kernels take `n / divisor` as
/// `(mulhi(n, magic) + n) >> shift` (Granlund and Montgomery's round-up method), exact for
/// every `n` below 2^63. The causal kind finds a row's query position so; as `row % queries`
/// it was a `rem` (20 to 70 instructions) the shared kernel ran for every pack, inside its
/// loops over the row.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Divisor {
    pub divisor: u64,
    /// `ceil(2^(64 + shift) / divisor) - 2^64`.
    pub magic: u64,
    /// `ceil(log2(divisor))`.
    pub shift: u32,
    pub reserved: u32,
}

impl Divisor {
    /// Division by `divisor`, taken into `1..=2^63` (row counts are far below; 0 would
    /// divide by nothing, so 1 stands in).
    #[cfg(not(target_arch = "nvptx64"))]
    pub fn new(divisor: u64) -> Divisor {
        let divisor = divisor.clamp(1, 1 << 63);
        let shift = u64::BITS - (divisor - 1).leading_zeros();
        // With 2^(shift - 1) < divisor <= 2^shift, 2^(64 + shift) / divisor lies in
        // [2^64, 2^65): its excess over 2^64 fits the 64 bits.
        let magic = ((1u128 << (64 + shift)).div_ceil(divisor as u128) - (1 << 64)) as u64;
        Divisor { divisor, magic, shift, reserved: 0 }
    }

    /// `n / divisor`, for `n` below 2^63 (where `mulhi(n, magic) + n` cannot overflow).
    #[inline(always)]
    pub fn quotient(self, n: u64) -> u64 {
        let high = ((n as u128 * self.magic as u128) >> 64) as u64;
        (high + n) >> self.shift
    }

    /// `n % divisor`, for `n` below 2^63.
    #[inline(always)]
    pub fn remainder(self, n: u64) -> u64 {
        n - self.quotient(n) * self.divisor
    }
}

impl Default for Divisor {
    /// Division by 1.
    fn default() -> Divisor {
        Divisor { divisor: 1, magic: 0, shift: 0, reserved: 0 }
    }
}

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
    /// f32 per row: the loss (cross entropy) or logsumexp (written), or the loss gradient
    /// (cross entropy backward, read).
    pub row_values: u64,
    /// Rows of the mask, broadcast over `rows` (scale_mask, whose rows are at most
    /// [`MASKED_MAX_ROWS`]); query length (causal).
    pub period: Divisor,
    pub scale: f32,
    /// 1 for log-softmax.
    pub log: u32,
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
    /// f32 `[sums, grid, cols]`: each block's column sums of the parameter gradients, where
    /// the backward gathers them (`backward_params`); 0 otherwise.
    pub partial: u64,
}

/// Threads per block of the kernel that writes the shifted copies.
pub const COLUMN_COPY_BLOCK_SIZE: u32 = 256;

/// Parameters of the kernel that writes the shifted copies of a norm's weight and bias
/// for its phased paths (`column_copies`): vector `v`'s copy `h` at element
/// `(v * copies + h) * column_copy_stride(cols)` of `output`, element `i` of it
/// `sources[v][i + h]` (0 past the vector).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ColumnCopyArgs {
    /// The vectors, 0 past the last one.
    pub sources: [u64; 2],
    pub output: u64,
    pub cols: u64,
    /// Copies a vector: the rows' pack.
    pub copies: u32,
    pub vectors: u32,
}

/// Warps per block of the column sums' stage 2, which split a tile of 32 columns' chunk
/// sums among them: enough loads in flight for the ~1000 chunks one wave of stage 1 (or of a
/// gathering backward) leaves.
pub const COLUMN_TOTALS_WARPS: u32 = 32;

/// Warps per block of the column sums' stage 1 (the norms' parameter gradients), each lane
/// owning one pack of columns.
pub const COLUMN_SUM_WARPS: u32 = 8;

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

// ---------------------------------------------------------------------------------------------
// BatchNorm
// ---------------------------------------------------------------------------------------------

/// Threads per block of every BatchNorm kernel but the column sums (which take
/// [`COLUMN_SUM_WARPS`] warps).
pub const BATCH_NORM_BLOCK_SIZE: u32 = 256;

/// Per-channel f32 coefficients a BatchNorm pass takes from its finalize kernel, as vectors
/// of `channels` in this order: scale, center, shift, slope. Forward
/// `y = scale (x - center) + shift`; backward `dx = scale g + slope (x - center) + shift`.
pub const BATCH_NORM_COEFFICIENTS: usize = 4;

/// Parameters of every BatchNorm kernel, passed by value. Every tensor of `x`'s shape is
/// viewed as `(outer, channels, inner)`, contiguous: element `(n, c, s)` at
/// `(n * channels + c) * inner + s`. NCHW and its 1-D and 3-D kin have `inner` the spatial
/// size; channels-last layouts have `inner == 1`, `outer` the rows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BatchNormArgs {
    pub outer: u64,
    pub channels: u64,
    pub inner: u64,
    /// x (read by the statistics, the forward and the backward).
    pub x: u64,
    /// The addend (Add + ReLU forward), or dy (backward).
    pub second: u64,
    /// y (forward), dx (backward).
    pub output: u64,
    /// d(addend) (Add + ReLU backward).
    pub second_output: u64,
    /// The ReLU mask: one bit per element in memory order, in u32 words; 0 for none.
    pub mask: u64,
    /// f32 per channel, 0 for none.
    pub weight: u64,
    pub bias: u64,
    pub running_mean: u64,
    pub running_var: u64,
    /// f32 per channel: written by the training forward, read by the backward.
    pub save_mean: u64,
    pub save_invstd: u64,
    /// f32 per channel, written by the backward's finalize (0 for none).
    pub dweight: u64,
    pub dbias: u64,
    /// f32 `[2, parts, channels]`: each part's two sums per channel (the statistics' shifted
    /// sums, or the backward's sums of `g` and `g (x - mean)`).
    pub partial: u64,
    pub parts: u64,
    /// Rows `(n, c)` sums: each row's part length in elements (column sums: unused, part `b`
    /// takes rows `b, b + parts, ...` of the summed view).
    pub part_len: u64,
    /// Parts per row `(n, c)` (rows sums only).
    pub row_parts: u64,
    /// Column sums: rows of channels in each row of the summed view (1, or `32 x pack /
    /// channels` where the channels divide that, so every lane of a tile has a column);
    /// `partial` is then `[2, parts, groups, channels]`, folded per channel by the finalize.
    pub groups: u64,
    /// f32 `[BATCH_NORM_COEFFICIENTS, channels]`, from the finalize kernel.
    pub coefficients: u64,
    pub eps: f32,
    /// The weight of this batch in the running statistics' update.
    pub momentum: f32,
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
