//! rill: bandwidth-saturating GPU kernels written in Rust, and the host library that runs
//! them.
//!
//! ```no_run
//! use rill::{elementwise, Gpu, Tensor};
//! let gpu = Gpu::new(0)?;
//! let stream = gpu.stream()?;
//! let x = Tensor::from_slice(&gpu, &[1.0f32, -2.0, 3.0], &[3])?;
//! let mut y = Tensor::<f32>::zeros(&gpu, &[3])?;
//! elementwise::gelu(&stream, &x, &mut y)?;
//! stream.synchronize()?;
//! println!("{:?}", y.to_vec()?);
//! # Ok::<(), rill::Error>(())
//! ```
//!
//! Every op validates its arguments before launching: a wrong shape, dtype or view is an
//! [`Error::InvalidInput`] that says what to change, never a panic or a wrong answer.

/// The crate README's example, compiled as a doc test.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

mod driver;
mod error;
pub mod fuse;
mod gpu;
mod launch;
mod module;
pub mod nvtx;
mod ops;
mod tensor;
pub mod tuning;
mod workspace;

pub use error::{Error, Result};
pub use gpu::{DeviceInfo, Gpu, Graph, RawStream, Stream};
pub use launch::{LaunchConfig, LaunchCounts, WAVES, count_launches, grid_stride_blocks, launch_counts};
pub use module::{KernelKey, Module, ptx};
#[cfg(feature = "norm-ladder")]
pub use ops::norm_ladder;
pub use ops::{batch_norm, elementwise, norm, softmax};
pub use tensor::{AsView, AsViewMut, DType, Element, Tensor, View, ViewMut, copy};
