//! What a user's first program does with rill, built as a user builds it: stable Rust, the
//! packaged crates, no CUDA toolkit. On a GPU it runs RMSNorm and softmax over a few rows and
//! checks them against the CPU; without one it says so and succeeds.

use rill::norm::{Forward, Norm, NormKind};
use rill::softmax::Softmax;
use rill::{Gpu, Tensor};
use std::process::ExitCode;

const ROWS: usize = 3;
const COLS: usize = 1000;

fn main() -> ExitCode {
    let gpu = match Gpu::new(0) {
        Ok(gpu) => gpu,
        Err(error) => {
            println!("rill-outside: built; no CUDA device ({error}), nothing run");
            return ExitCode::SUCCESS;
        }
    };
    match run(&gpu) {
        Ok(worst) => {
            println!(
                "rill-outside: rms_norm and softmax on {} agree with the CPU (worst relative error {worst:.1e})",
                gpu.info().name
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("rill-outside: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Runs both ops; returns the worst relative error against the f64 reference.
fn run(gpu: &Gpu) -> Result<f64, Box<dyn std::error::Error>> {
    let stream = gpu.stream()?;
    let host: Vec<f32> = (0..ROWS * COLS).map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0).collect();
    let x = Tensor::from_slice(gpu, &host, &[ROWS, COLS])?;
    let weight = Tensor::from_slice(gpu, &vec![1.5f32; COLS], &[COLS])?;
    let (mut normed, mut probabilities) = (Tensor::zeros(gpu, &[ROWS, COLS])?, Tensor::zeros(gpu, &[ROWS, COLS])?);
    Norm::new().forward(&stream, NormKind::RmsNorm, 1e-6, Forward::new(&x, &mut normed).weight(&weight))?;
    Softmax::new().forward(&stream, &x, &mut probabilities, false)?;
    stream.synchronize()?;
    let (normed, probabilities) = (normed.to_vec()?, probabilities.to_vec()?);
    let mut worst = 0f64;
    for (row, values) in host.chunks(COLS).enumerate() {
        let values: Vec<f64> = values.iter().map(|&v| v as f64).collect();
        let rstd = 1.0 / (values.iter().map(|v| v * v).sum::<f64>() / COLS as f64 + 1e-6).sqrt();
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = values.iter().map(|v| (v - max).exp()).sum();
        for (col, v) in values.iter().enumerate() {
            let at = row * COLS + col;
            for (got, want) in [(normed[at], v * rstd * 1.5), (probabilities[at], (v - max).exp() / sum)] {
                let error = (got as f64 - want).abs() / want.abs().max(1e-6);
                if !(error < 1e-5) {
                    return Err(format!("row {row}, column {col}: {got} where the CPU gives {want}").into());
                }
                worst = worst.max(error);
            }
        }
    }
    Ok(worst)
}
