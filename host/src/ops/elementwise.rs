//! Elementwise ops: `y = f(x)`, `y = f(a, b)`, `y = f(a, b, c)` over same-shaped tensors,
//! and `y = gelu(x + bias)` with the bias broadcast along rows.
//!
//! Each op validates its arguments, picks the widest pack every address allows
//! ([`choose_pack`]) and launches the grid-stride kernel. Empty tensors are a no-op.

use crate::Stream;
use crate::error::{Error, Result, invalid};
use crate::launch::{LaunchConfig, grid_stride_blocks, launch};
use crate::module::PtxModule;
use crate::tensor::{AsView, AsViewMut, DType, Element, View};
use rill_kernels_gpu::abi::{
    ELEMENTWISE_BLOCK_SIZE, ELEMENTWISE_MAX_INPUTS, ELEMENTWISE_PACKS_PER_THREAD, ElementwiseArgs, max_pack,
};
use rill_kernels_gpu::{dtype_of, for_each_elementwise_kernel, kernel_symbol};

/// One exported elementwise kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelEntry {
    pub op: &'static str,
    pub arity: usize,
    pub input: DType,
    pub output: DType,
    pub symbol: &'static str,
}

macro_rules! kernel_entries {
    ($($op:ident $functor:ident $arity:literal: $($input:ident $output:ident),+;)+) => {
        &[$($(KernelEntry {
            op: stringify!($op),
            arity: $arity,
            input: dtype_of!($input),
            output: dtype_of!($output),
            symbol: kernel_symbol!($op, $input, $output),
        },)+)+]
    };
}

/// Every elementwise kernel in the PTX, from the table the device crate instantiates.
pub const KERNELS: &[KernelEntry] = for_each_elementwise_kernel!(kernel_entries);

fn kernel_entry(op: &str, input: DType, output: DType) -> Result<&'static KernelEntry> {
    KERNELS.iter().find(|k| k.op == op && k.input == input && k.output == output).ok_or_else(|| {
        Error::Unsupported(format!(
            "elementwise `{op}` from {} to {}; supported: {}",
            input.name(),
            output.name(),
            KERNELS
                .iter()
                .filter(|k| k.op == op)
                .map(|k| format!("{}->{}", k.input.name(), k.output.name()))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
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
    LaunchConfig {
        grid: grid_stride_blocks(threads, ELEMENTWISE_BLOCK_SIZE, device),
        block: ELEMENTWISE_BLOCK_SIZE,
        shared_bytes: 0,
        cluster: 1,
    }
}

/// Validates and launches elementwise kernel `op`. With `broadcast`, the last input is a
/// row vector whose length divides the output's trailing dimension.
fn run<I: Element, O: Element>(
    stream: &Stream,
    op: &'static str,
    inputs: &[View<'_, I>],
    broadcast: bool,
    output: &mut impl AsViewMut<O>,
) -> Result<()> {
    let entry = kernel_entry(op, I::DTYPE, O::DTYPE)?;
    let output = output.as_view_mut();
    debug_assert!(inputs.len() == entry.arity && inputs.len() <= ELEMENTWISE_MAX_INPUTS);
    let (same_shape, broadcast_input) = if broadcast { inputs.split_at(inputs.len() - 1) } else { (inputs, &[][..]) };
    for (k, input) in same_shape.iter().enumerate() {
        if input.shape() != output.shape() {
            invalid!(
                "`{op}`: input {k} has shape {:?} but the output has shape {:?}; they must match",
                input.shape(),
                output.shape()
            );
        }
    }
    let broadcast_len = match broadcast_input {
        [bias] => {
            let cols = output.shape().last().copied().unwrap_or(1);
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
    if output.is_empty() {
        return Ok(());
    }
    let mut arrays: Vec<(u64, usize)> = inputs.iter().map(|v| (v.address(), I::DTYPE.size())).collect();
    arrays.push((output.address(), O::DTYPE.size()));
    let pack = choose_pack(max_pack(I::DTYPE.size(), O::DTYPE.size()), &arrays, broadcast_len);

    let mut addresses = [0u64; ELEMENTWISE_MAX_INPUTS];
    for (slot, input) in addresses.iter_mut().zip(inputs) {
        *slot = input.address();
    }
    let args = ElementwiseArgs {
        len: output.len() as u64,
        output: output.address(),
        inputs: addresses,
        broadcast_len: broadcast_len.unwrap_or(0) as u64,
        pack: pack as u32,
        reserved: 0,
    };
    let gpu = stream.gpu();
    gpu.bind()?;
    let kernel = gpu.modules().kernel(PtxModule::Elementwise, entry.symbol)?;
    let config = launch_config(output.len(), pack, gpu.info());
    // SAFETY: `entry.symbol` takes ElementwiseArgs with these dtypes; every input has the
    // output's length (the bias `broadcast_len`), all views borrow live allocations, and
    // `pack` divides every address's alignment and the broadcast length.
    unsafe { launch(stream, kernel, config, &args) }
}

macro_rules! unary_ops {
    ($($(#[$doc:meta])* $name:ident;)+) => {$(
        $(#[$doc])*
        pub fn $name<T: Element>(stream: &Stream, x: &impl AsView<T>, y: &mut impl AsViewMut<T>) -> Result<()> {
            run::<T, T>(stream, stringify!($name), &[x.as_view()], false, y)
        }
    )+};
}

unary_ops! {
    /// `y = max(x, 0)` (NaN stays NaN).
    relu;
    /// `y = x/2 * (1 + erf(x/sqrt(2)))`, PyTorch's `gelu(approximate="none")`.
    gelu;
    /// `y = x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, PyTorch's `gelu(approximate="tanh")`.
    gelu_tanh;
    /// `y = x * sigmoid(x)`.
    silu;
    /// `y = 1 / (1 + e^-x)`.
    sigmoid;
}

macro_rules! binary_ops {
    ($($(#[$doc:meta])* $name:ident;)+) => {$(
        $(#[$doc])*
        pub fn $name<T: Element>(stream: &Stream, a: &impl AsView<T>, b: &impl AsView<T>, y: &mut impl AsViewMut<T>) -> Result<()> {
            run::<T, T>(stream, stringify!($name), &[a.as_view(), b.as_view()], false, y)
        }
    )+};
}

binary_ops! {
    /// `y = a + b`.
    add;
    /// `y = a - b`.
    sub;
    /// `y = a * b`.
    mul;
    /// `y = a / b` (within 2 ulp of f32 division; computed with the fast reciprocal).
    div;
}

/// `y = a * b + c`, rounded once (PyTorch's `addcmul(c, a, b)`).
pub fn fma<T: Element>(
    stream: &Stream,
    a: &impl AsView<T>,
    b: &impl AsView<T>,
    c: &impl AsView<T>,
    y: &mut impl AsViewMut<T>,
) -> Result<()> {
    run::<T, T>(stream, "fma", &[a.as_view(), b.as_view(), c.as_view()], false, y)
}

/// `y = gelu(x + bias)`, the bias (shape `[cols]`) broadcast along the rows of `x`
/// (any shape whose last dimension is `cols`).
pub fn bias_add_gelu<T: Element>(
    stream: &Stream,
    x: &impl AsView<T>,
    bias: &impl AsView<T>,
    y: &mut impl AsViewMut<T>,
) -> Result<()> {
    run::<T, T>(stream, "bias_add_gelu", &[x.as_view(), bias.as_view()], true, y)
}

/// `y = x` converted to another dtype, rounding to nearest even.
pub fn cast<I: Element, O: Element>(stream: &Stream, x: &impl AsView<I>, y: &mut impl AsViewMut<O>) -> Result<()> {
    if I::DTYPE == O::DTYPE {
        invalid!("cast from {} to itself: use `copy`", I::DTYPE.name());
    }
    run::<I, O>(stream, "cast", &[x.as_view()], false, y)
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
        for op in ["relu", "gelu", "gelu_tanh", "silu", "sigmoid", "add", "sub", "mul", "div", "fma", "bias_add_gelu"] {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                assert!(kernel_entry(op, dtype, dtype).is_ok(), "{op} {dtype:?}");
            }
        }
        for from in [DType::F32, DType::F16, DType::BF16] {
            for to in [DType::F32, DType::F16, DType::BF16] {
                assert_eq!(kernel_entry("cast", from, to).is_ok(), from != to);
            }
        }
    }

    #[test]
    fn symbols_are_unique_and_prefixed() {
        let mut symbols: Vec<_> = KERNELS.iter().map(|k| k.symbol).collect();
        symbols.sort();
        symbols.dedup();
        assert_eq!(symbols.len(), KERNELS.len());
        assert!(symbols.iter().all(|s| s.starts_with("rill_")));
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
