//! One generic body per op family; `entry` instantiates them.

#[cfg(any(feature = "softmax", feature = "norm"))]
#[cfg_attr(feature = "fuse", allow(dead_code))]
#[macro_use]
pub(crate) mod rows;

#[cfg(feature = "elementwise")]
#[cfg_attr(feature = "fuse", allow(dead_code))]
pub mod elementwise;

// A user's kernel crate (`fuse`) takes the softmax body alone, through `crate::fuse`.
#[cfg(feature = "softmax")]
#[cfg_attr(feature = "fuse", allow(dead_code))]
pub mod softmax;

// The cluster module instantiates the row kernels only, not the parameter gradients;
// BatchNorm folds its column sums in its own finalize, not through the column totals.
#[cfg(any(feature = "norm", feature = "batch_norm"))]
#[cfg_attr(any(feature = "cluster", feature = "fuse", not(feature = "norm")), allow(dead_code))]
mod columns;

// A user's kernel crate (`fuse`) takes the forward body alone, through `crate::fuse`.
#[cfg(feature = "norm")]
#[cfg_attr(any(feature = "cluster", feature = "fuse"), allow(dead_code, unused_imports))]
pub mod norm;

#[cfg(feature = "norm_ladder")]
pub mod norm_ladder;

#[cfg(feature = "batch_norm")]
pub mod batch_norm;
