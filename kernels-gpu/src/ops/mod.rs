//! One generic body per op family; `entry` instantiates them.

#[cfg(feature = "elementwise")]
pub mod elementwise;
