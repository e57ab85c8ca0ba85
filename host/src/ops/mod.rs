//! One module per op family: validate, dispatch, launch.

pub mod elementwise;
pub mod norm;
pub mod norm_ladder;
mod rows;
pub mod softmax;
