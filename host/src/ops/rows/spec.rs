//! The interface between a row op and the row engine: what the planner must know of an op,
//! declared once by the op (or by a user's fused family) as one immutable [`RowSpec`].
//! The op hands the engine its spec, its arrays' addresses and its kernels' arguments, and
//! sets nothing else; the planner reads the op's facts here and never infers the op from
//! them.

use rill_kernels_gpu::abi::max_pack;

/// What a row op is, as the planner's rules and tuning tables name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpClass {
    /// `softmax` and `log_softmax`.
    Softmax,
    /// `scaled_masked_softmax`: a mask added on every read of the row.
    MaskedSoftmax,
    /// `scaled_causal_softmax`: each query reads the keys it sees.
    CausalSoftmax,
    /// `softmax_backward` and `log_softmax_backward`: y and dy cached.
    SoftmaxBackward,
    /// `cross_entropy` and `logsumexp`: each row read once for its statistics, a value a
    /// row written.
    RowStatistics,
    /// `cross_entropy_backward`.
    CrossEntropyBackward,
    /// `layer_norm` and `rms_norm`.
    Norm,
    /// `add_layer_norm` and `add_rms_norm`: the residual sum written beside the output.
    AddNorm,
    /// The norms' backward for dx alone (x and dy cached).
    NormBackward,
    /// The norms' backward gathering the parameter gradients' column sums as it reads the
    /// rows for dx.
    NormBackwardParams,
    /// A user's fused family (`fused_softmax!`, `fused_norm!`).
    Fused,
}

impl OpClass {
    /// Whether the class runs the forward row engine and writes an element for each one
    /// read (the kernels compile the warp path's request for rows ahead for these alone:
    /// `rill_kernels_gpu::table::requests_rows_ahead`).
    pub const fn writes_elements_forward(self) -> bool {
        matches!(
            self,
            OpClass::Softmax
                | OpClass::MaskedSoftmax
                | OpClass::CausalSoftmax
                | OpClass::CrossEntropyBackward
                | OpClass::Norm
                | OpClass::AddNorm
                | OpClass::Fused
        )
    }
}

/// What the row engine's planner must know of one op over rows of one dtype: its class and
/// the facts that decide which plans fit and which pay. Made by the op from its dtypes and
/// arguments ([`RowSpec::rows_of`] and struct update), then handed to the engine whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowSpec {
    pub class: OpClass,
    /// Bytes of an element of the rows the op reads (its input's dtype).
    pub element_bytes: u32,
    /// The widest pack the kernels load: elements per 16-byte access of the call's widest
    /// dtype.
    pub widest: usize,
    /// Bytes per column the shared path caches (each cached array's exact dtype: the
    /// input's for plain loads, f32 for fused ones; a backward caches two arrays).
    pub cache_bytes_per_col: u32,
    /// Packs of each cached array every thread of the cluster kernel keeps in registers,
    /// which its block's shared memory need not hold.
    pub cluster_held_packs: u32,
    /// Whether the op reads each row once (it needs only the row's statistics): past the
    /// warp path it then streams rows, a block per row, and no cache would pay for its
    /// shared memory.
    pub reads_once: bool,
    /// Whether every read of the cached row also reads other data from memory (the masked
    /// kind adds its mask on each read).
    pub cache_reads_memory: bool,
    /// Whether every read of the cached row transforms it (the masked kind, a user's load
    /// that caches its source, e.g. int8 dequantized on each read): such a kernel is
    /// issue-bound, so tuning tables tell a user's transforming families apart.
    pub cache_transformed: bool,
    /// Bytes a column of the per-column data that the passes over a cached row also read
    /// from global memory (a norm backward's weight; 0 for none).
    pub passes_column_bytes: u32,
    /// Bytes of per-column data every row re-reads (a norm's weight and bias): on the
    /// shared path, L1 is left that much room where that costs no resident blocks or
    /// [`RowSpec::columns_before_blocks`] says L1 comes first.
    pub column_bytes: u32,
    /// Whether L1 room for the column data outranks resident blocks (the residual-add
    /// forwards, which fill their cache through registers).
    pub columns_before_blocks: bool,
    /// Per-column f32 sums the kernels gather from the rows beside their own (0, or 1 or 2
    /// for a norm backward's parameter gradients), each block's (or cluster's) written as
    /// its row of a partial array: shared memory holds them before the caches, and the grid
    /// is one wave of resident blocks, so that array stays small.
    pub column_sums: u32,
    /// Whether every array the op reads or writes in packs is accessed at the row being
    /// worked on (no broadcast arrays): then, where all share one offset from a 16-byte
    /// boundary, the block paths run any row in aligned packs from its head.
    pub runs_from_heads: bool,
}

impl RowSpec {
    /// An op of `class` over rows of `element_bytes` elements, read and written in packs of
    /// that dtype, cached as they are: no held packs, no column data or sums, rows read
    /// more than once, never from their heads. Ops change what differs with struct update.
    pub const fn rows_of(class: OpClass, element_bytes: u32) -> RowSpec {
        RowSpec {
            class,
            element_bytes,
            widest: max_pack(element_bytes as usize, element_bytes as usize),
            cache_bytes_per_col: element_bytes,
            cluster_held_packs: 0,
            reads_once: false,
            cache_reads_memory: false,
            cache_transformed: false,
            passes_column_bytes: 0,
            column_bytes: 0,
            columns_before_blocks: false,
            column_sums: 0,
            runs_from_heads: false,
        }
    }

    /// Bytes per column of the gathered column sums (f32 each).
    pub const fn gathered_bytes_per_col(&self) -> u32 {
        self.column_sums * size_of::<f32>() as u32
    }

    /// The same op gathering no column sums: planned where its gathering kernels have no
    /// kernel on the path chosen (the op then sums the columns another way).
    pub const fn ungathered(self) -> RowSpec {
        let class = match self.class {
            OpClass::NormBackwardParams => OpClass::NormBackward,
            class => class,
        };
        RowSpec { class, column_sums: 0, ..self }
    }
}
