//! One module per op family: validate, dispatch, launch.

pub mod elementwise;
pub mod softmax;
