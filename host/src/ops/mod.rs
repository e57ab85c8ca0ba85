//! One module per op family: validate, dispatch, launch.

pub mod elementwise;
mod rows;
pub mod softmax;
