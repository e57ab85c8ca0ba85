//! Elementwise ops: `y = f(x)`, `y = f(a, b)`, `y = f(a, b, c)` over same-shaped tensors,
//! and `y = gelu(x + bias)` with the bias broadcast along rows.
//!
//! Each op validates its arguments, picks the widest pack every address allows
//! ([`choose_pack`]) and launches the grid-stride kernel. Empty tensors are a no-op.

use crate::Stream;
use crate::error::{Error, Result, invalid};
use crate::launch::{LaunchConfig, launch};
use crate::module::{Kernel, KernelKey};
use crate::ops::{Span, Spans, check_disjoint};
use crate::tensor::{AsView, AsViewMut, DType, Element, View};
use rill_kernels_gpu::abi::{
    ELEMENTWISE_BLOCK_SIZE, ELEMENTWISE_MAX_INPUTS, ELEMENTWISE_PACKS_PER_THREAD, ElementwiseArgs, max_pack,
};
use smallvec::SmallVec;

pub use rill_kernels_gpu::table::ElementwiseOp;

/// `op`'s kernel from `input` to `output`, or what it supports.
fn kernel_key(op: ElementwiseOp, input: DType, output: DType) -> Result<KernelKey> {
    if op.dtypes().contains(&(input, output)) {
        return Ok(KernelKey::Elementwise { op, input, output });
    }
    let supported: Vec<_> = op.dtypes().iter().map(|(i, o)| format!("{}->{}", i.name(), o.name())).collect();
    Err(Error::Unsupported(format!(
        "elementwise `{}` from {} to {}; supported: {}",
        op.name(),
        input.name(),
        output.name(),
        supported.join(", ")
    )))
}

/// The widest pack (elements per vectorized access, a power of two up to `max_pack`) that
/// every array allows: each `(address, element bytes)` must be aligned to `pack * bytes`,
/// and a broadcast length must be a multiple of `pack`. Falls back to narrower packs,
/// down to 1, rather than failing.
pub fn choose_pack(max_pack: usize, arrays: &[(u64, usize)], broadcast_len: Option<usize>) -> usize {
    let mut pack = max_pack;
    while pack > 1 {
        let aligned = arrays.iter().all(|&(address, bytes)| address % (pack * bytes) as u64 == 0);
        let divides = broadcast_len.is_none_or(|len| len % pack == 0);
        if aligned && divides {
            break;
        }
        pack /= 2;
    }
    pack
}

/// Launch geometry for `len` elements in packs of `pack`.
pub fn launch_config(len: usize, pack: usize, device: &crate::DeviceInfo) -> LaunchConfig {
    let threads = (len / pack).div_ceil(ELEMENTWISE_PACKS_PER_THREAD) as u64;
    LaunchConfig::grid_stride(threads, ELEMENTWISE_BLOCK_SIZE, device)
}

/// Validates and launches elementwise kernel `op`. For `BiasAddGelu`, the one op that
/// broadcasts, the last input is a row vector as long as the output's trailing dimension.
fn run<I: Element, O: Element>(
    stream: &Stream,
    op: ElementwiseOp,
    inputs: &[View<'_, I>],
    output: &mut impl AsViewMut<O>,
) -> Result<()> {
    let key = kernel_key(op, I::DTYPE, O::DTYPE)?;
    debug_assert!(inputs.len() == op.arity());
    let broadcast = op == ElementwiseOp::BiasAddGelu;
    launch_over(stream, op.name(), broadcast, |gpu| gpu.modules().kernel(key), inputs, output)
}

/// Validates `inputs` and `output` for an elementwise kernel (`broadcast`: its last input
/// is a row vector as long as the output's trailing dimension), then launches the kernel
/// `kernel` gives: rill's own, or a user's (`crate::fuse`). `inputs` are as many as the
/// kernel takes (the caller checks).
pub(crate) fn launch_over<I: Element, O: Element>(
    stream: &Stream,
    op: &str,
    broadcast: bool,
    kernel: impl FnOnce(&crate::Gpu) -> Result<Kernel>,
    inputs: &[View<'_, I>],
    output: &mut impl AsViewMut<O>,
) -> Result<()> {
    debug_assert!(inputs.len() <= ELEMENTWISE_MAX_INPUTS);
    let output = output.as_view_mut();
    let (same_shape, broadcast_input) = if broadcast { inputs.split_at(inputs.len() - 1) } else { (inputs, &[][..]) };
    let shape = output.shape();
    if let Some((k, input)) = same_shape.iter().enumerate().find(|(_, input)| input.shape() != shape) {
        invalid!("`{op}`: input {k} has shape {:?} but the output has shape {shape:?}; they must match", input.shape());
    }
    let broadcast_len = match broadcast_input {
        [bias] => {
            let cols = shape.last().copied().unwrap_or(1);
            if bias.shape() != [cols] {
                invalid!(
                    "`{op}`: the bias has shape {:?} but must be [{cols}], the output's last dimension",
                    bias.shape()
                );
            }
            Some(cols)
        }
        _ => None,
    };
    let names: [&str; ELEMENTWISE_MAX_INPUTS] = ["input 0", "input 1", "input 2"];
    let reads: Spans<'_> = inputs.iter().zip(names).map(|(input, what)| Span::of(what, input)).collect();
    check_disjoint(op, &reads, &[Span::of("the output", &output)], true)?;
    if output.is_empty() {
        return Ok(());
    }
    let mut arrays: SmallVec<[(u64, usize); ELEMENTWISE_MAX_INPUTS + 1]> =
        inputs.iter().map(|v| (v.address(), I::DTYPE.size())).collect();
    arrays.push((output.address(), O::DTYPE.size()));
    let pack = choose_pack(max_pack(I::DTYPE.size(), O::DTYPE.size()), &arrays, broadcast_len);

    let args = ElementwiseArgs {
        len: output.len() as u64,
        output: output.address(),
        inputs: std::array::from_fn(|k| inputs.get(k).map_or(0, View::address)),
        broadcast_len: broadcast_len.unwrap_or(0) as u64,
        pack: pack as u32,
        reserved: 0,
    };
    let gpu = stream.gpu();
    gpu.bind()?;
    let kernel = kernel(gpu)?;
    let config = launch_config(output.len(), pack, gpu.info());
    // SAFETY: the kernel takes ElementwiseArgs with these dtypes (the caller's choice); every
    // input has the output's length (the bias `broadcast_len`), all views borrow live
    // allocations, and `pack` divides every address's alignment and the broadcast length.
    unsafe { launch(stream, kernel, config, &args) }
}

/// Ops from inputs of one dtype to an output of the same: `name(inputs) Op;`, each input an
/// `&impl AsView<T>`.
macro_rules! same_dtype_ops {
    ($($(#[$doc:meta])* $name:ident($($input:ident),+) $op:ident;)+) => {$(
        $(#[$doc])*
        ///
        #[doc = concat!(
            "```no_run\n# fn main() -> rill::Result<()> {\n",
            "let gpu = rill::Gpu::new(0)?;\nlet stream = gpu.stream()?;\n",
            $("let ", stringify!($input), " = rill::Tensor::<f32>::from_slice(&gpu, &[0.5; 1024], &[1024])?;\n",)+
            "let mut y = rill::Tensor::<f32>::zeros(&gpu, &[1024])?;\n",
            "rill::elementwise::", stringify!($name), "(&stream, ", $("&", stringify!($input), ", ",)+ "&mut y)?;\n",
            "# Ok(())\n# }\n```"
        )]
        pub fn $name<T: Element>(
            stream: &Stream,
            $($input: &impl AsView<T>,)+
            y: &mut impl AsViewMut<T>,
        ) -> Result<()> {
            run::<T, T>(stream, ElementwiseOp::$op, &[$($input.as_view()),+], y)
        }
    )+};
}

same_dtype_ops! {
    /// `y = max(x, 0)` (NaN stays NaN).
    relu(x) Relu;
    /// `y = x/2 * (1 + erf(x/sqrt(2)))`, PyTorch's `gelu(approximate="none")`.
    gelu(x) Gelu;
    /// `y = x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, PyTorch's `gelu(approximate="tanh")`.
    gelu_tanh(x) GeluTanh;
    /// `y = x * sigmoid(x)`, computed as `x / (1 + e^-x)`.
    silu(x) Silu;
    /// `y = 1 / (1 + e^-x)`.
    sigmoid(x) Sigmoid;
    /// `y = a + b`.
    add(a, b) Add;
    /// `y = a - b`.
    sub(a, b) Sub;
    /// `y = a * b`.
    mul(a, b) Mul;
    /// `y = a / b` (within 2 ulp of f32 division; computed with the fast reciprocal).
    div(a, b) Div;
    /// `y = a * b + c`, rounded once (PyTorch's `addcmul(c, a, b)`).
    fma(a, b, c) Fma;
    /// `y = gelu(x + bias)`, the bias (shape `[cols]`) broadcast along the rows of `x`
    /// (any shape whose last dimension is `cols`).
    bias_add_gelu(x, bias) BiasAddGelu;
}

/// `y = x` converted to another dtype, rounding to nearest even.
///
/// ```no_run
/// # fn main() -> rill::Result<()> {
/// # let gpu = rill::Gpu::new(0)?;
/// # let stream = gpu.stream()?;
/// let x = rill::Tensor::<f32>::from_slice(&gpu, &[1.0, 2.5, -3.0], &[3])?;
/// let mut y = rill::Tensor::<half::bf16>::zeros(&gpu, &[3])?;
/// rill::elementwise::cast(&stream, &x, &mut y)?;
/// # Ok(())
/// # }
/// ```
pub fn cast<I: Element, O: Element>(stream: &Stream, x: &impl AsView<I>, y: &mut impl AsViewMut<O>) -> Result<()> {
    if I::DTYPE == O::DTYPE {
        invalid!("cast from {} to itself: use `copy`", I::DTYPE.name());
    }
    run::<I, O>(stream, ElementwiseOp::Cast, &[x.as_view()], y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_is_the_widest_every_address_allows() {
        let f16 = 2;
        assert_eq!(choose_pack(8, &[(0x1000, f16), (0x2000, f16)], None), 8);
        // One array 8 bytes in: packs of 4 f16 still align.
        assert_eq!(choose_pack(8, &[(0x1008, f16), (0x2000, f16)], None), 4);
        // One element in: only single elements.
        assert_eq!(choose_pack(8, &[(0x1002, f16), (0x2000, f16)], None), 1);
        assert_eq!(choose_pack(4, &[(0x1004, 4)], None), 1);
        assert_eq!(choose_pack(4, &[(0x1008, 4)], None), 2);
    }

    #[test]
    fn pack_divides_the_broadcast_length() {
        assert_eq!(choose_pack(8, &[(0, 2)], Some(768)), 8);
        assert_eq!(choose_pack(8, &[(0, 2)], Some(12)), 4);
        assert_eq!(choose_pack(8, &[(0, 2)], Some(7)), 1);
    }

    #[test]
    fn every_op_has_a_kernel_for_every_float_dtype() {
        for op in ElementwiseOp::ALL.into_iter().filter(|&op| op != ElementwiseOp::Cast) {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let key = kernel_key(op, dtype, dtype).unwrap_or_else(|e| panic!("{op:?} {dtype:?}: {e}"));
                assert!(key.symbol().is_some_and(|s| s.starts_with("rill_")), "{op:?} {dtype:?}");
            }
        }
        for from in [DType::F32, DType::F16, DType::BF16] {
            for to in [DType::F32, DType::F16, DType::BF16] {
                assert_eq!(kernel_key(ElementwiseOp::Cast, from, to).is_ok(), from != to);
            }
        }
    }

    #[test]
    fn launch_covers_packs_with_two_per_thread() {
        let device = crate::launch::tests::h100();
        let config = launch_config(1 << 24, 8, &device);
        assert_eq!(config.block, 256);
        assert_eq!(config.grid, ((1u64 << 24) / 8 / 2 / 256) as u32);
        assert_eq!(launch_config(7, 8, &device).grid, 1);
    }
}
