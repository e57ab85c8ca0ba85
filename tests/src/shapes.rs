//! Shapes shared by the tests and the benchmarks.

/// Elementwise lengths the GPU suite covers: empty, single, around one pack, around a
/// block's worth of packs, a large odd length, and 2^26.
pub const ELEMENTWISE_TEST_LENGTHS: &[usize] = &[0, 1, 7, 8, 4095, 4097, (1 << 20) + 3, 1 << 26];

/// Row widths for the broadcast (bias) ops: one column, odd, pack-sized, model-sized.
pub const BIAS_COLS: &[usize] = &[1, 7, 8, 768, 4097];

/// Elementwise lengths the benchmark sweeps: 2^16 to 2^28 by factors of 4.
pub const ELEMENTWISE_BENCH_LENGTHS: &[usize] = &[1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28];
