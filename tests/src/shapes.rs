//! Shapes shared by the tests and the benchmarks.

/// Elementwise lengths the GPU suite covers: empty, single, around one pack, around a
/// block's worth of packs, a large odd length, and 2^26.
pub const ELEMENTWISE_TEST_LENGTHS: &[usize] = &[0, 1, 7, 8, 4095, 4097, (1 << 20) + 3, 1 << 26];

/// Row widths for the broadcast (bias) ops: one column, odd, pack-sized, model-sized.
pub const BIAS_COLS: &[usize] = &[1, 7, 8, 768, 4097];

/// Elementwise lengths the benchmark sweeps: 2^16 to 2^28 by factors of 4.
pub const ELEMENTWISE_BENCH_LENGTHS: &[usize] = &[1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28];

/// Softmax row widths the GPU suite covers: tiny, around warp and pack multiples, each warp
/// tier at the widest pack and at pack 1 (257 and 512 the 16-element tier, 701 and 768 the
/// 24, 1000 and 1023 the 32), the warp path's limit, odd widths, vocabulary-sized rows and
/// rows past shared memory (262144: an f32 backward's two arrays take a cluster of 16
/// blocks on an H100).
pub const SOFTMAX_TEST_COLS: &[usize] = &[
    1, 2, 3, 31, 32, 33, 127, 257, 512, 701, 768, 1000, 1023, 1024, 1025, 2047, 4096, 4097, 12345, 32768, 50257,
    131072, 262144,
];

/// Row counts for a width: 1, 2, 3 and a large count (about 2^21 elements, at most 49152).
pub fn softmax_test_rows(cols: usize) -> [usize; 4] {
    [1, 2, 3, ((1 << 21) / cols).clamp(4, 49152)]
}

/// Shapes whose rows outnumber a wave of the widest warp tier's resident rows (2640 on an
/// H200), so the rows it requests ahead into L2 (`Plan::ahead`) are among those tested.
pub const AHEAD_TEST_SHAPES: &[(usize, usize)] = &[(8192, 1000), (8192, 1024)];

/// The benchmark sweep: 49152 rows of 32 to 32768 columns, and 4096 rows up to 262144.
pub fn softmax_bench_shapes() -> Vec<(usize, usize)> {
    let mut shapes: Vec<(usize, usize)> = (5..=15).map(|p| (49152, 1 << p)).collect();
    shapes.extend([
        (49152, 768),
        (49152, 1000),
        (4096, 32001),
        (4096, 50257),
        (4096, 65536),
        (4096, 131072),
        (4096, 262144),
    ]);
    shapes
}

/// Norm row widths the GPU suite covers: softmax's but 1023, 24576, and 65536 instead of
/// 131072 (on an H100 a forward row of 65536 f32 is past shared memory, and a backward row,
/// which caches two arrays, already at 32768; backward rows of 24576 with their parameter
/// gradients' sums are past it too, but for 16-bit RMSNorm's: f32 rows gather them on
/// clusters of two blocks, 16-bit LayerNorm's on clusters of four).
pub const NORM_TEST_COLS: &[usize] = &[
    1, 2, 3, 31, 32, 33, 127, 257, 512, 701, 768, 1000, 1024, 1025, 2047, 4096, 4097, 12345, 24576, 32768, 50257, 65536,
];

/// Row counts for a norm width: 1, 2, 3 and a large count (about 2^19 elements, at most
/// 8192; the norm matrix has several times softmax's cases per shape).
pub fn norm_test_rows(cols: usize) -> [usize; 4] {
    [1, 2, 3, ((1 << 19) / cols).clamp(4, 8192)]
}
