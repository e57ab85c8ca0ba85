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
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// The name used in kernel symbols and messages.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
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
