//! Tuning tables: which plan each bucket of row calls takes on a GPU, as `cargo xtask tune`
//! measured it there. rill ships the tables of the GPUs it was tuned on and picks one by the
//! device's name, else by its compute capability; calls a table has no entry for are planned
//! by rill's rules (`RILL_TUNING_TABLE=ladder`: by the ladder alone, warp path, shared
//! memory, clusters, uncached, each from the device's limits).
//!
//! A user's own table, from the tuner run on their GPU, takes over through the
//! `RILL_TUNING_TABLE` environment variable (a file) or [`set_tuning_table`]:
//!
//! ```
//! use rill::tuning::{Knobs, TuningTable};
//!
//! let table = TuningTable::parse(
//!     "gpu My GPU\n\
//!      compute-capability 8.9\n\
//!      softmax 16-bit 4096 * aligned shared 256\n\
//!      *       *      *    few *      uncached 128\n",
//! )?;
//! assert_eq!(table.entries[0].knobs, Knobs::Shared { block: 256, stages: 1, most_blocks_an_sm: None });
//! # if let Ok(gpu) = rill::Gpu::new(0) {
//! rill::tuning::set_tuning_table(&gpu, Some(table));
//! # }
//! # Ok::<(), rill::Error>(())
//! ```

pub use crate::ops::rows::tuning::{
    Alignment, Bucket, CLASSES, Entry, FEW_ROWS, Knobs, MOST_BLOCKS_AN_SM, Pattern, RowsBucket, TuningTable, WIDER,
    WIDTH_BUCKETS, width_bucket,
};
pub use crate::ops::rows::{set_tuning_table, tuning_table};
