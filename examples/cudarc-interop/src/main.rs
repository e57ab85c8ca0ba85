//! Runs the cudarc example on GPU 0 and prints a few losses; without a CUDA device it says
//! so and exits 0.

use rill_example_cudarc::{Inputs, run};

fn main() -> Result<(), rill_example_cudarc::Error> {
    if rill::Gpu::new(0).is_err() {
        println!("no CUDA device: nothing to run");
        return Ok(());
    }
    let (rows, cols) = (4, 1000);
    // A fixed, non-constant pattern: the GPU test checks random inputs against a reference.
    let x = (0..rows * cols).map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0).collect();
    let weight = (0..cols).map(|c| 0.5 + (c % 7) as f32 / 7.0).collect();
    let target = (0..rows as i64).map(|r| r * 97 % cols as i64).collect();
    let outputs = run(&Inputs { rows, cols, x, weight, target, eps: 1e-6 })?;
    println!("cross entropy of rms_norm(x) per row, on cudarc's stream and memory: {:?}", outputs.loss);
    Ok(())
}
