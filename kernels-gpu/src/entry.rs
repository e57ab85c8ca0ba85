//! The exported kernels, instantiated from the tables in [`crate::abi`]. Nothing else in
//! the crate is `extern "ptx-kernel"`.

#[cfg(feature = "elementwise")]
mod elementwise {
    use crate::abi::ElementwiseArgs;
    use crate::functor::*;
    #[allow(unused_imports)]
    use crate::scalar::bf16;
    use crate::{for_each_elementwise_kernel, kernel_symbol};

    macro_rules! elementwise_entries {
        ($($op:ident $functor:ident $arity:literal: $($input:ident $output:ident),+;)+) => {
            $($(
                const _: () = {
                    #[unsafe(export_name = kernel_symbol!($op, $input, $output))]
                    unsafe extern "ptx-kernel" fn entry(args: ElementwiseArgs) {
                        // SAFETY: the host validated `args` against this symbol's dtypes.
                        unsafe { crate::ops::elementwise::run::<$functor, $input, $output, $arity>(&args) }
                    }
                };
            )+)+
        };
    }

    for_each_elementwise_kernel!(elementwise_entries);
}

/// A softmax-family entry point for `(kind path code dtype pack)`.
#[cfg(feature = "softmax")]
macro_rules! softmax_entry {
    ($kind:ident $path:ident $code:literal $dtype:ident $pack:literal) => {
        const _: () = {
            #[unsafe(export_name = $crate::softmax_symbol!($kind, $path, $dtype, $pack))]
            unsafe extern "ptx-kernel" fn entry(args: $crate::abi::SoftmaxArgs) {
                #[allow(unused_imports)]
                use $crate::scalar::bf16;
                // SAFETY: the host validated `args` and planned the launch for this path.
                unsafe { $crate::ops::softmax::$kind::<$dtype, $pack, $code>(&args) }
            }
        };
    };
}

/// A norm row-kernel entry point for `(kind path code x y param pack)`.
#[cfg(feature = "norm")]
macro_rules! norm_entry {
    ($kind:ident $path:ident $code:literal $x:ident $y:ident $param:ident $pack:literal) => {
        const _: () = {
            #[unsafe(export_name = $crate::norm_symbol!($kind, $path, $x, $y, $param, $pack))]
            unsafe extern "ptx-kernel" fn entry(args: $crate::abi::NormArgs) {
                #[allow(unused_imports)]
                use $crate::scalar::bf16;
                // SAFETY: the host validated `args` and planned the launch for this path.
                unsafe { $crate::ops::norm::$kind::<$x, $y, $param, $pack, $code>(&args) }
            }
        };
    };
}

#[cfg(all(feature = "softmax", not(feature = "cluster")))]
crate::for_each_softmax_kernel!(softmax_entry);

#[cfg(all(feature = "norm", not(feature = "cluster")))]
mod norm {
    use crate::abi::NormParamGradArgs;
    #[allow(unused_imports)]
    use crate::scalar::bf16;
    use crate::{for_each_norm_kernel, for_each_norm_param_grad_kernel, norm_symbol};

    for_each_norm_kernel!(norm_entry);

    macro_rules! param_grad_entry {
        ($x:ident $pack:literal) => {
            const _: () = {
                #[unsafe(export_name = norm_symbol!(param_grad, chunks, $x, f32, f32, $pack))]
                unsafe extern "ptx-kernel" fn entry(args: NormParamGradArgs) {
                    // SAFETY: the host validated `args` and sized grid and shared memory.
                    unsafe { crate::ops::norm::param_grad::<$x, $pack>(&args) }
                }
            };
        };
    }

    macro_rules! param_grad_sum_entry {
        ($param:ident) => {
            const _: () = {
                #[unsafe(export_name = norm_symbol!(param_grad_sum, columns, f32, f32, $param, 1))]
                unsafe extern "ptx-kernel" fn entry(args: NormParamGradArgs) {
                    // SAFETY: the host validated `args`.
                    unsafe { crate::ops::norm::param_grad_sum::<$param>(&args) }
                }
            };
        };
    }

    for_each_norm_param_grad_kernel!(param_grad_entry, param_grad_sum_entry);
}

/// The cluster module: the softmax and norm kernels of the cluster path (sm_90).
#[cfg(feature = "cluster")]
mod cluster {
    crate::for_each_softmax_cluster_kernel!(softmax_entry);
    crate::for_each_norm_cluster_kernel!(norm_entry);
}

#[cfg(feature = "norm_ladder")]
mod norm_ladder {
    use crate::abi::NormLadderArgs;
    #[allow(unused_imports)]
    use crate::scalar::bf16;
    use crate::{for_each_norm_ladder_kernel, norm_ladder_symbol};

    macro_rules! norm_ladder_entries {
        ($($rung:ident: $($dtype:ident $pack:literal),+;)+) => {
            $($(
                const _: () = {
                    #[unsafe(export_name = norm_ladder_symbol!($rung, $dtype))]
                    unsafe extern "ptx-kernel" fn entry(args: NormLadderArgs) {
                        // SAFETY: the host validated `args` and chose the geometry and the
                        // alignment this rung needs.
                        unsafe { crate::ops::norm_ladder::$rung::<$dtype, $pack>(&args) }
                    }
                };
            )+)+
        };
    }

    for_each_norm_ladder_kernel!(norm_ladder_entries);
}
