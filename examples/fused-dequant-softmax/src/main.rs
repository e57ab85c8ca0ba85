//! Runs the fused dequantize + softmax once and prints a row's largest probability; without
//! a CUDA device it says so and exits 0.

use half::bf16;
use rill::Tensor;
use rill_example_fused_dequant_softmax::DequantKernels;

fn main() -> rill::Result<()> {
    let Ok(gpu) = rill::Gpu::new(0) else {
        println!("no CUDA device: nothing to run");
        return Ok(());
    };
    let stream = gpu.stream()?;
    let (rows, cols) = (4, 32000);
    let q: Vec<i8> = (0..rows * cols).map(|i| (i * 7919 % 255) as i8).collect();
    let scale: Vec<f32> = (0..rows).map(|r| 0.01 + r as f32 * 0.005).collect();
    let bias: Vec<bf16> = (0..cols).map(|c| bf16::from_f32((c % 13) as f32 * 0.1)).collect();
    let (q, scale, bias) = (
        Tensor::from_slice(&gpu, &q, &[rows, cols])?,
        Tensor::from_slice(&gpu, &scale, &[rows])?,
        Tensor::from_slice(&gpu, &bias, &[cols])?,
    );
    let mut out = Tensor::<bf16>::zeros(&gpu, &[rows, cols])?;
    let kernels = DequantKernels::load(&gpu)?;
    let plan = kernels.dequant_softmax(&stream, &q, &scale, &bias, &mut out)?;
    stream.synchronize()?;
    let probabilities = out.to_vec()?;
    let largest = probabilities[..cols].iter().map(|p| p.to_f32()).fold(0.0, f32::max);
    println!("softmax(dequantize(q)) on {}: row 0's largest probability {largest}", plan.describe());
    Ok(())
}
