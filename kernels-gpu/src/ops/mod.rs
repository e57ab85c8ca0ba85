//! One generic body per op family; `entry` instantiates them.

#[cfg(feature = "elementwise")]
pub mod elementwise;

#[cfg(feature = "softmax")]
pub mod softmax;

#[cfg(any(feature = "softmax", feature = "norm"))]
mod rows;

#[cfg(feature = "norm")]
pub mod norm;

#[cfg(feature = "norm_ladder")]
pub mod norm_ladder;
