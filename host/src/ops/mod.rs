//! One module per op family: validate, dispatch, launch.

pub mod batch_norm;
mod columns;
pub mod elementwise;
pub mod norm;
/// The RMSNorm optimization ladder: the benchmark's naive comparators, not part of the
/// library (the `norm-ladder` feature).
#[cfg(feature = "norm-ladder")]
pub mod norm_ladder;
pub(crate) mod rows;
pub mod softmax;
