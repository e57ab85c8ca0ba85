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

#[cfg(feature = "softmax")]
mod softmax {
    use crate::abi::SoftmaxArgs;
    #[allow(unused_imports)]
    use crate::scalar::bf16;
    use crate::{for_each_softmax_kernel, softmax_symbol};

    macro_rules! softmax_entry {
        ($kind:ident $path:ident $code:literal $dtype:ident $pack:literal) => {
            const _: () = {
                #[unsafe(export_name = softmax_symbol!($kind, $path, $dtype, $pack))]
                unsafe extern "ptx-kernel" fn entry(args: SoftmaxArgs) {
                    // SAFETY: the host validated `args` and planned the launch for this path.
                    unsafe { crate::ops::softmax::$kind::<$dtype, $pack, $code>(&args) }
                }
            };
        };
    }

    for_each_softmax_kernel!(softmax_entry);
}
