//! LayerNorm and RMSNorm over the rows of a `(rows, cols)` view, forward and backward: their
//! math as hooks of the row engine ([`crate::ops::rows`]), which runs them on every path.
//!
//! One set of hooks per direction serves both norms (RMSNorm is LayerNorm with the mean held at 0
//! and no beta) and every fusion: the forward reads the row through a [`Load`] (plain, or
//! residual add that also writes the sum) and writes `(x - mean) * rstd * gamma + beta`
//! through a [`Store`] (which casts to the output dtype); the backward reads `x` already
//! normalized and `dy` already scaled by gamma through two loads.
//!
//! The variance never divides per element: on the warp and shared paths the row is cached,
//! so it is two passes over registers or shared memory (mean, then centered squares); the
//! uncached path merges each pack's exact moments into the thread's running ones (Chan et
//! al.), one reciprocal per pack. dgamma and dbeta are column sums in two stages: gathered
//! from the rows as the backward reads them for dx (`backward_params`, each block's sums),
//! or, where that kernel has no path, read again by a kernel of their own (`param_grad`);
//! then the blocks' or chunks' sums added in order (`param_grad_sum`).

use super::columns::{self, ColumnTerms, Columns};
use super::rows::RowSplit;
use super::rows::backward::{BackwardRows, ColumnGather, NoGather, RowGradient};
use super::rows::forward::{Accumulate, ForwardRows, RowForward, RowPass};
use crate::abi::{ColumnCopyArgs, NormArgs, NormParamGradArgs, RowShape};
use crate::arch::{GlobalAddr, block_dim_x, block_idx_x, grid_dim_x, load_global_nc, rcp, rsqrt, thread_idx_x};
use crate::layout::{column_copy_stride, phased_columns_copied};
#[cfg(feature = "fuse")]
use crate::pack::StoreOne;
use crate::pack::{ColumnLoad, ColumnWords, DirectLoad, DirectStore, Load, LoadOne, Pack, RowMajor, Store, StreamLoad};
use crate::reduce::Sum;
use crate::scalar::Scalar;
use crate::table::RowPath;
use crate::unroll::{unroll, unrolled_array};

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
/// its output pass. Rows on a phased `PATH` run from their heads, so a row's packs start at
/// any column: gamma and beta are read from their shifted copies there
/// ([`ColumnLoad::fetch_phased`]).
struct Forward<G, const PATH: RowPath> {
    gamma: Option<ColumnLoad<G>>,
    beta: Option<ColumnLoad<G>>,
    mean: *mut f32,
    rstd: *mut f32,
    eps: f32,
    inv_cols: f32,
    rms: bool,
    /// Whether the shared path fetches gamma and beta in batches
    /// ([`RowForward::batches_params`]).
    batched: bool,
}

impl<G: Scalar, const PATH: RowPath> Forward<G, PATH> {
    /// # Safety
    /// Non-zero gamma and beta addresses must hold what [`column`] reads for packs of `P`.
    #[inline(always)]
    unsafe fn new<const P: usize>(args: &NormArgs, batched: bool) -> Self {
        Forward {
            // SAFETY: forwarded.
            gamma: unsafe { column::<G, P, PATH>(args.gamma, args.shape.cols) },
            beta: unsafe { column::<G, P, PATH>(args.beta, args.shape.cols) },
            mean: args.mean as *mut f32,
            rstd: args.rstd as *mut f32,
            eps: args.eps,
            inv_cols: args.inv_cols,
            rms: args.rms != 0,
            batched,
        }
    }

    /// The mean from the row's sum (0 for RMSNorm, which does not center).
    #[inline(always)]
    fn mean(&self, sum: f32) -> f32 {
        if self.rms { 0.0 } else { sum * self.inv_cols }
    }
}

impl<G: Scalar, const PATH: RowPath> RowForward for Forward<G, PATH> {
    type Stats = Stats;
    type Center = Sum;
    type Params<const P: usize> = (ColumnWords<G, P>, ColumnWords<G, P>);
    type Prepared<const P: usize> = ([f32; P], [f32; P]);

    const MASKS_PADDING: bool = true;
    const ELEMENTS: bool = true;

    #[inline(always)]
    fn centers(&self) -> bool {
        !self.rms
    }

    #[inline(always)]
    fn center(&self, sum: f32) -> f32 {
        self.mean(sum)
    }

    #[inline(always)]
    fn spread(&self, x: f32, mean: f32) -> f32 {
        let d = x - mean;
        d * d
    }

    #[inline(always)]
    fn stats(&self, mean: f32, squares: f32) -> Stats {
        Stats { mean, rstd: rsqrt(squares * self.inv_cols + self.eps) }
    }

    /// Gamma and beta (1 and 0 where absent).
    #[inline(always)]
    fn prepare<const P: usize>(&self, (gamma, beta): Self::Params<P>) -> ([f32; P], [f32; P]) {
        (
            if self.gamma.is_some() { gamma.to_f32() } else { [1.0; P] },
            if self.beta.is_some() { beta.to_f32() } else { [0.0; P] },
        )
    }

    #[inline(always)]
    fn output<const P: usize>(
        &self,
        stats: Stats,
        x: [f32; P],
        _kept: bool,
        (gamma, beta): ([f32; P], [f32; P]),
    ) -> [f32; P] {
        unrolled_array(|j| stats.normalize(x[j]) * gamma[j] + beta[j])
    }

    /// The raw words of gamma and beta of columns `col..col + P` (unread where absent).
    ///
    /// # Safety
    /// The columns must be inside the row, `col` a multiple of `P` unless rows run from
    /// their heads.
    #[inline(always)]
    unsafe fn fetch_params<const P: usize>(&self, col: u64) -> Self::Params<P> {
        // SAFETY: forwarded.
        unsafe { (column_words::<G, P, PATH>(&self.gamma, col), column_words::<G, P, PATH>(&self.beta, col)) }
    }

    /// The shared path fetches gamma and beta in batches of packs, or a pack at a time. The batch
    /// hides their latency where few blocks an SM leave little else to; its registers cost the
    /// plain 16-bit forward resident blocks, which hide it better. One pack ahead instead of a
    /// batch does neither. Rows run from their heads read shifted copies of gamma and beta from L2,
    /// so the 16-bit phased forwards batch too (docs/DECISIONS.md, "Gamma and beta fetched in
    /// batches on the shared path").
    #[inline(always)]
    fn batches_params(&self) -> bool {
        self.batched
    }

    /// The mean (LayerNorm only) and rstd, where their arrays are given.
    #[inline(always)]
    unsafe fn write_row<L: LoadOne>(&self, _load: &L, row: u64, stats: Stats) {
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

    /// One read: RMSNorm sums squares; LayerNorm merges each pack's exact moments (and the
    /// edge element's, on a row run from its head).
    #[inline(always)]
    unsafe fn streamed_stats<R: RowSplit, const P: usize>(&self, split: &R, pass: &impl RowPass<P>) -> Stats {
        // SAFETY: forwarded.
        unsafe {
            if self.rms {
                let mut squares = Squares(0.0);
                pass.edge().inspect(|&x| squares.add([x]));
                pass.packs(&mut squares);
                self.stats(0.0, split.all_reduce::<Sum>(squares.0))
            } else {
                let mut moments = Moments { count: 0.0, mean: 0.0, squares: 0.0 };
                pass.edge().inspect(|&x| moments.add([x]));
                pass.packs(&mut moments);
                let count = moments.count;
                let mean = self.mean(split.all_reduce::<Sum>(count * moments.mean));
                let d = moments.mean - mean;
                self.stats(mean, split.all_reduce::<Sum>(moments.squares + count * d * d))
            }
        }
    }
}

/// A thread's sum of squares over the packs it has read.
struct Squares(f32);

impl Accumulate for Squares {
    #[inline(always)]
    fn add<const P: usize>(&mut self, v: [f32; P]) {
        unroll::<P>(|j| self.0 += v[j] * v[j]);
    }
}

/// A thread's running moments over the elements it has read: count, mean and sum of squared
/// deviations. Each pack's own mean and squares are exact (two passes over its registers);
/// merging them costs one reciprocal. (Counting elements, not packs, lets a row's edge
/// element join as a pack of 1; with packs of a power of two the results are the same bits.)
#[derive(Clone, Copy)]
struct Moments {
    count: f32,
    mean: f32,
    squares: f32,
}

impl Accumulate for Moments {
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
        let before = self.count;
        self.count += P as f32;
        let weight = rcp(self.count) * P as f32;
        let delta = pack_mean - self.mean;
        self.mean += delta * weight;
        // Chan: + delta^2 * n_a * n_b / n, with n_a the count before and n_b = P.
        self.squares += pack_squares + delta * delta * before * weight;
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

/// The optional per-column vector of `cols` at `address` (0 for none): on a phased `PATH`
/// at packs of `P` that [`phased_columns_copied`], its shifted copies ([`column_copies`]).
///
/// # Safety
/// A non-zero `address` must hold the vector, aligned as [`ColumnLoad::new`] requires, or
/// where copied the copies [`ColumnLoad::shifted`] reads for packs of `P`.
#[inline(always)]
unsafe fn column<G: Scalar, const P: usize, const PATH: RowPath>(address: u64, cols: u64) -> Option<ColumnLoad<G>> {
    // SAFETY: forwarded.
    (address != 0).then(|| unsafe {
        if PATH.phased() && phased_columns_copied(P) {
            ColumnLoad::shifted(address, cols)
        } else {
            ColumnLoad::new(address)
        }
    })
}

/// The raw words of columns `col..col + N` of a vector [`column`] made (unread where
/// absent): from any column on a phased `PATH`, aligned packs elsewhere.
///
/// # Safety
/// The columns must be inside the row, `col` a multiple of `N` unless `PATH` is phased.
#[inline(always)]
unsafe fn column_words<G: Scalar, const N: usize, const PATH: RowPath>(
    vector: &Option<ColumnLoad<G>>,
    col: u64,
) -> ColumnWords<G, N> {
    // SAFETY: forwarded.
    let fetch = |v: &ColumnLoad<G>| unsafe { if PATH.phased() { v.fetch_phased(col) } else { v.fetch(col) } };
    vector.as_ref().map_or_else(Default::default, fetch)
}

/// The shifted copies of gamma and beta the phased paths read ([`ColumnLoad::shifted`]),
/// as [`ColumnCopyArgs`] lays them out: each thread writes a column of every copy, so
/// every read and write coalesces.
///
/// # Safety
/// `args.sources` must name `args.vectors` (at most 2) live vectors of `args.cols`
/// elements of `G`, and `args.output` hold `vectors * copies * column_copy_stride(cols)`
/// of them, none overlapping a vector.
#[inline(always)]
pub unsafe fn column_copies<G: Scalar>(args: &ColumnCopyArgs) {
    let stride = column_copy_stride(args.cols);
    let first = (block_idx_x() * block_dim_x() + thread_idx_x()) as u64;
    let step = (grid_dim_x() * block_dim_x()) as u64;
    // SAFETY: every read is below `cols` of a vector, every write below the output's end.
    unsafe {
        let output = GlobalAddr::from_generic(args.output);
        unroll::<2>(|vector| {
            if vector < args.vectors as usize {
                let source = GlobalAddr::from_generic(args.sources[vector]);
                for shift in 0..args.copies as u64 {
                    let copy = (vector as u64 * args.copies as u64 + shift) * stride;
                    let mut i = first;
                    while i < stride {
                        let col = i + shift;
                        let value =
                            if col < args.cols { Pack::<G, 1>::load(source, col) } else { Pack::from_f32([0.0]) };
                        value.store(output, copy + i);
                        i += step;
                    }
                }
            }
        });
    }
}

/// # Safety (every kernel body below)
/// `args` must describe live arrays of `rows x cols` elements (row stride `cols`) of the
/// kernel's dtypes, per-column vectors of `cols`, per-row f32 arrays of `rows`, and a launch
/// with the geometry the host planned for `PATH`; the arrays aligned to the pack `P` with
/// `cols` a multiple of `P`, or `PATH` phased with every row array `args.shape.phase`
/// elements past a 16-byte boundary.
#[inline(always)]
unsafe fn view<T: Scalar, const PATH: RowPath>(address: u64, shape: &RowShape) -> RowMajor<T> {
    // SAFETY: forwarded.
    unsafe { super::rows::row_view(address, shape, PATH) }
}

#[inline(always)]
pub unsafe fn forward<T: Scalar, U: Scalar, G: Scalar, const P: usize, const PATH: RowPath>(args: &NormArgs) {
    // SAFETY: see `view`.
    unsafe {
        let load = StreamLoad(view::<T, PATH>(args.input, &args.shape));
        let output = DirectStore(view::<U, PATH>(args.output, &args.shape));
        // Batched for f32 rows, and on the phased paths, whose gamma and beta come from L2
        // ([`RowForward::batches_params`]).
        let op = Forward::<G, PATH>::new::<P>(args, T::BYTES == 4 || PATH.phased());
        ForwardRows::<_, _, _, P> { op: &op, load: &load, outputs: &output, shape: &args.shape }.run::<PATH>();
    }
}

/// The forward on `PATH` at packs of `P` through a user's functors ([`crate::fuse::norm`]),
/// gamma and beta of `G`.
///
/// # Safety
/// As [`crate::fuse::norm`].
#[cfg(feature = "fuse")]
#[inline(always)]
pub unsafe fn fused<L, S, G: Scalar, const P: usize, const PATH: RowPath>(args: &NormArgs, load: &L, store: &S)
where
    L: Load<P> + LoadOne,
    S: Store<P> + StoreOne + Copy,
{
    // SAFETY: forwarded to the caller.
    unsafe {
        let op = Forward::<G, PATH>::new::<P>(args, <L::Exact as Scalar>::BYTES == 4);
        ForwardRows::<_, _, _, P> { op: &op, load, outputs: store, shape: &args.shape }.run::<PATH>();
    }
}

#[inline(always)]
pub unsafe fn add_forward<T: Scalar, U: Scalar, G: Scalar, const P: usize, const PATH: RowPath>(args: &NormArgs) {
    // SAFETY: see `view`; the residual and the sum have the input's shape.
    unsafe {
        let shape = &args.shape;
        let load = ResidualAddLoad {
            x: StreamLoad(view::<T, PATH>(args.input, shape)),
            residual: StreamLoad(view::<T, PATH>(args.second, shape)),
            sum: DirectStore(view::<T, PATH>(args.sum, shape)),
        };
        let output = DirectStore(view::<U, PATH>(args.output, shape));
        let op = Forward::<G, PATH>::new::<P>(args, true);
        ForwardRows::<_, _, _, P> { op: &op, load: &load, outputs: &output, shape: &args.shape }.run::<PATH>();
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

/// Scales a row's values by gamma at their columns (nothing without gamma). Rows on a
/// phased `PATH` run from their heads, so gamma is read from its shifted copies there, as
/// in the forward.
#[derive(Clone, Copy)]
struct ColumnScale<G, const PATH: RowPath> {
    gamma: Option<ColumnLoad<G>>,
}

impl<G: Scalar, const PATH: RowPath> ColumnScale<G, PATH> {
    /// The gamma words of columns `col..col + N` (unread without gamma).
    ///
    /// # Safety
    /// The columns must be inside the row, `col` a multiple of `N` unless `PATH` is phased.
    #[inline(always)]
    unsafe fn gamma<const N: usize>(&self, col: u64) -> ColumnWords<G, N> {
        // SAFETY: forwarded; gamma holds `cols` elements.
        unsafe { column_words::<G, N, PATH>(&self.gamma, col) }
    }

    #[inline(always)]
    fn scale<const N: usize>(&self, mut values: [f32; N], gamma: ColumnWords<G, N>) -> [f32; N] {
        if self.gamma.is_some() {
            let g = gamma.to_f32();
            unroll::<N>(|j| values[j] *= g[j]);
        }
        values
    }
}

/// `dy * gamma` (just `dy` without gamma): the gradient reaching the normalized value.
pub struct ScaledGradLoad<T, G, const PATH: RowPath> {
    dy: DirectLoad<T>,
    weight: ColumnScale<G, PATH>,
}

impl<T: Scalar, G: Scalar, const PATH: RowPath, const N: usize> Load<N> for ScaledGradLoad<T, G, PATH> {
    type Fetched = (Pack<T, N>, ColumnWords<G, N>);
    type Exact = T;

    #[inline(always)]
    unsafe fn fetch(&self, row: u64, col: u64) -> Self::Fetched {
        // SAFETY: forwarded.
        unsafe { (self.dy.fetch(row, col), self.weight.gamma(col)) }
    }

    #[inline(always)]
    unsafe fn convert(&self, (dy, gamma): Self::Fetched, _row: u64, _col: u64) -> [f32; N] {
        self.weight.scale(dy.to_f32(), gamma)
    }

    #[inline(always)]
    fn source(&self) -> Option<RowMajor<T>> {
        Some(self.dy.0)
    }

    #[inline(always)]
    unsafe fn transform(&self, dy: [f32; N], _row: u64, col: u64) -> [f32; N] {
        // SAFETY: forwarded.
        self.weight.scale(dy, unsafe { self.weight.gamma(col) })
    }
}

/// dgamma's and dbeta's terms, `dy * xhat` and `dy`, gathered from the backward's rows as
/// they are read for dx ([`ColumnGather`]): the rows' `b` is `dy` itself, scaled by gamma
/// once gathered.
struct ParamColumns<G, const PATH: RowPath> {
    weight: ColumnScale<G, PATH>,
    rms: bool,
    partial: u64,
}

impl<G: Scalar, const PATH: RowPath> ColumnGather for ParamColumns<G, PATH> {
    const GATHERS: bool = true;

    #[inline(always)]
    fn sums(&self) -> u32 {
        if self.rms { 1 } else { 2 }
    }

    #[inline(always)]
    fn term(&self, k: usize, xhat: f32, dy: f32) -> f32 {
        if k == 0 { dy * xhat } else { dy }
    }

    #[inline(always)]
    unsafe fn scale<const Q: usize>(&self, col: u64, dy: [f32; Q]) -> [f32; Q] {
        // SAFETY: forwarded.
        self.weight.scale(dy, unsafe { self.weight.gamma(col) })
    }

    #[inline(always)]
    fn partial(&self) -> u64 {
        self.partial
    }
}

/// `dx = rstd * (g - mean(g) - xhat * mean(g * xhat))` from the normalized input `xhat`
/// and the scaled gradient `g = dy * gamma`; RMSNorm drops the `mean(g)` term. The row's
/// sums are of `g` and `g * xhat`.
#[derive(Clone, Copy)]
struct Backward {
    saved: SavedStats,
    inv_cols: f32,
}

/// [`Backward`] for one row.
#[derive(Clone, Copy, Default)]
struct Gradient {
    rstd: f32,
    mean_g: f32,
    mean_gx: f32,
}

impl RowGradient<2> for Backward {
    type Row = Gradient;

    #[inline(always)]
    fn term(&self, k: usize, xhat: f32, g: f32) -> f32 {
        if k == 0 { g } else { g * xhat }
    }

    #[inline(always)]
    unsafe fn row(&self, row: Option<u64>, &[sum_g, sum_gx]: &[f32; 2]) -> Gradient {
        // SAFETY: forwarded to the caller.
        let rstd = row.map_or(0.0, |row| unsafe { self.saved.get(row) }.rstd);
        let mean_g = if self.saved.rms { 0.0 } else { sum_g * self.inv_cols };
        Gradient { rstd, mean_g, mean_gx: sum_gx * self.inv_cols }
    }

    #[inline(always)]
    fn apply(grad: Gradient, xhat: f32, g: f32) -> f32 {
        grad.rstd * (g - grad.mean_g - xhat * grad.mean_gx)
    }
}

/// The backward on `PATH`: `b` loaded as `load_g` gives it, scaled and gathered by
/// `gather`.
///
/// # Safety
/// See `view`; dy and dx have the input's shape (U is T for backward kernels).
#[inline(always)]
unsafe fn backward_rows<
    T: Scalar,
    U: Scalar,
    G: Scalar,
    C: ColumnGather,
    const P: usize,
    const PATH: RowPath,
    const SUMS_HELD: usize,
>(
    args: &NormArgs,
    gamma: Option<ColumnLoad<G>>,
    gather: &C,
) {
    // SAFETY: forwarded.
    unsafe {
        let shape = &args.shape;
        let stats = SavedStats::new(args.mean, args.rstd, args.rms);
        let load_xhat = NormalizedLoad { x: DirectLoad(view::<T, PATH>(args.input, shape)), stats };
        let load_g = ScaledGradLoad::<T, G, PATH> {
            dy: DirectLoad(view::<T, PATH>(args.second, shape)),
            weight: ColumnScale { gamma },
        };
        let store = DirectStore(view::<U, PATH>(args.output, shape));
        let op = Backward { saved: stats, inv_cols: args.inv_cols };
        let rows = BackwardRows::<_, _, _, _, _, 2, P> {
            op: &op,
            load_a: &load_xhat,
            load_b: &load_g,
            store: &store,
            gather,
            shape: &args.shape,
        };
        rows.run::<PATH, 0, SUMS_HELD>();
    }
}

#[inline(always)]
pub unsafe fn backward<T: Scalar, U: Scalar, G: Scalar, const P: usize, const PATH: RowPath>(args: &NormArgs) {
    // SAFETY: see `view`; gamma holds `cols` elements where given.
    unsafe {
        backward_rows::<T, U, G, _, P, PATH, 0>(args, column::<G, P, PATH>(args.gamma, args.shape.cols), &NoGather)
    }
}

/// The backward with dgamma's and dbeta's column sums gathered from its rows, each block's
/// into its row of `args.partial` (f32 `[sums, grid, cols]`, added up by `param_grad_sum`).
///
/// # Safety
/// As [`backward`]; `args.partial` must hold a row per block of the grid, and the launch
/// the shared memory of the path's column sums before its caches.
#[inline(always)]
pub unsafe fn backward_params<T: Scalar, U: Scalar, G: Scalar, const P: usize, const PATH: RowPath>(args: &NormArgs) {
    // SAFETY: forwarded; gamma holds `cols` elements where given.
    unsafe {
        let weight = ColumnScale::<G, PATH> { gamma: column::<G, P, PATH>(args.gamma, args.shape.cols) };
        let gather = ParamColumns { weight, rms: args.rms != 0, partial: args.partial };
        if holds_param_sums::<T, PATH>() {
            backward_rows::<T, U, G, _, P, PATH, 1>(args, None, &gather);
        } else {
            backward_rows::<T, U, G, _, P, PATH, 0>(args, None, &gather);
        }
    }
}

/// Whether the backward on `PATH` keeps the parameter gradients' column sums of each
/// thread's first pack in registers across its rows (the rest in shared memory): f32 rows
/// on the shared path, whose rows are short enough that the sums' read-modify-writes in shared
/// memory weigh. 16-bit rows and the cluster kernels would pay for the held sums in registers, and
/// so in resident blocks (docs/DECISIONS.md, "Held packs").
const fn holds_param_sums<T: Scalar, const PATH: RowPath>() -> bool {
    size_of::<T>() == 4 && matches!(PATH, RowPath::Shared)
}

/// dgamma's and dbeta's terms of a row: `dy * xhat` and `dy`, column sums of the row
/// engine's inputs ([`super::columns`]).
struct ParamTerms<T> {
    x: DirectLoad<T>,
    dy: DirectLoad<T>,
    saved: SavedStats,
}

impl<T: Scalar, const P: usize> ColumnTerms<P> for ParamTerms<T> {
    type Loaded = ([f32; P], [f32; P]);
    type Lane = ();

    #[inline(always)]
    unsafe fn lane(&self, _col: u64) {}

    #[inline(always)]
    unsafe fn load(&self, row: u64, col: u64) -> Self::Loaded {
        // SAFETY: forwarded.
        unsafe { (self.x.load(row, col), self.dy.load(row, col)) }
    }

    #[inline(always)]
    unsafe fn add(&self, _lane: &(), row: u64, (xs, dys): Self::Loaded, dgamma: &mut [f32; P], dbeta: &mut [f32; P]) {
        // SAFETY: forwarded.
        let stats = unsafe { self.saved.get(row) };
        unroll::<P>(|j| {
            dgamma[j] += dys[j] * stats.normalize(xs[j]);
            dbeta[j] += dys[j];
        });
    }

    #[inline(always)]
    fn second(&self) -> bool {
        !self.saved.rms
    }
}

/// The column-sum view of the parameter gradients' arguments.
#[inline(always)]
fn columns(args: &NormParamGradArgs) -> Columns {
    Columns {
        rows: args.rows,
        cols: args.cols,
        rows_per_chunk: args.rows_per_chunk,
        chunks: args.chunks,
        interleaved: false,
        partial: args.partial,
    }
}

/// Stage 1 of dgamma/dbeta ([`columns::chunk_sums`]).
///
/// # Safety
/// `args` must describe live arrays (x, dy: `rows x cols` of `T` aligned to `P` with `cols`
/// a multiple of `P`; mean, rstd: `rows` f32; partial: `2 x chunks x cols` f32) and a launch
/// as [`columns::chunk_sums`] requires.
#[inline(always)]
pub unsafe fn param_grad<T: Scalar, const P: usize>(args: &NormParamGradArgs) {
    // SAFETY: forwarded.
    unsafe {
        let terms = ParamTerms {
            x: DirectLoad(RowMajor::<T>::new(args.input, args.cols)),
            dy: DirectLoad(RowMajor::<T>::new(args.grad, args.cols)),
            saved: SavedStats::new(args.mean, args.rstd, args.rms),
        };
        columns::chunk_sums::<_, P>(&terms, &columns(args));
    }
}

/// Stage 2: dgamma (and dbeta) from the chunk sums ([`columns::chunk_totals`]).
///
/// # Safety
/// As [`param_grad`], after it; dgamma and dbeta, where not 0, hold `cols` elements of `G`.
#[inline(always)]
pub unsafe fn param_grad_sum<G: Scalar>(args: &NormParamGradArgs) {
    // SAFETY: forwarded.
    unsafe {
        let dgamma = (args.dgamma != 0).then(|| DirectStore(RowMajor::<G>::new(args.dgamma, args.cols)));
        let dbeta = (args.dbeta != 0).then(|| DirectStore(RowMajor::<G>::new(args.dbeta, args.cols)));
        columns::chunk_totals(&columns(args), dgamma, dbeta);
    }
}
