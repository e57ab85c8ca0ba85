//! LayerNorm and RMSNorm over the rows of a `(rows, cols)` view, forward and backward, on
//! the three paths of [`crate::ops::rows`] (warp, shared, uncached).
//!
//! One body per direction serves both norms (RMSNorm is LayerNorm with the mean held at 0
//! and no beta) and every fusion: the forward reads the row through a [`Load`] (plain, or
//! residual add that also writes the sum) and writes `(x - mean) * rstd * gamma + beta`
//! through a [`Store`] (which casts to the output dtype); the backward reads `x` already
//! normalized and `dy` already scaled by gamma through two loads.
//!
//! The variance never divides per element: on the warp and shared paths the row is cached,
//! so it is two passes over registers or shared memory (mean, then centered squares); the
//! uncached path merges each pack's exact moments into the thread's running ones (Chan et
//! al.), one reciprocal per pack. dgamma and dbeta are a separate two-stage reduction.

#[cfg(feature = "cluster")]
use super::rows::ClusterSplit;
use super::rows::{
    BlockRow, BlockSplit, RowCache, RowSplit, Slice, WarpRows, block_packs, block_packs_loaded, warp_load,
    warp_row_reduce, warp_store,
};
use crate::abi::{COLUMN_SUM_WARPS, NormArgs, NormParamGradArgs, column_sum_tile_cols};
use crate::arch::{
    GlobalAddr, WARP_SIZE, block_dim_x, block_idx_x, dynamic_shared, dynamic_shared_addr, grid_dim_x, load_global_nc,
    rcp, rsqrt, sync_threads, thread_idx_x, wait_async_copies,
};
use crate::pack::{ColumnLoad, ColumnWords, DirectLoad, DirectStore, Load, Pack, RowMajor, Store, StreamLoad};
use crate::reduce::{Sum, SumPair, block_all_reduce};
use crate::scalar::Scalar;
use crate::table::RowPath;
use crate::unroll::{unroll, unrolled_array};
use core::num::NonZeroU64;

/// A row's statistics: the normalized value of `x` is `(x - mean) * rstd`.
#[derive(Clone, Copy, Default)]
pub struct Stats {
    mean: f32,
    rstd: f32,
}

impl Stats {
    #[inline(always)]
    fn normalize(self, x: f32) -> f32 {
        (x - self.mean) * self.rstd
    }
}

/// What the forward needs besides its Load and Store: gamma and beta (optional), the
/// constants, and the per-row outputs (null where not wanted). Gamma and beta are read by
/// the bodies, not by a Store, so the uncached path can keep several packs of them in
/// flight with the row's: read one by one inside each store, their L2 latency stalled
/// its output pass.
struct Forward<G> {
    gamma: Option<ColumnLoad<G>>,
    beta: Option<ColumnLoad<G>>,
    mean: *mut f32,
    rstd: *mut f32,
    eps: f32,
    inv_cols: f32,
    rms: bool,
}

impl<G: Scalar> Forward<G> {
    /// # Safety
    /// Non-zero gamma and beta addresses must hold `cols` elements of `G`, aligned as
    /// [`ColumnLoad::new`] requires.
    #[inline(always)]
    unsafe fn new(args: &NormArgs) -> Self {
        Forward {
            // SAFETY: forwarded.
            gamma: unsafe { column(args.gamma) },
            beta: unsafe { column(args.beta) },
            mean: args.mean as *mut f32,
            rstd: args.rstd as *mut f32,
            eps: args.eps,
            inv_cols: args.inv_cols,
            rms: args.rms != 0,
        }
    }

    /// The raw words of gamma and beta of columns `col..col + P` (unread where absent).
    ///
    /// # Safety
    /// The columns must be inside the row, `col` a multiple of `P`.
    #[inline(always)]
    unsafe fn fetch_params<const P: usize>(&self, col: u64) -> (ColumnWords<G, P>, ColumnWords<G, P>) {
        // SAFETY: forwarded.
        unsafe {
            (
                self.gamma.as_ref().map_or_else(Default::default, |g| g.fetch(col)),
                self.beta.as_ref().map_or_else(Default::default, |b| b.fetch(col)),
            )
        }
    }

    /// Gamma and beta from [`Forward::fetch_params`] (1 and 0 where absent).
    #[inline(always)]
    fn params<const P: usize>(&self, (gamma, beta): (ColumnWords<G, P>, ColumnWords<G, P>)) -> ([f32; P], [f32; P]) {
        (
            if self.gamma.is_some() { gamma.to_f32() } else { [1.0; P] },
            if self.beta.is_some() { beta.to_f32() } else { [0.0; P] },
        )
    }

    /// The mean from the row's sum (0 for RMSNorm, which does not center).
    #[inline(always)]
    fn mean(&self, sum: f32) -> f32 {
        if self.rms { 0.0 } else { sum * self.inv_cols }
    }

    /// Statistics from the mean and the sum of squares about it.
    #[inline(always)]
    fn stats(&self, mean: f32, squares: f32) -> Stats {
        Stats { mean, rstd: rsqrt(squares * self.inv_cols + self.eps) }
    }

    /// # Safety
    /// `row` must be a row of the view; one thread per row calls it.
    #[inline(always)]
    unsafe fn write(&self, row: u64, stats: Stats) {
        // SAFETY: the per-row arrays, where given, hold `rows` f32s.
        unsafe {
            if !self.mean.is_null() && !self.rms {
                self.mean.add(row as usize).write(stats.mean);
            }
            if !self.rstd.is_null() {
                self.rstd.add(row as usize).write(stats.rstd);
            }
        }
    }
}

#[inline(always)]
unsafe fn warp_forward<L: Load<P>, S: Store<P>, G: Scalar, const P: usize, const E: usize>(
    load: &L,
    store: &S,
    norm: &Forward<G>,
    args: &NormArgs,
) {
    let shape = &args.shape;
    let at = WarpRows::new::<E>(shape);
    // SAFETY (block): loads and stores stay in range (warp_load, warp_store), and the whole
    // warp runs the same iterations.
    at.for_each_access(shape.rows, |first| unsafe {
        let x = warp_load::<L, P, E>(load, &at, first, shape, 0.0);
        let mean = if norm.rms {
            [0.0; 2]
        } else {
            warp_row_reduce::<Sum, E>(|r, i| x[r][i], at.width).map(|sum| norm.mean(sum))
        };
        let squares = warp_row_reduce::<Sum, E>(
            |r, i| {
                let d = x[r][i] - mean[r];
                if at.in_row::<P>(i, shape.cols) { d * d } else { 0.0 }
            },
            at.width,
        );
        let stats = [norm.stats(mean[0], squares[0]), norm.stats(mean[1], squares[1])];
        if at.lane == 0 {
            unroll::<2>(|r| {
                if at.holds::<E>(r, first, shape.rows) {
                    norm.write(first + r as u64, stats[r]);
                }
            });
        }
        warp_store::<S, _, P, E>(
            store,
            &at,
            first,
            shape,
            |_| (),
            |r, i, ()| {
                let (gamma, beta) = norm.params::<P>(norm.fetch_params::<P>(at.col::<P>(i)));
                unrolled_array(|j| stats[r].normalize(x[r][i + j]) * gamma[j] + beta[j])
            },
        );
    });
}

/// The row cached in shared memory, split over blocks as `split` says (a block, or a
/// cluster of blocks each holding a slice). The output pass fetches gamma and beta in
/// `batched` groups of packs ([`block_packs_loaded`]), or a pack at a time. Measured on the
/// H100 (49152 rows): the batch hides their latency where few blocks per SM leave little
/// else to (f32 LayerNorm at 32768 columns, one block per SM: 97% of copy batched, 89% a
/// pack at a time; residual-add forwards at 16384-32768: 97-98% and 87-94%); its registers
/// cost the plain 16-bit forward resident blocks (at 2048 columns 9 blocks of 128 per SM
/// instead of 16: 90% batched, 98% a pack at a time). One pack ahead instead of a batch was
/// worse for both (16-bit forward 91% at 2048-32768, 16-bit residual-add RMSNorm 87% at
/// 16384).
#[inline(always)]
unsafe fn shared_forward<L: Load<P>, S: Store<P>, G: Scalar, const P: usize>(
    load: &L,
    store: &S,
    norm: &Forward<G>,
    args: &NormArgs,
    split: &impl RowSplit,
    batched: bool,
) {
    let shape = &args.shape;
    let slice = split.slice::<P>(shape);
    let cache = RowCache::<L::Exact, P>::new(dynamic_shared_addr(), slice);
    // SAFETY (block): the launch sizes shared memory for the cache; each thread touches only
    // its own packs' slots, so no barrier is needed beyond those in the reductions.
    split.rows::<P, false>(shape, |at| unsafe {
        let row = at.row;
        cache.fill(load, at);
        wait_async_copies();
        // This thread's squares about `center`.
        let squares = |center: f32| {
            let mut squares = 0.0;
            block_packs::<P>(slice, |local, _| {
                let v = cache.read(load, at, local);
                unroll::<P>(|j| {
                    let d = v[j] - center;
                    squares += d * d;
                })
            });
            squares
        };
        // RMSNorm skips the pass for the mean: shared reads are ordered accesses the compiler
        // keeps even where their result goes unused.
        let mean = if norm.rms {
            0.0
        } else {
            let mut sum = 0.0;
            block_packs::<P>(slice, |local, _| {
                let v = cache.read(load, at, local);
                unroll::<P>(|j| sum += v[j]);
            });
            norm.mean(split.all_reduce::<Sum>(sum))
        };
        let stats = norm.stats(mean, split.all_reduce::<Sum>(squares(mean)));
        if thread_idx_x() == 0 && split.leads() {
            norm.write(row, stats);
        }
        let output = |local, col, params| {
            let (gamma, beta) = norm.params::<P>(params);
            let v = cache.read(load, at, local);
            store.store(unrolled_array(|j| stats.normalize(v[j]) * gamma[j] + beta[j]), row, col);
            cache.prefetch(load, at, local);
        };
        let fetch = |col| norm.fetch_params::<P>(col);
        if batched {
            block_packs_loaded::<P, _>(slice, fetch, output);
        } else {
            block_packs::<P>(slice, |local, col| output(local, col, fetch(col)));
        }
    });
}

/// A thread's running moments over the packs it has read: count, mean and sum of squared
/// deviations. Each pack's own mean and squares are exact (two passes over its registers);
/// merging them costs one reciprocal.
#[derive(Clone, Copy)]
struct Moments {
    packs: f32,
    mean: f32,
    squares: f32,
}

impl Moments {
    #[inline(always)]
    fn add<const P: usize>(&mut self, v: [f32; P]) {
        let mut sum = 0.0;
        unroll::<P>(|j| sum += v[j]);
        let pack_mean = sum * (1.0 / P as f32);
        let mut pack_squares = 0.0;
        unroll::<P>(|j| {
            let d = v[j] - pack_mean;
            pack_squares += d * d;
        });
        self.packs += 1.0;
        let weight = rcp(self.packs);
        let delta = pack_mean - self.mean;
        self.mean += delta * weight;
        // Chan: + delta^2 * n_a * n_b / n, with n_a = (packs - 1) P, n_b = P.
        self.squares += pack_squares + delta * delta * (P as f32) * (self.packs - 1.0) * weight;
    }
}

#[inline(always)]
unsafe fn uncached_forward<L: Load<P>, S: Store<P>, G: Scalar, const P: usize>(
    load: &L,
    store: &S,
    norm: &Forward<G>,
    args: &NormArgs,
) {
    let shape = &args.shape;
    let slice = Slice::whole::<P>(shape);
    // SAFETY (block): every column visited is a pack inside the row.
    BlockSplit.rows::<P, false>(shape, |BlockRow { row, .. }| unsafe {
        let fetch = |col| load.fetch(row, col);
        let stats = if norm.rms {
            let mut squares = 0.0;
            block_packs_loaded::<P, _>(slice, fetch, |_, col, fetched| {
                let v = load.convert(fetched, row, col);
                unroll::<P>(|j| squares += v[j] * v[j])
            });
            norm.stats(0.0, block_all_reduce::<Sum>(squares))
        } else {
            let mut moments = Moments { packs: 0.0, mean: 0.0, squares: 0.0 };
            block_packs_loaded::<P, _>(slice, fetch, |_, col, fetched| moments.add(load.convert(fetched, row, col)));
            let count = moments.packs * P as f32;
            let mean = norm.mean(block_all_reduce::<Sum>(count * moments.mean));
            let d = moments.mean - mean;
            norm.stats(mean, block_all_reduce::<Sum>(moments.squares + count * d * d))
        };
        if thread_idx_x() == 0 {
            norm.write(row, stats);
        }
        block_packs_loaded::<P, _>(
            slice,
            |col| (load.fetch(row, col), norm.fetch_params::<P>(col)),
            |_, col, (fetched, params)| {
                let (v, (gamma, beta)) = (load.convert(fetched, row, col), norm.params::<P>(params));
                store.store(unrolled_array(|j| stats.normalize(v[j]) * gamma[j] + beta[j]), row, col)
            },
        );
    });
}

/// The forward body for path `PATH`; `batched` as
/// [`shared_forward`] takes it.
#[inline(always)]
unsafe fn forward_path<L: Load<P>, S: Store<P>, G: Scalar, const P: usize, const PATH: RowPath>(
    load: &L,
    store: &S,
    args: &NormArgs,
    batched: bool,
) {
    // SAFETY: forwarded; the host launched this kernel with this path's geometry.
    unsafe {
        let norm = Forward::<G>::new(args);
        match PATH {
            RowPath::Uncached => uncached_forward::<L, S, G, P>(load, store, &norm, args),
            RowPath::Shared => shared_forward::<L, S, G, P>(load, store, &norm, args, &BlockSplit, batched),
            #[cfg(feature = "cluster")]
            RowPath::Cluster => {
                ClusterSplit::run(|split| shared_forward::<L, S, G, P>(load, store, &norm, args, split, batched))
            }
            _ => on_warp_path!(PATH, E => warp_forward::<L, S, G, P, E>(load, store, &norm, args)),
        }
    }
}

/// `x + residual`, rounded to `T` (what the sum array holds, so the norm sees exactly the
/// stored sum), also written to the sum array: a transformer block's residual stream.
/// The uncached path reads its row twice and so writes the same sum twice.
pub struct ResidualAddLoad<T> {
    x: StreamLoad<T>,
    residual: StreamLoad<T>,
    sum: DirectStore<T>,
}

impl<T: Scalar, const N: usize> Load<N> for ResidualAddLoad<T> {
    type Fetched = (Pack<T, N>, Pack<T, N>);
    /// The sum is rounded to `T`, so `T` holds it exactly.
    type Exact = T;

    #[inline(always)]
    unsafe fn fetch(&self, row: u64, col: u64) -> Self::Fetched {
        // SAFETY: forwarded; the three arrays have the same shape and alignment.
        unsafe { (self.x.fetch(row, col), self.residual.fetch(row, col)) }
    }

    #[inline(always)]
    unsafe fn convert(&self, (x, residual): Self::Fetched, row: u64, col: u64) -> [f32; N] {
        let (x, r) = (x.to_f32(), residual.to_f32());
        let sum = unrolled_array(|j| T::from_f32(x[j] + r[j]).to_f32());
        // SAFETY: forwarded from `fetch`'s caller: the pack is inside the sum array.
        unsafe { self.sum.store(sum, row, col) };
        sum
    }
}

/// The optional per-column vector at `address` (0 for none).
///
/// # Safety
/// A non-zero `address` must hold the vector, aligned as [`ColumnLoad::new`] requires.
#[inline(always)]
unsafe fn column<G: Scalar>(address: u64) -> Option<ColumnLoad<G>> {
    // SAFETY: forwarded.
    if address == 0 { None } else { Some(unsafe { ColumnLoad::new(address) }) }
}

/// # Safety (every kernel body below)
/// `args` must describe live arrays of `rows x cols` elements (row stride `cols`) of the
/// kernel's dtypes, per-column vectors of `cols`, per-row f32 arrays of `rows`, all aligned
/// to the pack `P` with `cols` a multiple of `P`, and a launch with the geometry the host
/// planned for `PATH`.
#[inline(always)]
unsafe fn view<T: Scalar>(address: u64, cols: u64) -> RowMajor<T> {
    // SAFETY: forwarded.
    unsafe { RowMajor::new(address, cols) }
}

#[inline(always)]
pub unsafe fn forward<T: Scalar, U: Scalar, G: Scalar, const P: usize, const PATH: RowPath>(args: &NormArgs) {
    // SAFETY: see `view`.
    unsafe {
        let load = StreamLoad(view::<T>(args.input, args.shape.cols));
        let output = DirectStore(view::<U>(args.output, args.shape.cols));
        forward_path::<_, _, G, P, PATH>(&load, &output, args, T::BYTES == 4);
    }
}

#[inline(always)]
pub unsafe fn add_forward<T: Scalar, U: Scalar, G: Scalar, const P: usize, const PATH: RowPath>(args: &NormArgs) {
    // SAFETY: see `view`; the residual and the sum have the input's shape.
    unsafe {
        let cols = args.shape.cols;
        let load = ResidualAddLoad {
            x: StreamLoad(view::<T>(args.input, cols)),
            residual: StreamLoad(view::<T>(args.second, cols)),
            sum: DirectStore(view::<T>(args.sum, cols)),
        };
        forward_path::<_, _, G, P, PATH>(&load, &DirectStore(view::<U>(args.output, cols)), args, true);
    }
}

/// The per-row statistics the forward wrote, as the backward kernels read them: through
/// the read-only path, as loads the compiler may merge, so a row's packs share one load.
#[derive(Clone, Copy)]
struct SavedStats {
    mean: GlobalAddr,
    rstd: GlobalAddr,
    rms: bool,
}

impl SavedStats {
    /// # Safety
    /// `rstd` (and `mean`, unless `rms`) must be generic addresses of global f32 arrays.
    #[inline(always)]
    unsafe fn new(mean: u64, rstd: u64, rms: u32) -> Self {
        // SAFETY: forwarded; an unused mean address is converted but never read.
        unsafe {
            SavedStats { mean: GlobalAddr::from_generic(mean), rstd: GlobalAddr::from_generic(rstd), rms: rms != 0 }
        }
    }

    /// # Safety
    /// `row` must be a row of the view (the arrays hold `rows` f32s, unwritten during the
    /// kernel; RMSNorm has no mean).
    #[inline(always)]
    unsafe fn get(&self, row: u64) -> Stats {
        let at = |array: GlobalAddr| {
            // SAFETY: forwarded.
            f32::from_bits(unsafe { load_global_nc(array.offset(row * 4), 4) }[0])
        };
        Stats { mean: if self.rms { 0.0 } else { at(self.mean) }, rstd: at(self.rstd) }
    }
}

/// `x` normalized with its row's statistics, as the forward saw it before gamma.
pub struct NormalizedLoad<T> {
    x: DirectLoad<T>,
    stats: SavedStats,
}

impl<T: Scalar, const N: usize> Load<N> for NormalizedLoad<T> {
    type Fetched = (Pack<T, N>, Stats);
    type Exact = T;

    #[inline(always)]
    unsafe fn fetch(&self, row: u64, col: u64) -> Self::Fetched {
        // SAFETY: forwarded.
        unsafe { (self.x.fetch(row, col), self.stats.get(row)) }
    }

    #[inline(always)]
    unsafe fn convert(&self, (x, stats): Self::Fetched, _row: u64, _col: u64) -> [f32; N] {
        let x = x.to_f32();
        unrolled_array(|j| stats.normalize(x[j]))
    }

    #[inline(always)]
    fn source(&self) -> Option<RowMajor<T>> {
        Some(self.x.0)
    }

    #[inline(always)]
    unsafe fn transform(&self, x: [f32; N], row: u64, _col: u64) -> [f32; N] {
        // SAFETY: forwarded.
        let stats = unsafe { self.stats.get(row) };
        unrolled_array(|j| stats.normalize(x[j]))
    }
}

/// `dy * gamma` (just `dy` without gamma): the gradient reaching the normalized value.
pub struct ScaledGradLoad<T, G> {
    dy: DirectLoad<T>,
    gamma: Option<ColumnLoad<G>>,
}

impl<T: Scalar, G: Scalar> ScaledGradLoad<T, G> {
    #[inline(always)]
    fn scale<const N: usize>(&self, mut dy: [f32; N], gamma: ColumnWords<G, N>) -> [f32; N] {
        if self.gamma.is_some() {
            let g = gamma.to_f32();
            unroll::<N>(|j| dy[j] *= g[j]);
        }
        dy
    }
}

impl<T: Scalar, G: Scalar, const N: usize> Load<N> for ScaledGradLoad<T, G> {
    type Fetched = (Pack<T, N>, ColumnWords<G, N>);
    type Exact = T;

    #[inline(always)]
    unsafe fn fetch(&self, row: u64, col: u64) -> Self::Fetched {
        // SAFETY: forwarded; gamma holds `cols` elements.
        unsafe { (self.dy.fetch(row, col), self.gamma.as_ref().map_or_else(Default::default, |g| g.fetch(col))) }
    }

    #[inline(always)]
    unsafe fn convert(&self, (dy, gamma): Self::Fetched, _row: u64, _col: u64) -> [f32; N] {
        self.scale(dy.to_f32(), gamma)
    }

    #[inline(always)]
    fn source(&self) -> Option<RowMajor<T>> {
        Some(self.dy.0)
    }

    #[inline(always)]
    unsafe fn transform(&self, dy: [f32; N], _row: u64, col: u64) -> [f32; N] {
        // SAFETY: forwarded; gamma holds `cols` elements.
        let gamma = unsafe { self.gamma.as_ref().map_or_else(Default::default, |g| g.fetch(col)) };
        self.scale(dy, gamma)
    }
}

/// `dx = rstd * (g - mean(g) - xhat * mean(g * xhat))` from the normalized input `xhat`
/// and the scaled gradient `g = dy * gamma`; RMSNorm drops the `mean(g)` term.
#[derive(Clone, Copy)]
struct Gradient {
    rstd: f32,
    mean_g: f32,
    mean_gx: f32,
}

impl Gradient {
    #[inline(always)]
    fn new(args: &NormArgs, rstd: f32, sum_g: f32, sum_gx: f32) -> Self {
        let mean_g = if args.rms != 0 { 0.0 } else { sum_g * args.inv_cols };
        Gradient { rstd, mean_g, mean_gx: sum_gx * args.inv_cols }
    }

    #[inline(always)]
    fn apply(self, xhat: f32, g: f32) -> f32 {
        self.rstd * (g - self.mean_g - xhat * self.mean_gx)
    }
}

/// The backward with the rows cached in shared memory, split over blocks as `split` says.
#[inline(always)]
unsafe fn shared_backward<LX: Load<P>, LG: Load<P>, S: Store<P>, R: RowSplit, const P: usize>(
    load_xhat: &LX,
    load_g: &LG,
    store: &S,
    args: &NormArgs,
    split: &R,
) {
    let shape = &args.shape;
    let slice = split.slice::<P>(shape);
    // x's cache, then dy's (normalized and scaled as they are read).
    let cache_xhat = RowCache::<LX::Exact, P>::new(dynamic_shared_addr(), slice);
    let cache_g = RowCache::<LG::Exact, P>::new(cache_xhat.end(), slice);
    // SAFETY (block): as shared_forward; the statistics hold `rows` f32s.
    unsafe {
        let saved = SavedStats::new(args.mean, args.rstd, args.rms);
        split.rows::<P, false>(shape, |at| {
            let row = at.row;
            cache_xhat.fill(load_xhat, at);
            cache_g.fill(load_g, at);
            wait_async_copies();
            let (mut sum_g, mut sum_gx) = (0.0, 0.0);
            block_packs::<P>(slice, |local, _| {
                let (xhat, g) = (cache_xhat.read(load_xhat, at, local), cache_g.read(load_g, at, local));
                unroll::<P>(|j| {
                    sum_g += g[j];
                    sum_gx += g[j] * xhat[j];
                })
            });
            let [sum_g, sum_gx] = if R::MERGES_REDUCTIONS {
                split.all_reduce::<SumPair>([sum_g, sum_gx])
            } else {
                [split.all_reduce::<Sum>(sum_g), split.all_reduce::<Sum>(sum_gx)]
            };
            let grad = Gradient::new(args, saved.get(row).rstd, sum_g, sum_gx);
            block_packs::<P>(slice, |local, col| {
                let (xhat, g) = (cache_xhat.read(load_xhat, at, local), cache_g.read(load_g, at, local));
                store.store(unrolled_array(|j| grad.apply(xhat[j], g[j])), row, col);
                cache_xhat.prefetch(load_xhat, at, local);
                cache_g.prefetch(load_g, at, local);
            });
        });
    }
}

#[inline(always)]
unsafe fn backward_path<LX: Load<P>, LG: Load<P>, S: Store<P>, const P: usize, const PATH: RowPath>(
    load_xhat: &LX,
    load_g: &LG,
    store: &S,
    args: &NormArgs,
) {
    let shape = &args.shape;
    // SAFETY (whole body): as the forward paths.
    unsafe {
        let saved = SavedStats::new(args.mean, args.rstd, args.rms);
        match PATH {
            RowPath::Uncached => {
                let slice = Slice::whole::<P>(shape);
                BlockSplit.rows::<P, false>(shape, |BlockRow { row, .. }| {
                    let fetch = |col| (load_xhat.fetch(row, col), load_g.fetch(row, col));
                    let convert = |(xhat, g), col| (load_xhat.convert(xhat, row, col), load_g.convert(g, row, col));
                    let (mut sum_g, mut sum_gx) = (0.0, 0.0);
                    block_packs_loaded::<P, _>(slice, fetch, |_, col, fetched| {
                        let (xhat, g) = convert(fetched, col);
                        unroll::<P>(|j| {
                            sum_g += g[j];
                            sum_gx += g[j] * xhat[j];
                        })
                    });
                    let (sum_g, sum_gx) = (block_all_reduce::<Sum>(sum_g), block_all_reduce::<Sum>(sum_gx));
                    let grad = Gradient::new(args, saved.get(row).rstd, sum_g, sum_gx);
                    block_packs_loaded::<P, _>(slice, fetch, |_, col, fetched| {
                        let (xhat, g) = convert(fetched, col);
                        store.store(unrolled_array(|j| grad.apply(xhat[j], g[j])), row, col)
                    });
                })
            }
            RowPath::Shared => shared_backward::<LX, LG, S, _, P>(load_xhat, load_g, store, args, &BlockSplit),
            #[cfg(feature = "cluster")]
            RowPath::Cluster => {
                ClusterSplit::run(|split| shared_backward::<LX, LG, S, _, P>(load_xhat, load_g, store, args, split))
            }
            _ => on_warp_path!(PATH, E => {
                let at = WarpRows::new::<E>(shape);
                at.for_each_access(shape.rows, |first| {
                    // Padding columns load as g = 0, so they add nothing to either sum.
                    let xhat = warp_load::<LX, P, E>(load_xhat, &at, first, shape, 0.0);
                    let g = warp_load::<LG, P, E>(load_g, &at, first, shape, 0.0);
                    let sum_g = warp_row_reduce::<Sum, E>(|r, i| g[r][i], at.width);
                    let sum_gx = warp_row_reduce::<Sum, E>(|r, i| g[r][i] * xhat[r][i], at.width);
                    let rstd = |r: usize| {
                        if at.holds::<E>(r, first, shape.rows) { saved.get(first + r as u64).rstd } else { 0.0 }
                    };
                    let grad = [
                        Gradient::new(args, rstd(0), sum_g[0], sum_gx[0]),
                        Gradient::new(args, rstd(1), sum_g[1], sum_gx[1]),
                    ];
                    warp_store::<S, _, P, E>(
                        store,
                        &at,
                        first,
                        shape,
                        |_| (),
                        |r, i, ()| unrolled_array(|j| grad[r].apply(xhat[r][i + j], g[r][i + j])),
                    );
                });
            }),
        }
    }
}

#[inline(always)]
pub unsafe fn backward<T: Scalar, U: Scalar, G: Scalar, const P: usize, const PATH: RowPath>(args: &NormArgs) {
    // SAFETY: see `view`; dy and dx have the input's shape (U is T for backward kernels).
    unsafe {
        let cols = args.shape.cols;
        let stats = SavedStats::new(args.mean, args.rstd, args.rms);
        let load_xhat = NormalizedLoad { x: DirectLoad(view::<T>(args.input, cols)), stats };
        let load_g = ScaledGradLoad::<T, G> { dy: DirectLoad(view::<T>(args.second, cols)), gamma: column(args.gamma) };
        let store = DirectStore(view::<U>(args.output, cols));
        backward_path::<_, _, _, P, PATH>(&load_xhat, &load_g, &store, args);
    }
}

/// Stage 1 of dgamma/dbeta: block `b` sums rows `chunk * rows_per_chunk ..` (chunk
/// `b / tiles`) of the column tile `b % tiles` (32 lanes x `P` columns). Each warp takes
/// every eighth row of the chunk; the warps' sums then add up in a fixed order through
/// shared memory, so the result does not depend on scheduling.
///
/// # Safety
/// `args` must describe live arrays (x, dy: `rows x cols` of `T` aligned to `P` with `cols`
/// a multiple of `P`; mean, rstd: `rows` f32; partial: `2 x chunks x cols` f32), a grid of
/// `tiles x chunks` blocks of `COLUMN_SUM_WARPS` warps, and `P x 2 x 32 x warps` f32
/// of dynamic shared memory.
#[inline(always)]
pub unsafe fn param_grad<T: Scalar, const P: usize>(args: &NormParamGradArgs) {
    let tile_cols = column_sum_tile_cols(P) as u64;
    // At least one tile (cols > 0): a divisor with no zero check.
    let tiles = NonZeroU64::new(args.cols.div_ceil(tile_cols)).unwrap_or(NonZeroU64::MIN);
    let (chunk, tile) = (block_idx_x() as u64 / tiles, block_idx_x() as u64 % tiles);
    let (warp, lane) = (thread_idx_x() / WARP_SIZE, thread_idx_x() % WARP_SIZE);
    let col = tile * tile_cols + lane as u64 * P as u64;
    let first = chunk * args.rows_per_chunk;
    let end = (first + args.rows_per_chunk).min(args.rows);
    let rms = args.rms != 0;
    let (mut dgamma, mut dbeta) = ([0.0f32; P], [0.0f32; P]);
    // SAFETY (block): every access is a pack of a row < rows at a column < cols.
    unsafe {
        let x = DirectLoad(view::<T>(args.input, args.cols));
        let dy = DirectLoad(view::<T>(args.grad, args.cols));
        let saved = SavedStats::new(args.mean, args.rstd, args.rms);
        let mut add = |row: u64, (xs, dys): ([f32; P], [f32; P])| {
            let stats = saved.get(row);
            unroll::<P>(|j| {
                dgamma[j] += dys[j] * stats.normalize(xs[j]);
                dbeta[j] += dys[j];
            });
        };
        if col < args.cols {
            // Four rows' loads in flight per lane, then the rest one by one.
            let step = COLUMN_SUM_WARPS as u64;
            let load = |row: u64| (x.load(row, col), dy.load(row, col));
            let mut row = first + warp as u64;
            while row + 3 * step < end {
                let mut loaded = [load(row); 4];
                unroll::<4>(|u| {
                    if u > 0 {
                        loaded[u] = load(row + u as u64 * step);
                    }
                });
                unroll::<4>(|u| add(row + u as u64 * step, loaded[u]));
                row += 4 * step;
            }
            while row < end {
                add(row, load(row));
                row += step;
            }
        }
        // Warp w's sums at scratch[(w * 2 + which) * 32 * P + j * 32 + lane].
        let scratch = dynamic_shared::<f32>();
        let at =
            |w: u32, which: usize, j: usize| ((w as usize * 2 + which) * P + j) * WARP_SIZE as usize + lane as usize;
        unroll::<P>(|j| {
            scratch.add(at(warp, 0, j)).write(dgamma[j]);
            scratch.add(at(warp, 1, j)).write(dbeta[j]);
        });
        sync_threads();
        if warp == 0 && col < args.cols {
            let partial = args.partial as *mut f32;
            let chunk_at = (chunk * args.cols + col) as usize;
            let beta_at = (args.chunks * args.cols) as usize;
            unroll::<P>(|j| {
                let (mut g, mut b) = (0.0, 0.0);
                for w in 0..COLUMN_SUM_WARPS {
                    g += scratch.add(at(w, 0, j)).read();
                    b += scratch.add(at(w, 1, j)).read();
                }
                partial.add(chunk_at + j).write(g);
                if !rms {
                    partial.add(beta_at + chunk_at + j).write(b);
                }
            });
        }
    }
}

/// Stage 2: `dgamma[c]` (and `dbeta[c]`) as the sum of the chunks' partial sums, in chunk
/// order; a thread per column, grid-strided.
///
/// # Safety
/// As [`param_grad`]; dgamma and dbeta, where not 0, hold `cols` elements of `G`.
#[inline(always)]
pub unsafe fn param_grad_sum<G: Scalar>(args: &NormParamGradArgs) {
    let partial = args.partial as *const f32;
    let stride = (grid_dim_x() * block_dim_x()) as u64;
    let mut col = (block_idx_x() * block_dim_x() + thread_idx_x()) as u64;
    // SAFETY: reads `chunks x cols` partial sums per parameter and writes column `col`.
    unsafe {
        let dgamma = (args.dgamma != 0).then(|| DirectStore(view::<G>(args.dgamma, args.cols)));
        let dbeta = (args.dbeta != 0).then(|| DirectStore(view::<G>(args.dbeta, args.cols)));
        let beta_at = args.chunks * args.cols;
        while col < args.cols {
            let (mut g, mut b) = (0.0, 0.0);
            let mut chunk = 0;
            while chunk < args.chunks {
                g += partial.add((chunk * args.cols + col) as usize).read();
                if dbeta.is_some() {
                    b += partial.add((beta_at + chunk * args.cols + col) as usize).read();
                }
                chunk += 1;
            }
            if let Some(dgamma) = &dgamma {
                dgamma.store([g], 0, col);
            }
            if let Some(dbeta) = &dbeta {
                dbeta.store([b], 0, col);
            }
            col += stride;
        }
    }
}
