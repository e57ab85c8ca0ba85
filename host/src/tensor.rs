//! Typed device tensors: an owning [`Tensor`] and borrowed views ([`View`], [`ViewMut`])
//! that carry shape, dtype and address, so ops can check shapes and alignment before any
//! launch. Tensors are contiguous and row-major; a view may start at any element offset.

use crate::driver::{DeviceMemory, sys};
use crate::error::{DriverContext, Result, invalid};
use crate::gpu::Gpu;
use std::marker::PhantomData;
use std::ops::Range;

pub use rill_kernels_gpu::abi::DType;

/// A host element type with a device counterpart: plain bytes (`bytemuck::Pod`), so a
/// tensor's contents copy to and from the device as they are.
pub trait Element: bytemuck::Pod + Default + PartialEq + std::fmt::Debug + Send + Sync + 'static {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    /// Rounds to nearest even (16-bit types through f32: `half`'s own f64 conversions
    /// misround about 2 in 10^4 values, its f32 ones are exact).
    fn from_f64(x: f64) -> Self;
}

/// `Element` for `$t`, with its conversions from and to f64 written over `$v` and `$x`.
macro_rules! element {
    ($($t:ty: $dtype:ident, |$v:ident| $to_f64:expr, |$x:ident| $from_f64:expr;)+) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$dtype;
            fn to_f64(self) -> f64 {
                let $v = self;
                $to_f64
            }
            fn from_f64($x: f64) -> Self {
                $from_f64
            }
        }
    )+};
}

element! {
    f32: F32, |v| v as f64, |x| x as f32;
    half::f16: F16, |v| v.to_f64(), |x| half::f16::from_f32(x as f32);
    half::bf16: BF16, |v| v.to_f64(), |x| half::bf16::from_f32(x as f32);
    i64: I64, |v| v as f64, |x| x as i64;
    u32: U32, |v| v as f64, |x| x as u32;
    i8: I8, |v| v as f64, |x| x as i8;
}

/// Waits for all work queued in the current context (on every stream).
fn synchronize_context() -> Result<()> {
    // SAFETY: the caller bound the GPU's context.
    unsafe { sys::cuCtxSynchronize() }.during("cuCtxSynchronize")
}

fn element_count(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .map_or_else(|| invalid!("shape {shape:?} has more elements than fit in memory"), Ok)
}

/// A contiguous row-major tensor in device memory.
pub struct Tensor<T: Element> {
    // None for empty tensors: the driver allocates no zero-byte buffers.
    buffer: Option<DeviceMemory>,
    shape: Vec<usize>,
    gpu: Gpu,
    _element: PhantomData<T>,
}

impl<T: Element> Tensor<T> {
    /// Copies `data` to the device as a tensor of `shape`.
    pub fn from_slice(gpu: &Gpu, data: &[T], shape: &[usize]) -> Result<Self> {
        let len = element_count(shape)?;
        if len != data.len() {
            invalid!("shape {shape:?} holds {len} elements but {} were given", data.len());
        }
        Self::filled(gpu, shape, len, |buffer| buffer.copy_from_host(bytemuck::cast_slice(data)))
    }

    /// A tensor of `shape` filled with zeros.
    pub fn zeros(gpu: &Gpu, shape: &[usize]) -> Result<Self> {
        // All-zero bits are 0 in every Element type.
        Self::filled(gpu, shape, element_count(shape)?, DeviceMemory::zero)
    }

    /// A tensor of `shape` (`len` elements) whose memory `fill` sets before anyone can read it.
    fn filled(
        gpu: &Gpu,
        shape: &[usize],
        len: usize,
        fill: impl FnOnce(&mut DeviceMemory) -> Result<()>,
    ) -> Result<Self> {
        gpu.bind()?;
        let buffer = match len {
            0 => None,
            _ => {
                let mut buffer = DeviceMemory::alloc(len * size_of::<T>())?;
                fill(&mut buffer)?;
                Some(buffer)
            }
        };
        Ok(Tensor { buffer, shape: shape.to_vec(), gpu: gpu.clone(), _element: PhantomData })
    }

    /// Overwrites the tensor with `data` (same element count), after all work queued on this
    /// GPU has finished.
    pub fn copy_from_slice(&mut self, data: &[T]) -> Result<()> {
        if data.len() != self.len() {
            invalid!("tensor of shape {:?} holds {} elements but {} were given", self.shape, self.len(), data.len());
        }
        self.gpu.bind()?;
        synchronize_context()?;
        match &mut self.buffer {
            Some(buffer) => buffer.copy_from_host(bytemuck::cast_slice(data)),
            None => Ok(()),
        }
    }

    /// Copies the tensor to the host, after all work queued on this GPU has finished (the
    /// copy runs on the legacy stream, which does not wait for non-blocking streams).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.gpu.bind()?;
        synchronize_context()?;
        let mut host = vec![T::default(); self.len()];
        if let Some(buffer) = &self.buffer {
            buffer.copy_to_host(bytemuck::cast_slice_mut(&mut host))?;
        }
        Ok(host)
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dtype(&self) -> DType {
        T::DTYPE
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    fn address(&self) -> u64 {
        self.buffer.as_ref().map_or(0, DeviceMemory::address)
    }

    pub fn view(&self) -> View<'_, T> {
        View { address: self.address(), shape: self.shape.clone(), _borrow: PhantomData }
    }

    pub fn view_mut(&mut self) -> ViewMut<'_, T> {
        ViewMut { address: self.address(), shape: self.shape.clone(), _borrow: PhantomData }
    }
}

/// A read-only view of (part of) a tensor.
#[derive(Clone, Debug)]
pub struct View<'a, T> {
    address: u64,
    shape: Vec<usize>,
    _borrow: PhantomData<&'a T>,
}

/// A writable view of (part of) a tensor.
#[derive(Debug)]
pub struct ViewMut<'a, T> {
    address: u64,
    shape: Vec<usize>,
    _borrow: PhantomData<&'a mut T>,
}

macro_rules! view_common {
    ($view:ident) => {
        impl<'a, T: Element> $view<'a, T> {
            pub fn shape(&self) -> &[usize] {
                &self.shape
            }

            pub fn len(&self) -> usize {
                self.shape.iter().product()
            }

            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }

            /// Device address of the first element.
            pub fn address(&self) -> u64 {
                self.address
            }

            /// A view of `shape` over device memory another library allocated and owns
            /// (cudarc's `CudaSlice`, PyTorch's `data_ptr()`), so that rill's ops read or
            /// write it in place. Ops take any element-aligned address: where it is not
            /// aligned to 16 bytes they run narrower packs.
            ///
            /// Fails with [`Error::InvalidInput`] where `address` is null (a view of no
            /// elements may be) or not a multiple of the element's size, or the shape's
            /// element count overflows.
            ///
            /// # Safety
            /// For as long as the view, and any work rill queued on it, lives:
            /// - `address .. address + len * size_of::<T>()` is device memory of the
            ///   primary context of the `Gpu` the ops run on (or managed memory), holding
            ///   initialized elements where an op reads them;
            /// - nothing else writes it (for a `ViewMut`, nothing else reads it either)
            ///   unless ordered with rill's work on the same stream;
            /// - the owner does not free it.
            ///
            /// [`Error::InvalidInput`]: crate::Error::InvalidInput
            pub unsafe fn from_raw(address: u64, shape: &[usize]) -> Result<Self> {
                let len = element_count(shape)?;
                if address == 0 && len > 0 {
                    invalid!("a null device pointer for a view of shape {shape:?}: give the allocation's address");
                }
                if !address.is_multiple_of(size_of::<T>() as u64) {
                    invalid!(
                        "device address {address:#x} is not aligned to its {}-byte elements: give an element-aligned \
                         address",
                        size_of::<T>()
                    );
                }
                if len.checked_mul(size_of::<T>()).and_then(|bytes| address.checked_add(bytes as u64)).is_none() {
                    invalid!("a view of shape {shape:?} at {address:#x} runs past the end of the address space");
                }
                Ok($view { address, shape: shape.to_vec(), _borrow: PhantomData })
            }

            /// A view of no allocation, for unit tests of what an op records before it
            /// touches a device.
            #[cfg(test)]
            pub(crate) fn detached(address: u64, shape: &[usize]) -> Self {
                $view { address, shape: shape.to_vec(), _borrow: PhantomData }
            }

            /// The same elements as `shape` (same count).
            pub fn reshape(self, shape: &[usize]) -> Result<Self> {
                if element_count(shape)? != self.len() {
                    invalid!("cannot reshape {:?} ({} elements) to {shape:?}", self.shape, self.len());
                }
                Ok($view { address: self.address, shape: shape.to_vec(), _borrow: PhantomData })
            }

            /// Elements `range` of the flattened view, as a 1-D view. Its address is
            /// `range.start` elements in, so it may be less aligned than the tensor.
            pub fn slice(self, range: Range<usize>) -> Result<Self> {
                if range.start > range.end || range.end > self.len() {
                    invalid!("slice {range:?} is outside a view of {} elements", self.len());
                }
                let address = self.address + (range.start * size_of::<T>()) as u64;
                Ok($view { address, shape: vec![range.len()], _borrow: PhantomData })
            }
        }
    };
}

view_common!(View);
view_common!(ViewMut);

/// Anything an op can read: tensors and views.
pub trait AsView<T: Element> {
    fn as_view(&self) -> View<'_, T>;
}

/// Anything an op can write: tensors and mutable views.
pub trait AsViewMut<T: Element> {
    fn as_view_mut(&mut self) -> ViewMut<'_, T>;
}

impl<T: Element> AsView<T> for Tensor<T> {
    fn as_view(&self) -> View<'_, T> {
        self.view()
    }
}

impl<T: Element> AsView<T> for View<'_, T> {
    fn as_view(&self) -> View<'_, T> {
        self.clone()
    }
}

impl<T: Element> AsView<T> for ViewMut<'_, T> {
    fn as_view(&self) -> View<'_, T> {
        View { address: self.address, shape: self.shape.clone(), _borrow: PhantomData }
    }
}

impl<T: Element> AsViewMut<T> for Tensor<T> {
    fn as_view_mut(&mut self) -> ViewMut<'_, T> {
        self.view_mut()
    }
}

impl<T: Element> AsViewMut<T> for ViewMut<'_, T> {
    fn as_view_mut(&mut self) -> ViewMut<'_, T> {
        ViewMut { address: self.address, shape: self.shape.clone(), _borrow: PhantomData }
    }
}

/// Device-to-device copy of `src` into `dst` (same shape), queued on `stream`: the
/// bandwidth ceiling the benchmarks measure every kernel against.
///
/// ```no_run
/// # fn main() -> rill::Result<()> {
/// # let gpu = rill::Gpu::new(0)?;
/// # let stream = gpu.stream()?;
/// let src = rill::Tensor::<f32>::from_slice(&gpu, &[1.0, 2.0], &[2])?;
/// let mut dst = rill::Tensor::<f32>::zeros(&gpu, &[2])?;
/// rill::copy(&stream, &src, &mut dst)?;
/// # Ok(())
/// # }
/// ```
pub fn copy<T: Element>(stream: &crate::Stream, src: &impl AsView<T>, dst: &mut impl AsViewMut<T>) -> Result<()> {
    let (src, dst) = (src.as_view(), dst.as_view_mut());
    if src.shape() != dst.shape() {
        invalid!("copy from shape {:?} into shape {:?}: shapes must match", src.shape(), dst.shape());
    }
    if src.is_empty() {
        return Ok(());
    }
    stream.gpu().bind()?;
    let bytes = src.len() * size_of::<T>();
    // SAFETY: both views borrow live allocations of `len` elements of T.
    unsafe {
        sys::cuMemcpyDtoDAsync_v2(dst.address(), src.address(), bytes, stream.as_raw()).during("cuMemcpyDtoDAsync")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    fn rejected<V>(made: Result<V>) -> String {
        match made {
            Err(Error::InvalidInput(message)) => message,
            Err(other) => panic!("expected an invalid-input error, got {other}"),
            Ok(_) => panic!("expected an invalid-input error, got a view"),
        }
    }

    #[test]
    fn foreign_views_check_what_they_can() {
        // SAFETY (each call): the views are never handed to an op.
        unsafe {
            assert!(rejected(View::<f32>::from_raw(0, &[4])).contains("null"));
            assert!(rejected(ViewMut::<f32>::from_raw(0x1002, &[4])).contains("aligned"));
            assert!(rejected(View::<f32>::from_raw(u64::MAX - 3, &[4])).contains("address space"));
            assert!(rejected(View::<f32>::from_raw(0x1000, &[usize::MAX, 2])).contains("more elements"));
            assert_eq!(View::<f32>::from_raw(0, &[0, 7]).map(|v| v.len()).ok(), Some(0));
            // Element-aligned but not pack-aligned: the ops run narrower packs.
            assert_eq!(ViewMut::<half::f16>::from_raw(0x1002, &[3, 5]).map(|v| v.address()).ok(), Some(0x1002));
        }
    }
}
