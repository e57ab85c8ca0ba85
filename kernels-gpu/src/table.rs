//! The kernel table: every exported kernel, declared once per op family.
//!
//! Each family's macro holds its lists (kinds, paths, dtypes, packs) and expands them into
//! one flat list of kernels for a callback. The device instantiates an entry point per
//! kernel from that list (`entry.rs`); the host resolves a typed [`KernelKey`] to the
//! kernel's symbol by a `match` generated from the same list. Symbols are spelled by one
//! macro ([`kernel_symbol!`](crate::kernel_symbol)), so a kernel missing on either side cannot compile, and no
//! side ever compares strings. The PTX modules, with the cargo feature that builds each,
//! are [`Module`]; the builder builds [`Module::ALL`].
//!
//! Adding a kind to a family is one token pair in its list, a device function of that name
//! in `ops/` and a variant the host asks for; nothing else is restated.

use crate::abi::DType;

/// The PTX modules of the device crate. Each is one cargo feature of this crate of the
/// same name, built into `<name>.ptx`, so a program loads (and the driver JIT-compiles)
/// only the op families it uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Module {
    Elementwise,
    Softmax,
    Norm,
    /// The RMSNorm optimization ladder: naive kernels the benchmark compares against.
    NormLadder,
    /// The cluster paths of softmax and the norms (thread-block clusters, sm_90).
    Cluster,
    /// BatchNorm with its fused activations, and the mask ReLU ops.
    BatchNorm,
}

impl Module {
    pub const ALL: [Module; 6] =
        [Module::Elementwise, Module::Softmax, Module::Norm, Module::NormLadder, Module::Cluster, Module::BatchNorm];

    /// The module's file stem and the cargo feature that builds it.
    pub const fn name(self) -> &'static str {
        match self {
            Module::Elementwise => "elementwise",
            Module::Softmax => "softmax",
            Module::Norm => "norm",
            Module::NormLadder => "norm_ladder",
            Module::Cluster => "cluster",
            Module::BatchNorm => "batch_norm",
        }
    }

    /// The oldest arch (`90` for sm_90) and the PTX ISA the module needs where they are
    /// newer than the defaults: the cluster module's cluster barriers and distributed
    /// shared memory (sm_90), and its `st.async` (PTX ISA 8.1, CUDA 12.1).
    pub const fn needs(self) -> Option<(u32, &'static str)> {
        match self {
            Module::Cluster => Some((90, "ptx81")),
            _ => None,
        }
    }
}

/// The paths of the row-wise kernels (softmax, the norms), as both sides name them: the
/// device takes one as a const parameter, the host plans one. A warp path holds a row in
/// registers, `warp_elements` a lane; the block paths cache the row in shared memory
/// (`Shared`), across a cluster of blocks (`Cluster`, sm_90) or not at all (`Uncached`).
/// The `*Phased` block paths run rows that start past a 16-byte boundary from their heads
/// (`RowShape::phase`); they are kernels of their own because the head and edge elements
/// cost the aligned kernels registers, and so resident warps, at every width (docs/DECISIONS.md,
/// "Rows run from their heads").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(any(target_arch = "nvptx64", test), derive(core::marker::ConstParamTy))]
pub enum RowPath {
    Warp8,
    Warp16,
    Warp24,
    Warp32,
    Shared,
    Uncached,
    Cluster,
    SharedPhased,
    UncachedPhased,
    ClusterPhased,
}

impl RowPath {
    /// The warp paths, fewest elements a lane first. 24 serves rows of 513 to 768 columns:
    /// as the 32-element tier, a 768-column row left each lane a fourth pack of registers
    /// and loads with nothing in it.
    pub const WARP: [RowPath; 4] = [RowPath::Warp8, RowPath::Warp16, RowPath::Warp24, RowPath::Warp32];

    /// Elements a lane holds on a warp path; 0 on the block paths.
    pub const fn warp_elements(self) -> usize {
        match self {
            RowPath::Warp8 => 8,
            RowPath::Warp16 => 16,
            RowPath::Warp24 => 24,
            RowPath::Warp32 => 32,
            _ => 0,
        }
    }

    /// Whether the path runs each row from its head.
    pub const fn phased(self) -> bool {
        matches!(self, RowPath::SharedPhased | RowPath::UncachedPhased | RowPath::ClusterPhased)
    }

    /// Whether the path's kernels are in the cluster module.
    pub const fn clustered(self) -> bool {
        matches!(self, RowPath::Cluster | RowPath::ClusterPhased)
    }
}

/// The exported symbol of a kernel, from its table tokens: `rill_<first>_..._<last>`, and
/// `_p<pack>` after `; p pack`.
#[macro_export]
macro_rules! kernel_symbol {
    ($first:ident $($part:ident)*; p $pack:literal) => {
        concat!("rill_", stringify!($first) $(, "_", stringify!($part))*, "_p", stringify!($pack))
    };
    ($first:ident $($part:ident)*) => {
        concat!("rill_", stringify!($first) $(, "_", stringify!($part))*)
    };
}

/// The `DType` of a dtype token of the kernel tables (`f32`, `f16`, `bf16`); also a pattern.
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

/// The key of a norm row kernel from its table tokens; also a pattern. One spelling for
/// [`KernelKey::symbol`], which matches the keys, and [`KernelKey::register_caps`], which
/// lists them (host side only, as both are).
#[cfg(not(target_arch = "nvptx64"))]
macro_rules! norm_key {
    ($K:ident $P:ident $x:ident $y:ident $g:ident $pack:literal) => {
        KernelKey::Norm {
            kind: NormKernelKind::$K,
            path: RowPath::$P,
            dtypes: ($crate::dtype_of!($x), $crate::dtype_of!($y), $crate::dtype_of!($g)),
            pack: $pack,
        }
    };
}

/// Declares a kind enum from a table's `(Variant name)` list, with each kind's name.
macro_rules! declare_kinds {
    ($(#[$doc:meta])* $kind:ident [$(($variant:ident $name:ident))*]) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $kind {
            $($variant,)*
        }

        impl $kind {
            pub const ALL: [$kind; [$(stringify!($variant)),*].len()] = [$($kind::$variant,)*];

            /// The name in kernel symbols.
            pub const fn name(self) -> &'static str {
                match self {
                    $($kind::$variant => stringify!($name),)*
                }
            }
        }
    };
}

/// Every elementwise kernel, as `op Functor arity: input output, ...;` (all inputs of a
/// kernel share one dtype): `$apply! { ... }` gets the whole list.
#[macro_export]
macro_rules! elementwise_kernels {
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

macro_rules! declare_elementwise_ops {
    ($($op:ident $functor:ident $arity:literal: $($input:ident $output:ident),+;)+) => {
        /// An elementwise op: its functor's name.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ElementwiseOp {
            $($functor,)+
        }

        impl ElementwiseOp {
            pub const ALL: [ElementwiseOp; [$(stringify!($functor)),+].len()] = [$(ElementwiseOp::$functor,)+];

            pub const fn name(self) -> &'static str {
                match self {
                    $(ElementwiseOp::$functor => stringify!($op),)+
                }
            }

            /// Inputs it reads.
            pub const fn arity(self) -> usize {
                match self {
                    $(ElementwiseOp::$functor => $arity,)+
                }
            }

            /// The (input, output) dtypes it has kernels for.
            pub const fn dtypes(self) -> &'static [(DType, DType)] {
                match self {
                    $(ElementwiseOp::$functor => &[$(($crate::dtype_of!($input), $crate::dtype_of!($output)),)+],)+
                }
            }
        }
    };
}

elementwise_kernels!(declare_elementwise_ops);

/// Every softmax-family kernel: each kind on each path, at each dtype's widest pack and
/// at pack 1 (rows not aligned to a pack); the phased block paths at the widest pack only.
/// A kind marked `widest` reads a single row array (cross entropy, logsumexp), which the
/// block paths always run from each row's head, so its block paths have no pack-1 kernels.
/// `softmax_kernels!(main apply)` gives the softmax module's kernels to `apply!` as
/// `(Kind kind Path path dtype pack)` entries, `cluster` the cluster module's, `all` both;
/// `kinds` gives the `(Kind kind)` list.
#[macro_export]
macro_rules! softmax_kernels {
    ($mode:ident $apply:ident) => {
        $crate::softmax_kernels!(@lists $mode $apply
            [(Forward forward both) (Backward backward both) (ScaleMask scale_mask both) (Causal causal both)
             (CrossEntropy cross_entropy widest) (CrossEntropyBackward cross_entropy_backward both)
             (LogSumExp logsumexp widest)]
            [(Warp8 warp8) (Warp16 warp16) (Warp24 warp24) (Warp32 warp32)]
            [(Shared shared) (Uncached uncached)]
            [(SharedPhased shared_phased) (UncachedPhased uncached_phased)]
            [(Cluster cluster)]
            [(ClusterPhased cluster_phased)]
            [(f32 4) (f16 8) (bf16 8)]);
    };
    (@lists kinds $apply:ident [$(($K:ident $k:ident $block:ident))*] $($lists:tt)*) => {
        $apply!($(($K $k))*);
    };
    (@lists main $apply:ident $kinds:tt $warp:tt $block:tt $phased:tt $cluster:tt $cluster_phased:tt $dtypes:tt) => {
        $crate::softmax_kernels!(@kinds $apply [] $kinds $warp $block $phased $dtypes);
    };
    (@lists cluster $apply:ident $kinds:tt $warp:tt $block:tt $phased:tt $cluster:tt $cluster_phased:tt
        $dtypes:tt) => {
        $crate::softmax_kernels!(@kinds $apply [] $kinds [] $cluster $cluster_phased $dtypes);
    };
    (@lists all $apply:ident $kinds:tt $warp:tt [$($block:tt)*] [$($phased:tt)*] [$($cluster:tt)*]
        [$($cluster_phased:tt)*] $dtypes:tt) => {
        $crate::softmax_kernels!(@kinds $apply [] $kinds $warp [$($block)* $($cluster)*]
            [$($phased)* $($cluster_phased)*] $dtypes);
    };
    // One kind at a time: its warp paths at both packs, its block paths at the packs it
    // marks, its phased paths at the widest.
    (@kinds $apply:ident [$($out:tt)*] [] $warp:tt $block:tt $phased:tt $dtypes:tt) => {
        $crate::softmax_kernels!(@dtypes $apply [] [$($out)*] $dtypes);
    };
    (@kinds $apply:ident [$($out:tt)*] [($K:ident $k:ident $packs:ident) $($kinds:tt)*] [$($warp:tt)*]
        [$($block:tt)*] [$($phased:tt)*] $dtypes:tt) => {
        $crate::softmax_kernels!(@kinds $apply
            [$($out)* $((($K $k) $warp both))* $((($K $k) $block $packs))* $((($K $k) $phased widest))*]
            [$($kinds)*] [$($warp)*] [$($block)*] [$($phased)*] $dtypes);
    };
    // Then each (kind, path) at each dtype.
    (@dtypes $apply:ident [$($out:tt)*] [] $dtypes:tt) => {
        $apply! { $($out)* }
    };
    (@dtypes $apply:ident [$($out:tt)*] [(($K:ident $k:ident) ($P:ident $p:ident) both) $($rest:tt)*]
        [$(($d:ident $w:literal))*]) => {
        $crate::softmax_kernels!(@dtypes $apply [$($out)* $(($K $k $P $p $d $w) ($K $k $P $p $d 1))*] [$($rest)*]
            [$(($d $w))*]);
    };
    (@dtypes $apply:ident [$($out:tt)*] [(($K:ident $k:ident) ($P:ident $p:ident) widest) $($rest:tt)*]
        [$(($d:ident $w:literal))*]) => {
        $crate::softmax_kernels!(@dtypes $apply [$($out)* $(($K $k $P $p $d $w))*] [$($rest)*] [$(($d $w))*]);
    };
}

macro_rules! declare_softmax_kinds {
    ($($kinds:tt)*) => {
        declare_kinds!(
            /// A softmax-family kernel kind.
            SoftmaxKind [$($kinds)*]
        );
    };
}
softmax_kernels!(kinds declare_softmax_kinds);

/// Whether a warp-path kernel of `warp_elements` a lane, over rows of `element_bytes`
/// elements, holds the request for the rows [`RowShape::ahead`](crate::abi::RowShape::ahead)
/// (a forward with element outputs): the widest tier's 16-bit rows, where few warps fit an
/// SM. Elsewhere the code alone cost registers (docs/DECISIONS.md), so the kernels compile
/// it, and the planner asks for it, only here.
pub const fn requests_rows_ahead(warp_elements: usize, element_bytes: usize) -> bool {
    warp_elements == RowPath::Warp32.warp_elements() && element_bytes == 2
}

/// Every norm row kernel: the forwards for each (x, y, gamma/beta) dtype triple, output
/// casts included; the backward for the triples whose output is the input dtype; each
/// path at the widest pack and pack 1; the phased block paths (odd widths run from each
/// row's head) at the widest pack, for the triples whose rows share one dtype (the host
/// phases only rows of one element size). The backward that gathers the parameter
/// gradients from its rows (`BackwardParams`) has the paths the host plans it on, at the
/// widest pack: the warp tiers of the backward's rows (up to 512 columns), the shared path
/// and the cluster path, and their phased forms. Modes as
/// [`softmax_kernels!`]; entries are `(Kind kind Path path x y param pack)`.
#[macro_export]
macro_rules! norm_kernels {
    ($mode:ident $apply:ident) => {
        $crate::norm_kernels!(@lists $mode $apply
            [(Forward forward) (AddForward add_forward)]
            [(f32 f32 f32 4) (f16 f16 f16 8) (f16 f16 f32 8) (bf16 bf16 bf16 8) (bf16 bf16 f32 8)
             (f32 f16 f32 4) (f32 bf16 f32 4)]
            [(Backward backward)]
            [(f32 f32 f32 4) (f16 f16 f16 8) (f16 f16 f32 8) (bf16 bf16 bf16 8) (bf16 bf16 f32 8)]
            [(BackwardParams backward_params)]
            [(Warp8 warp8) (Warp16 warp16) (Shared shared)]
            [(SharedPhased shared_phased)]
            [(Warp8 warp8) (Warp16 warp16) (Warp24 warp24) (Warp32 warp32) (Shared shared) (Uncached uncached)]
            [(SharedPhased shared_phased) (UncachedPhased uncached_phased)]
            [(Cluster cluster)]
            [(ClusterPhased cluster_phased)]);
    };
    (@lists kinds $apply:ident [$($forward:tt)*] $forward_types:tt [$($backward:tt)*] $backward_types:tt
        [$($params:tt)*] $($lists:tt)*) => {
        $apply!($($forward)* $($backward)* $($params)*);
    };
    (@lists main $apply:ident $forward:tt $forward_types:tt $backward:tt $backward_types:tt $params:tt
        $params_paths:tt $params_phased:tt $paths:tt $phased:tt $cluster:tt $cluster_phased:tt) => {
        $crate::norm_kernels!(@kinds $apply []
            [($forward $forward_types $paths $backward_types $phased both)
             ($backward $backward_types $paths $backward_types $phased both)
             ($params $backward_types $params_paths $backward_types $params_phased widest)]);
    };
    (@lists cluster $apply:ident $forward:tt $forward_types:tt $backward:tt $backward_types:tt $params:tt
        $params_paths:tt $params_phased:tt $paths:tt $phased:tt $cluster:tt $cluster_phased:tt) => {
        $crate::norm_kernels!(@kinds $apply []
            [($forward $forward_types $cluster $backward_types $cluster_phased both)
             ($backward $backward_types $cluster $backward_types $cluster_phased both)
             ($params $backward_types $cluster $backward_types $cluster_phased widest)]);
    };
    (@lists all $apply:ident $forward:tt $forward_types:tt $backward:tt $backward_types:tt $params:tt
        [$($params_path:tt)*] [$($params_phased:tt)*] [$($path:tt)*] [$($phased:tt)*] [$($cluster:tt)*]
        [$($cluster_phased:tt)*]) => {
        $crate::norm_kernels!(@kinds $apply []
            [($forward $forward_types [$($path)* $($cluster)*] $backward_types [$($phased)* $($cluster_phased)*] both)
             ($backward $backward_types [$($path)* $($cluster)*] $backward_types [$($phased)* $($cluster_phased)*] both)
             ($params $backward_types [$($params_path)* $($cluster)*] $backward_types
                [$($params_phased)* $($cluster_phased)*] widest)]);
    };
    // One group of kinds at a time: each kind on each path at the packs the group names
    // (both, or the widest), on each phased path at the widest ...
    (@kinds $apply:ident [$($out:tt)*] []) => {
        $crate::norm_kernels!(@types $apply [] [$($out)*]);
    };
    (@kinds $apply:ident [$($out:tt)*]
        [([$($kind:tt)*] $types:tt $paths:tt $phased_types:tt $phased:tt $packs:ident) $($groups:tt)*]) => {
        $crate::norm_kernels!(@kinds $apply
            [$($out)* $(($kind $paths $types $packs) ($kind $phased $phased_types widest))*] [$($groups)*]);
    };
    // ... then each (kind, path) at each dtype triple.
    (@types $apply:ident [$($out:tt)*] []) => {
        $apply! { $($out)* }
    };
    (@types $apply:ident [$($out:tt)*] [($kind:tt [] $types:tt $packs:ident) $($rest:tt)*]) => {
        $crate::norm_kernels!(@types $apply [$($out)*] [$($rest)*]);
    };
    (@types $apply:ident [$($out:tt)*] [(($K:ident $k:ident) [($P:ident $p:ident) $($paths:tt)*]
        [$(($x:ident $y:ident $g:ident $w:literal))*] both) $($rest:tt)*]) => {
        $crate::norm_kernels!(@types $apply [$($out)* $(($K $k $P $p $x $y $g $w) ($K $k $P $p $x $y $g 1))*]
            [(($K $k) [$($paths)*] [$(($x $y $g $w))*] both) $($rest)*]);
    };
    (@types $apply:ident [$($out:tt)*] [(($K:ident $k:ident) [($P:ident $p:ident) $($paths:tt)*]
        [$(($x:ident $y:ident $g:ident $w:literal))*] widest) $($rest:tt)*]) => {
        $crate::norm_kernels!(@types $apply [$($out)* $(($K $k $P $p $x $y $g $w))*]
            [(($K $k) [$($paths)*] [$(($x $y $g $w))*] widest) $($rest)*]);
    };
}

macro_rules! declare_norm_kinds {
    ($($kinds:tt)*) => {
        declare_kinds!(
            /// A norm row-kernel kind: the forward, the residual-add forward, the backward.
            NormKernelKind [$($kinds)*]
        );
    };
}
norm_kernels!(kinds declare_norm_kinds);

/// The norms' per-column kernels: the parameter gradients' stage 1 (`param_grad`, column
/// sums of a chunk of rows) per input dtype and pack as `(x pack)`; per parameter dtype as
/// `(param)`, their stage 2 (`param_grad_sum`, the chunks added in order) and the shifted
/// copies of a weight and bias the phased paths read (`column_copies`).
#[macro_export]
macro_rules! norm_param_kernels {
    ($stage1:ident, $per_param:ident) => {
        $stage1! { (f32 4) (f32 1) (f16 8) (f16 1) (bf16 8) (bf16 1) }
        $per_param! { (f32) (f16) (bf16) }
    };
}

/// The symbol of the parameter gradients' stage-1 kernel for input dtype `x` and `pack`.
#[macro_export]
macro_rules! norm_param_grad_symbol {
    ($x:ident $pack:literal) => {
        $crate::kernel_symbol!(norm param_grad chunks $x f32 f32; p $pack)
    };
}

/// The symbol of the parameter gradients' stage-2 kernel for parameter dtype `param`.
#[macro_export]
macro_rules! norm_param_grad_sum_symbol {
    ($param:ident) => {
        $crate::kernel_symbol!(norm param_grad_sum columns f32 f32 $param; p 1)
    };
}

/// The symbol of the kernel writing the shifted copies of parameter dtype `param`.
#[macro_export]
macro_rules! norm_column_copies_symbol {
    ($param:ident) => {
        $crate::kernel_symbol!(norm column_copies $param; p 1)
    };
}

/// Every kernel of the RMSNorm optimization ladder, in the order the profiling article
/// climbs it, as `Rung rung "how it works": dtype pack, ...;` (pack: elements per access,
/// 1 but for the vectorized rung's 16 bytes).
#[macro_export]
macro_rules! norm_ladder_kernels {
    ($apply:ident) => {
        $apply! {
            ThreadPerRow thread_per_row "rung 1: thread per row, scalar": f32 1, f16 1, bf16 1;
            SharedTree shared_tree "rung 2: block per row, shared-memory tree, scalar": f32 1, f16 1, bf16 1;
            WarpStrided warp_strided "rung 3: block per row, warp shuffle, scalar": f32 1, f16 1, bf16 1;
            WarpVectorized warp_vectorized "rung 4: block per row, warp shuffle, 16-byte packs": f32 4, f16 8, bf16 8;
        }
    };
}

macro_rules! declare_ladder_rungs {
    ($($rung:ident $name:ident $describe:literal: $($dtype:ident $pack:literal),+;)+) => {
        declare_kinds!(
            /// A rung of the RMSNorm ladder.
            LadderRung [$(($rung $name))+]
        );

        impl LadderRung {
            /// 1 to 4, the rung's place on the ladder.
            pub fn number(self) -> usize {
                LadderRung::ALL.iter().position(|&rung| rung == self).map_or(0, |i| i + 1)
            }

            /// One line on how the rung works (the benchmark's path column).
            pub const fn describe(self) -> &'static str {
                match self {
                    $(LadderRung::$rung => $describe,)+
                }
            }

            /// Elements per access of the rung's `dtype` kernel.
            pub const fn pack(self, dtype: DType) -> Option<usize> {
                match (self, dtype) {
                    $($((LadderRung::$rung, $crate::dtype_of!($dtype)) => Some($pack),)+)+
                    _ => None,
                }
            }
        }
    };
}

norm_ladder_kernels!(declare_ladder_rungs);

/// A kernel, as the host asks for it.
/// The BatchNorm kernels, `(Kind name function [activation])`: the packed ones at each
/// dtype's widest pack and at 1, the finalize kernels (a block per channel) at 1.
#[macro_export]
macro_rules! batch_norm_kernels {
    ($mode:ident $apply:ident) => {
        $crate::batch_norm_kernels!(@lists $mode $apply
            [(Stats stats stats []) (GradSums grad_sums grad_sums [])
             (Forward forward forward_apply [None]) (ForwardRelu forward_relu forward_apply [Relu])
             (ForwardAddRelu forward_add_relu forward_apply [AddRelu])
             (Backward backward backward_apply [None]) (BackwardRelu backward_relu backward_apply [Relu])
             (BackwardAddRelu backward_add_relu backward_apply [AddRelu])
             (ReluWithMask relu_with_mask relu_with_mask [])
             (ReluBackwardFromMask relu_backward_from_mask relu_backward_from_mask [])
             (ReluBackward relu_backward relu_backward [])]
            [(FinalizeForward finalize_forward finalize_forward []) (FinalizeBackward finalize_backward finalize_backward [])]
            [(f32 4) (f16 8) (bf16 8)]);
    };
    (@lists kinds $apply:ident [$(($K:ident $k:ident $f:ident $a:tt))*] [$(($FK:ident $fk:ident $ff:ident $fa:tt))*]
        $dtypes:tt) => {
        $apply!($(($K $k))* $(($FK $fk))*);
    };
    (@lists all $apply:ident [$($packed:tt)*] [$($single:tt)*] [$(($d:ident $w:literal))*]) => {
        $crate::batch_norm_kernels!(@each $apply [] [$($packed)*] [$($single)*] [$(($d $w))*]);
    };
    (@each $apply:ident [$($out:tt)*] [] [] $dtypes:tt) => {
        $apply! { $($out)* }
    };
    (@each $apply:ident [$($out:tt)*] [($K:ident $k:ident $f:ident $a:tt) $($rest:tt)*] $single:tt
        [$(($d:ident $w:literal))*]) => {
        $crate::batch_norm_kernels!(@each $apply [$($out)* $(($K $k $f $a $d $w) ($K $k $f $a $d 1))*] [$($rest)*]
            $single [$(($d $w))*]);
    };
    (@each $apply:ident [$($out:tt)*] [] [($K:ident $k:ident $f:ident $a:tt) $($rest:tt)*]
        [$(($d:ident $w:literal))*]) => {
        $crate::batch_norm_kernels!(@each $apply [$($out)* $(($K $k $f $a $d 1))*] [] [$($rest)*] [$(($d $w))*]);
    };
}

macro_rules! declare_batch_norm_kinds {
    ($($kinds:tt)*) => {
        declare_kinds!(
            BatchNormKernelKind [$($kinds)*]
        );
    };
}
batch_norm_kernels!(kinds declare_batch_norm_kinds);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelKey {
    Elementwise {
        op: ElementwiseOp,
        input: DType,
        output: DType,
    },
    Softmax {
        kind: SoftmaxKind,
        path: RowPath,
        dtype: DType,
        pack: usize,
    },
    /// `dtypes`: x, y, and the weight and bias.
    Norm {
        kind: NormKernelKind,
        path: RowPath,
        dtypes: (DType, DType, DType),
        pack: usize,
    },
    NormParamGrad {
        x: DType,
        pack: usize,
    },
    NormParamGradSum {
        param: DType,
    },
    /// The shifted copies of a norm's weight and bias for its phased paths.
    NormColumnCopies {
        param: DType,
    },
    NormLadder {
        rung: LadderRung,
        dtype: DType,
    },
    BatchNorm {
        kind: BatchNormKernelKind,
        dtype: DType,
        pack: usize,
    },
}

#[cfg(not(target_arch = "nvptx64"))]
impl KernelKey {
    /// The kernel's exported symbol; `None` where the table has no such kernel.
    pub fn symbol(self) -> Option<&'static str> {
        let key = self;
        macro_rules! elementwise {
            ($($op:ident $functor:ident $arity:literal: $($input:ident $output:ident),+;)+) => {
                match key {
                    $($(KernelKey::Elementwise {
                        op: ElementwiseOp::$functor,
                        input: crate::dtype_of!($input),
                        output: crate::dtype_of!($output),
                    } => return Some(crate::kernel_symbol!($op $input $output)),)+)+
                    _ => {}
                }
            };
        }
        macro_rules! softmax {
            ($(($K:ident $k:ident $P:ident $p:ident $d:ident $pack:literal))*) => {
                match key {
                    $(KernelKey::Softmax {
                        kind: SoftmaxKind::$K,
                        path: RowPath::$P,
                        dtype: crate::dtype_of!($d),
                        pack: $pack,
                    } => return Some(crate::kernel_symbol!(softmax $k $p $d; p $pack)),)*
                    _ => {}
                }
            };
        }
        macro_rules! norm {
            ($(($K:ident $k:ident $P:ident $p:ident $x:ident $y:ident $g:ident $pack:literal))*) => {
                match key {
                    $(norm_key!($K $P $x $y $g $pack) => {
                        return Some(crate::kernel_symbol!(norm $k $p $x $y $g; p $pack));
                    })*
                    _ => {}
                }
            };
        }
        macro_rules! param_grad {
            ($(($x:ident $pack:literal))*) => {
                match key {
                    $(KernelKey::NormParamGrad { x: crate::dtype_of!($x), pack: $pack } => {
                        return Some(crate::norm_param_grad_symbol!($x $pack));
                    })*
                    _ => {}
                }
            };
        }
        macro_rules! per_param {
            ($(($g:ident))*) => {
                match key {
                    $(KernelKey::NormParamGradSum { param: crate::dtype_of!($g) } => {
                        return Some(crate::norm_param_grad_sum_symbol!($g));
                    })*
                    $(KernelKey::NormColumnCopies { param: crate::dtype_of!($g) } => {
                        return Some(crate::norm_column_copies_symbol!($g));
                    })*
                    _ => {}
                }
            };
        }
        macro_rules! ladder {
            ($($rung:ident $name:ident $describe:literal: $($dtype:ident $pack:literal),+;)+) => {
                match key {
                    $($(KernelKey::NormLadder { rung: LadderRung::$rung, dtype: crate::dtype_of!($dtype) } => {
                        return Some(crate::kernel_symbol!(norm_ladder $name $dtype));
                    })+)+
                    _ => {}
                }
            };
        }
        macro_rules! batch_norm {
            ($(($K:ident $k:ident $f:ident $a:tt $d:ident $pack:literal))*) => {
                match key {
                    $(KernelKey::BatchNorm {
                        kind: BatchNormKernelKind::$K,
                        dtype: crate::dtype_of!($d),
                        pack: $pack,
                    } => return Some(crate::kernel_symbol!(batch_norm $k $d; p $pack)),)*
                    _ => {}
                }
            };
        }
        elementwise_kernels!(elementwise);
        softmax_kernels!(all softmax);
        norm_kernels!(all norm);
        norm_param_kernels!(param_grad, per_param);
        norm_ladder_kernels!(ladder);
        batch_norm_kernels!(all batch_norm);
        None
    }

    /// The registers a thread of the kernel may take (`.maxnreg`, which the builder writes
    /// into its PTX), where ptxas would give it more than lets its plans keep enough warps
    /// resident. The norm backward gathering its parameter gradients on clusters from each
    /// row's head takes more registers than lets two blocks of 384 or 512 an SM stay resident, and
    /// with fewer warps it waits on latency rather than on DRAM. Capped (16-bit at 80, f32 at 64:
    /// little or no spilling) they run two such blocks an SM; a lower cap makes the 16-bit kernels
    /// spill and gains nothing (docs/DECISIONS.md, "Register caps").
    pub const fn register_cap(self) -> Option<u32> {
        match self {
            KernelKey::Norm {
                kind: NormKernelKind::BackwardParams,
                path: RowPath::ClusterPhased,
                dtypes: (x, ..),
                ..
            } => Some(if x.size() == 4 { 64 } else { 80 }),
            _ => None,
        }
    }

    /// The kernels of `module` with a [`KernelKey::register_cap`], as (symbol, cap). Only
    /// the norms' row kernels take caps, so only they are listed from the table.
    pub fn register_caps(module: Module) -> Vec<(&'static str, u32)> {
        macro_rules! norm {
            ($(($K:ident $k:ident $P:ident $p:ident $x:ident $y:ident $g:ident $pack:literal))*) => {
                const NORM_KERNELS: &[KernelKey] = &[$(norm_key!($K $P $x $y $g $pack)),*];
            };
        }
        norm_kernels!(all norm);
        NORM_KERNELS
            .iter()
            .copied()
            .filter(|key| key.module() == module)
            .filter_map(|key| Some((key.symbol()?, key.register_cap()?)))
            .collect()
    }

    /// The PTX module holding the kernel.
    pub const fn module(self) -> Module {
        match self {
            KernelKey::Elementwise { .. } => Module::Elementwise,
            KernelKey::Softmax { path, .. } | KernelKey::Norm { path, .. } if path.clustered() => Module::Cluster,
            KernelKey::Softmax { .. } => Module::Softmax,
            KernelKey::Norm { .. }
            | KernelKey::NormParamGrad { .. }
            | KernelKey::NormParamGradSum { .. }
            | KernelKey::NormColumnCopies { .. } => Module::Norm,
            KernelKey::NormLadder { .. } => Module::NormLadder,
            KernelKey::BatchNorm { .. } => Module::BatchNorm,
        }
    }
}
