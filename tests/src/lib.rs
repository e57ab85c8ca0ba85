//! Shared pieces of rill's tests and benchmarks: f64 CPU references ([`reference`](mod@crate::reference)),
//! seeded random inputs ([`random`]), error measurement ([`check`]), ops run by name
//! ([`ops`]), the paths to run row-wise cases on, asked of the planner ([`paths`]), the
//! shape tables both the tests and the benchmarks use ([`shapes`]), and the kernels a run
//! reached ([`coverage`]).

pub mod check;
pub mod coverage;
pub mod fuzz;
pub mod ops;
pub mod paths;
pub mod random;
pub mod reference;
pub mod shapes;

/// The GPU, or `None` after printing one line saying why `suite` is skipped.
pub fn gpu_or_skip(suite: &str) -> Option<rill::Gpu> {
    match rill::Gpu::new(0) {
        Ok(gpu) => Some(gpu),
        Err(error) => {
            println!("{suite}: skipped, no CUDA device ({error})");
            None
        }
    }
}
