//! The exported kernels, one entry point per kernel of the table in [`crate::table`].
//! Nothing else in the crate is `extern "ptx-kernel"`.

#[cfg(all(feature = "elementwise", not(feature = "fuse")))]
mod elementwise {
    use crate::abi::ElementwiseArgs;
    use crate::functor::*;
    #[allow(unused_imports)]
    use crate::scalar::bf16;
    use crate::{elementwise_kernels, kernel_symbol};

    macro_rules! elementwise_entries {
        ($($op:ident $functor:ident $arity:literal: $($input:ident $output:ident),+;)+) => {
            $($(
                const _: () = {
                    #[unsafe(export_name = kernel_symbol!($op $input $output))]
                    unsafe extern "ptx-kernel" fn entry(args: ElementwiseArgs) {
                        // SAFETY: the host validated `args` against this symbol's dtypes.
                        unsafe { crate::ops::elementwise::run::<$functor, $input, $output, $arity>(&args) }
                    }
                };
            )+)+
        };
    }

    elementwise_kernels!(elementwise_entries);
}

/// The softmax-family entry points of `(Kind kind Path path dtype pack)` entries.
#[cfg(all(feature = "softmax", not(feature = "fuse")))]
macro_rules! softmax_entries {
    ($(($K:ident $kind:ident $P:ident $path:ident $dtype:ident $pack:literal))*) => {
        $(const _: () = {
            #[unsafe(export_name = $crate::kernel_symbol!(softmax $kind $path $dtype; p $pack))]
            unsafe extern "ptx-kernel" fn entry(args: $crate::abi::SoftmaxArgs) {
                #[allow(unused_imports)]
                use $crate::scalar::bf16;
                // SAFETY: the host validated `args` and planned the launch for this path.
                unsafe { $crate::ops::softmax::$kind::<$dtype, $pack, { $crate::table::RowPath::$P }>(&args) }
            }
        };)*
    };
}

/// The norm row-kernel entry points of `(Kind kind Path path x y param pack)` entries.
#[cfg(all(feature = "norm", not(feature = "fuse")))]
macro_rules! norm_entries {
    ($(($K:ident $kind:ident $P:ident $path:ident $x:ident $y:ident $param:ident $pack:literal))*) => {
        $(const _: () = {
            #[unsafe(export_name = $crate::kernel_symbol!(norm $kind $path $x $y $param; p $pack))]
            unsafe extern "ptx-kernel" fn entry(args: $crate::abi::NormArgs) {
                #[allow(unused_imports)]
                use $crate::scalar::bf16;
                // SAFETY: the host validated `args` and planned the launch for this path.
                unsafe { $crate::ops::norm::$kind::<$x, $y, $param, $pack, { $crate::table::RowPath::$P }>(&args) }
            }
        };)*
    };
}

#[cfg(all(feature = "softmax", not(any(feature = "cluster", feature = "fuse"))))]
crate::softmax_kernels!(main softmax_entries);

#[cfg(all(feature = "norm", not(any(feature = "cluster", feature = "fuse"))))]
mod norm {
    use crate::abi::{ColumnCopyArgs, NormParamGradArgs};
    #[allow(unused_imports)]
    use crate::scalar::bf16;
    use crate::{norm_column_copies_symbol, norm_param_grad_sum_symbol, norm_param_grad_symbol, norm_param_kernels};

    crate::norm_kernels!(main norm_entries);

    macro_rules! param_grad_entries {
        ($(($x:ident $pack:literal))*) => {
            $(const _: () = {
                #[unsafe(export_name = norm_param_grad_symbol!($x $pack))]
                unsafe extern "ptx-kernel" fn entry(args: NormParamGradArgs) {
                    // SAFETY: the host validated `args` and sized grid and shared memory.
                    unsafe { crate::ops::norm::param_grad::<$x, $pack>(&args) }
                }
            };)*
        };
    }

    macro_rules! per_param_entries {
        ($(($param:ident))*) => {
            $(const _: () = {
                #[unsafe(export_name = norm_param_grad_sum_symbol!($param))]
                unsafe extern "ptx-kernel" fn entry(args: NormParamGradArgs) {
                    // SAFETY: the host validated `args`.
                    unsafe { crate::ops::norm::param_grad_sum::<$param>(&args) }
                }
            };
            const _: () = {
                #[unsafe(export_name = norm_column_copies_symbol!($param))]
                unsafe extern "ptx-kernel" fn entry(args: ColumnCopyArgs) {
                    // SAFETY: the host validated `args` and sized the output.
                    unsafe { crate::ops::norm::column_copies::<$param>(&args) }
                }
            };)*
        };
    }

    norm_param_kernels!(param_grad_entries, per_param_entries);
}

/// The cluster module: the softmax and norm kernels of the cluster path (sm_90).
#[cfg(feature = "cluster")]
mod cluster {
    crate::softmax_kernels!(cluster softmax_entries);
    crate::norm_kernels!(cluster norm_entries);
}

#[cfg(feature = "norm_ladder")]
mod norm_ladder {
    use crate::abi::NormLadderArgs;
    #[allow(unused_imports)]
    use crate::scalar::bf16;
    use crate::{kernel_symbol, norm_ladder_kernels};

    macro_rules! norm_ladder_entries {
        ($($rung:ident $name:ident $describe:literal: $($dtype:ident $pack:literal),+;)+) => {
            $($(
                const _: () = {
                    #[unsafe(export_name = kernel_symbol!(norm_ladder $name $dtype))]
                    unsafe extern "ptx-kernel" fn entry(args: NormLadderArgs) {
                        // SAFETY: the host validated `args` and chose the geometry and the
                        // alignment this rung needs.
                        unsafe { crate::ops::norm_ladder::$name::<$dtype, $pack>(&args) }
                    }
                };
            )+)+
        };
    }

    norm_ladder_kernels!(norm_ladder_entries);
}

#[cfg(feature = "batch_norm")]
mod batch_norm {
    #[allow(unused_imports)]
    use crate::ops::batch_norm::Activation::*;

    macro_rules! batch_norm_entries {
        ($(($K:ident $kind:ident $function:ident [$($activation:ident)?] $dtype:ident $pack:literal))*) => {
            $(const _: () = {
                #[unsafe(export_name = $crate::kernel_symbol!(batch_norm $kind $dtype; p $pack))]
                unsafe extern "ptx-kernel" fn entry(args: $crate::abi::BatchNormArgs) {
                    #[allow(unused_imports)]
                    use $crate::scalar::bf16;
                    // SAFETY: the host validated `args` and planned the launch for this kernel.
                    unsafe { $crate::ops::batch_norm::$function::<$dtype, $({ $activation },)? $pack>(&args) }
                }
            };)*
        };
    }

    crate::batch_norm_kernels!(all batch_norm_entries);
}
