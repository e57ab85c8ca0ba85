//! One generic body per op family; `entry` instantiates them.

#[cfg(feature = "elementwise")]
pub mod elementwise;

#[cfg(feature = "softmax")]
pub mod softmax;
