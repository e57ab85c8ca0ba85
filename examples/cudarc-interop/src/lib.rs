//! rill on memory and a stream that cudarc owns.
//!
//! cudarc creates the stream and allocates every array; rill wraps them as views
//! ([`rill::View::from_raw`]) and queues `rms_norm` then `cross_entropy` on cudarc's stream
//! ([`rill::Stream::from_raw`]); cudarc reads the results back. Nothing is copied between
//! the two libraries and nothing synchronizes until cudarc's read.

use cudarc::driver::{CudaContext, DevicePtr, DevicePtrMut};
use rill::norm::{Forward, Norm, NormKind};
use rill::softmax::Softmax;
use rill::{RawStream, Stream, View, ViewMut};

/// Logits for the loss: `rows x cols` f32 normalized by RMSNorm with `weight`, then each
/// row's cross entropy against `target`.
pub struct Inputs {
    pub rows: usize,
    pub cols: usize,
    pub x: Vec<f32>,
    pub weight: Vec<f32>,
    pub target: Vec<i64>,
    pub eps: f32,
}

/// What cudarc read back: the normalized rows and the per-row losses.
pub struct Outputs {
    pub y: Vec<f32>,
    pub loss: Vec<f32>,
}

pub type Error = Box<dyn std::error::Error>;

/// Runs the two ops on GPU 0 through cudarc's memory and stream.
pub fn run(inputs: &Inputs) -> Result<Outputs, Error> {
    let Inputs { rows, cols, .. } = *inputs;
    // cudarc's side: the primary context, a stream, and the arrays.
    let context = CudaContext::new(0)?;
    let stream = context.new_stream()?;
    let x = stream.clone_htod(&inputs.x)?;
    let weight = stream.clone_htod(&inputs.weight)?;
    let target = stream.clone_htod(&inputs.target)?;
    let mut y = stream.alloc_zeros::<f32>(rows * cols)?;
    let mut loss = stream.alloc_zeros::<f32>(rows)?;

    // rill's side: the same device, cudarc's stream, views over cudarc's pointers.
    let gpu = rill::Gpu::new(0)?;
    {
        // SAFETY: cudarc's stream is live in GPU 0's primary context and outlives `on`,
        // and rill's work on it is done before cudarc's read, which it queues after it.
        let on = unsafe { Stream::from_raw(&gpu, stream.cu_stream() as RawStream)? };
        let (x_at, _x_used) = x.device_ptr(&stream);
        let (weight_at, _weight_used) = weight.device_ptr(&stream);
        let (target_at, _target_used) = target.device_ptr(&stream);
        let (y_at, _y_used) = y.device_ptr_mut(&stream);
        let (loss_at, _loss_used) = loss.device_ptr_mut(&stream);
        // SAFETY: each address is a live cudarc allocation of exactly these many elements,
        // used only on this stream until the guards above record that use.
        let (x, weight, target, mut y, mut loss) = unsafe {
            (
                View::<f32>::from_raw(x_at, &[rows, cols])?,
                View::<f32>::from_raw(weight_at, &[cols])?,
                View::<i64>::from_raw(target_at, &[rows])?,
                ViewMut::<f32>::from_raw(y_at, &[rows, cols])?,
                ViewMut::<f32>::from_raw(loss_at, &[rows])?,
            )
        };
        Norm::new().forward(&on, NormKind::RmsNorm, inputs.eps, Forward::new(&x, &mut y).weight(&weight))?;
        Softmax::new().cross_entropy(&on, &y, &target, &mut loss)?;
    }
    Ok(Outputs { y: stream.clone_dtoh(&y)?, loss: stream.clone_dtoh(&loss)? })
}
