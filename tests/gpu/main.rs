//! The GPU integration suite. Without a CUDA device it prints one line and exits 0.
//!
//! `cargo test -p rill-tests --test gpu -- [FILTER] [--quick] [--shard K/N] [--cover FILE |
//! --cases FILE]`: FILTER keeps the cases whose name contains it; `--quick` skips lengths
//! above 2^20 (for compute-sanitizer runs); `--shard K/N` runs the `K`th of `N` disjoint
//! parts (0/2 and 1/2 together are the whole suite); `--cover` and `--cases` choose and run
//! the subset that `cargo xtask sanitize` runs under compute-sanitizer (`harness::Selection`).
//! Inputs are fresh random data each run; the run's seed is printed, and `RILL_SEED=<seed>`
//! repeats it.

mod batch_norm;
mod determinism;
mod elementwise;
mod fused;
mod fuzz;
mod graph;
mod harness;
mod interop;
mod norm;
mod norm_ladder;
mod runs;
mod semantics;
mod softmax;

fn main() {
    let options = harness::Options::from_args();
    let Some(gpu) = rill_tests::gpu_or_skip("gpu") else { return };
    let mut suite = match harness::Suite::new(gpu, options) {
        Ok(suite) => suite,
        Err(error) => {
            println!("gpu: could not create a stream: {error}");
            std::process::exit(1);
        }
    };
    elementwise::run(&mut suite);
    softmax::run(&mut suite);
    norm_ladder::run(&mut suite);
    norm::run(&mut suite);
    batch_norm::run(&mut suite);
    semantics::run(&mut suite);
    determinism::run(&mut suite);
    interop::run_cases(&mut suite);
    interop::raw_views(&mut suite);
    fused::run_cases(&mut suite);
    graph::run_cases(&mut suite);
    fuzz::run(&mut suite);
    std::process::exit(suite.finish());
}
