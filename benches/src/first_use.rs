//! `rill-bench --first-use`: how long a process waits for each op family's first result,
//! from `Gpu::new` (which it times too), in the order a training step meets them. The first
//! call of a family loads its module: its machine code where rill ships it for this GPU, else
//! its PTX, which the driver compiles (and caches: run with `CUDA_CACHE_DISABLE=1` for a
//! machine whose cache is empty; `RILL_LOAD_PTX=1` loads the PTX even where machine code
//! ships, for the time without it).

use half::bf16;
use rill::norm::{Forward, Norm, NormKind};
use rill::softmax::Softmax;
use rill::{Gpu, Stream, Tensor, batch_norm, elementwise};
use std::error::Error;
use std::time::Instant;

const ROWS: usize = 4096;
const COLS: usize = 1024;

pub fn run() -> Result<(), Box<dyn Error>> {
    let started = Instant::now();
    let gpu = match Gpu::new(0) {
        Ok(gpu) => gpu,
        Err(error) => {
            println!("no CUDA device ({error}): nothing measured");
            return Ok(());
        }
    };
    let stream = gpu.stream()?;
    println!("{:<12} {:>9}", "first use", "seconds");
    println!("{:<12} {:>9.3}", "Gpu::new", started.elapsed().as_secs_f64());
    let shape = [ROWS, COLS];
    let x = Tensor::<bf16>::zeros(&gpu, &shape)?;
    let weight = Tensor::<bf16>::zeros(&gpu, &[COLS])?;
    let mut y = Tensor::<bf16>::zeros(&gpu, &shape)?;
    let mut mask = Tensor::<u32>::zeros(&gpu, &[batch_norm::mask_words(ROWS * COLS)])?;
    let time = |family: &str, call: &mut dyn FnMut(&Stream) -> rill::Result<()>| -> rill::Result<()> {
        let started = Instant::now();
        call(&stream)?;
        stream.synchronize()?;
        println!("{family:<12} {:>9.3}", started.elapsed().as_secs_f64());
        Ok(())
    };
    time("norm", &mut |s| {
        Norm::new().forward(s, NormKind::RmsNorm, 1e-6, Forward::new(&x, &mut y).weight(&weight)).map(drop)
    })?;
    time("softmax", &mut |s| Softmax::new().forward(s, &x, &mut y, false).map(drop))?;
    time("elementwise", &mut |s| elementwise::silu(s, &x, &mut y))?;
    time("batch_norm", &mut |s| batch_norm::relu_with_mask(s, &x, &mut y, &mut mask))?;
    Ok(())
}
