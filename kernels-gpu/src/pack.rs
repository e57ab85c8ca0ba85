//! Vectorized accesses and the Load/Store interface every row-wise op reads and writes
//! through.
//!
//! A [`Pack`] is `N` elements moved as one aligned 16-, 8-, 4- or 2-byte access. Ops read
//! rows through a [`Load`] and write them through a [`Store`], so fusing a neighbouring
//! op (a scale, a mask, a residual add, a cast) is a new functor, not a new kernel.

use crate::abi::{DType, PACK_BYTES};
use crate::arch::{
    GlobalAddr, i8_lane_to_f32, load_global_nc, load_global_stream, store_global, store_global_streaming,
};
use crate::scalar::Scalar;
use crate::unroll::{unroll, unrolled_array};
use core::marker::PhantomData;

/// `N` elements of `T` held as the 32-bit words one access moves. Lanes of 16-bit types
/// pair up in words (lane `2i` low, `2i+1` high), which is what half2 instructions take;
/// 8-bit lanes go four to a word.
#[derive(Clone, Copy)]
pub struct Pack<T: Scalar, const N: usize> {
    words: [u32; 4],
    _element: PhantomData<T>,
}

impl<T: Scalar, const N: usize> Pack<T, N> {
    /// Bytes of one access.
    pub const BYTES: usize = N * T::BYTES;

    #[inline(always)]
    pub fn new() -> Self {
        Pack { words: [0; 4], _element: PhantomData }
    }

    /// Loads pack number `index` of the array at `base`.
    ///
    /// # Safety
    /// The pack must lie inside an allocation that nobody writes during the kernel, and
    /// `base` must be aligned to [`Self::BYTES`].
    #[inline(always)]
    pub unsafe fn load(base: GlobalAddr, index: u64) -> Self {
        // SAFETY: forwarded to the caller.
        let words = unsafe { load_global_nc(base.offset(index * Self::BYTES as u64), Self::BYTES) };
        Pack { words, _element: PhantomData }
    }

    /// As [`Pack::load`], without allocating in L1 (for rows read once beside data that is
    /// re-read, such as a norm's gamma and beta).
    ///
    /// # Safety
    /// As [`Pack::load`].
    #[inline(always)]
    pub unsafe fn load_streaming(base: GlobalAddr, index: u64) -> Self {
        // SAFETY: forwarded to the caller.
        let words = unsafe { load_global_stream(base.offset(index * Self::BYTES as u64), Self::BYTES) };
        Pack { words, _element: PhantomData }
    }

    /// Stores this pack as pack number `index` of the array at `base`.
    ///
    /// # Safety
    /// The pack must lie inside a writable allocation, and `base` must be aligned to
    /// [`Self::BYTES`].
    #[inline(always)]
    pub unsafe fn store(self, base: GlobalAddr, index: u64) {
        // SAFETY: forwarded to the caller.
        unsafe { store_global(base.offset(index * Self::BYTES as u64), Self::BYTES, self.words) }
    }

    /// As [`Pack::store`], the line evicted first from L2 ([`store_global_streaming`]).
    ///
    /// # Safety
    /// As [`Pack::store`].
    #[inline(always)]
    pub unsafe fn store_streaming(self, base: GlobalAddr, index: u64) {
        // SAFETY: forwarded to the caller.
        unsafe { store_global_streaming(base.offset(index * Self::BYTES as u64), Self::BYTES, self.words) }
    }

    /// The words one access moves (the first [`Self::BYTES`] bytes are the pack).
    #[inline(always)]
    pub fn words(&self) -> [u32; 4] {
        self.words
    }

    #[inline(always)]
    pub fn from_words(words: [u32; 4]) -> Self {
        Pack { words, _element: PhantomData }
    }

    #[inline(always)]
    pub fn get(&self, lane: usize) -> T {
        lane_of(&self.words, lane)
    }

    /// Lane `lane` as f32: `get(lane).to_f32()`, but an int8 lane straight from its word
    /// ([`i8_lane_to_f32`]: one `prmt` and one subtraction, where extracting the byte first
    /// took two integer instructions and the subtraction).
    #[inline(always)]
    pub fn get_f32(&self, lane: usize) -> f32 {
        if T::DTYPE as u8 == DType::I8 as u8 {
            i8_lane_to_f32(self.words[lane / 4] ^ 0x8080_8080, lane % 4)
        } else {
            self.get(lane).to_f32()
        }
    }

    #[inline(always)]
    pub fn set(&mut self, lane: usize, value: T) {
        if T::BYTES == 4 {
            self.words[lane] = value.to_bits();
        } else {
            let (word, shift) = (&mut self.words[lane / (4 / T::BYTES)], lane_shift::<T>(lane));
            *word = (*word & !(lane_mask::<T>() << shift)) | (value.to_bits() << shift);
        }
    }

    /// The pack of `values`, each rounded to `T` ([`Scalar::from_f32`]); 16-bit lanes two
    /// at a time ([`Scalar::pair_from_f32`]).
    #[inline(always)]
    pub fn from_f32(values: [f32; N]) -> Self {
        let mut pack = Self::new();
        if T::BYTES == 2 && N >= 2 {
            unroll::<N>(|i| {
                if i % 2 == 0 {
                    pack.set_pair(i / 2, T::pair_from_f32(values[i], values[i + 1]));
                }
            });
        } else {
            unroll::<N>(|i| pack.set(i, T::from_f32(values[i])));
        }
        pack
    }

    /// Lanes `2i` and `2i+1` of a 16-bit pack, as one word.
    #[inline(always)]
    pub fn pair(&self, i: usize) -> u32 {
        self.words[i]
    }

    #[inline(always)]
    pub fn set_pair(&mut self, i: usize, word: u32) {
        self.words[i] = word;
    }
}

/// Element `lane` of the words one access moved (narrower lanes share words, low first:
/// two 16-bit lanes or four 8-bit ones a word).
#[inline(always)]
fn lane_of<T: Scalar>(words: &[u32; 4], lane: usize) -> T {
    if T::BYTES == 4 {
        T::from_bits(words[lane])
    } else {
        T::from_bits((words[lane / (4 / T::BYTES)] >> lane_shift::<T>(lane)) & lane_mask::<T>())
    }
}

/// Where lane `lane` of a type narrower than a word starts in its word.
#[inline(always)]
fn lane_shift<T: Scalar>(lane: usize) -> u32 {
    (8 * T::BYTES * (lane % (4 / T::BYTES))) as u32
}

/// The bits of one lane of a type narrower than a word.
#[inline(always)]
fn lane_mask<T: Scalar>() -> u32 {
    (1 << (8 * T::BYTES)) - 1
}

impl<T: Scalar, const N: usize> Default for Pack<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

/// Reads `N` consecutive elements of a row as f32, in two steps so that a thread can issue
/// every load of its row before it waits on any: [`Load::fetch`] only moves memory into
/// registers, [`Load::convert`] does the arithmetic (the conversion to f32, and whatever a
/// fused op adds). With one step, each pack's conversion waits on its load before the next load
/// issues, so a row's loads do not overlap (docs/DECISIONS.md, "16-byte packs").
pub trait Load<const N: usize> {
    /// Whether [`Load::transform`] does arithmetic beyond the conversion to f32 (a
    /// dequantization), so each read of a cached row costs it: the block softmax then takes
    /// its max and sum in one pass over the cache instead of two (docs/DECISIONS.md, "`cp.async`
    /// row caches").
    const TRANSFORMS: bool = false;

    /// The raw words one fetch brings in.
    type Fetched: Copy;
    /// The narrowest dtype that holds this load's values exactly: the row's own for a plain
    /// load, f32 where a fused op made new values. The shared path caches rows in it.
    type Exact: Scalar;

    /// # Safety
    /// `(row, col..col + N)` must be inside the view, its first element aligned to the pack.
    unsafe fn fetch(&self, row: u64, col: u64) -> Self::Fetched;

    /// # Safety
    /// `fetched` must come from `self.fetch(row, col)`.
    unsafe fn convert(&self, fetched: Self::Fetched, row: u64, col: u64) -> [f32; N];

    /// The view this load's values come from, where each value is [`Load::transform`] of
    /// the view's element with nothing else read but per-row or per-column data (a plain
    /// load, a normalization, a scale by gamma, a causal mask). A row can then be cached as
    /// the view holds it, copied to shared memory without passing through registers, and
    /// transformed on every read. `None` for loads that read other rows' data or write as
    /// they read; `Exact` is the view's dtype where there is a source.
    #[inline(always)]
    fn source(&self) -> Option<RowMajor<Self::Exact>> {
        None
    }

    /// Whether the values of the pack at `(row, col)` depend on what [`Load::source`] holds
    /// there; `false` only where every value of the pack is `-inf` whatever the view holds
    /// (a causal mask's packs wholly past the query's last key). A cache need not copy such
    /// a pack, and softmax skips its work (it adds nothing to the row's max and sum, and its
    /// outputs are the row's output for `-inf`). Every pack by default.
    #[inline(always)]
    fn reads(&self, _row: u64, _col: u64) -> bool {
        true
    }

    /// Elements `col..col + N` from their values in [`Load::source`] (as f32).
    ///
    /// # Safety
    /// As [`Load::fetch`].
    #[inline(always)]
    unsafe fn transform(&self, raw: [f32; N], _row: u64, _col: u64) -> [f32; N] {
        raw
    }

    /// Both steps at once, where nothing else needs to be in flight.
    ///
    /// # Safety
    /// As [`Load::fetch`].
    #[inline(always)]
    unsafe fn load(&self, row: u64, col: u64) -> [f32; N] {
        // SAFETY: forwarded to the caller.
        unsafe { self.convert(self.fetch(row, col), row, col) }
    }
}

/// Writes `N` consecutive elements of a row from the f32 compute type.
pub trait Store<const N: usize> {
    /// # Safety
    /// `(row, col..col + N)` must be inside the view, its first element aligned to the pack.
    unsafe fn store(&self, values: [f32; N], row: u64, col: u64);

    /// As [`Store::store`], for a pass that re-reads its inputs from L2 as it stores: where
    /// the store can, its lines are the first L2 evicts, so they do not push those inputs
    /// out.
    ///
    /// # Safety
    /// As [`Store::store`].
    #[inline(always)]
    unsafe fn store_streaming(&self, values: [f32; N], row: u64, col: u64) {
        // SAFETY: forwarded to the caller.
        unsafe { self.store(values, row, col) }
    }
}

/// Single elements through a functor's [`Load<1>`]: what a kernel generic over its pack
/// reads a row's unaligned edges with (a second bound `Load<1>` beside `Load<P>` would
/// make every pack call ambiguous).
pub trait LoadOne {
    /// # Safety
    /// `(row, col)` must be inside the view.
    unsafe fn load_one(&self, row: u64, col: u64) -> f32;
}

impl<L: Load<1>> LoadOne for L {
    #[inline(always)]
    unsafe fn load_one(&self, row: u64, col: u64) -> f32 {
        // SAFETY: forwarded to the caller; a single element is aligned to itself.
        unsafe { self.load(row, col)[0] }
    }
}

/// Single elements through a functor's [`Store<1>`] (see [`LoadOne`]).
pub trait StoreOne {
    /// # Safety
    /// `(row, col)` must be inside the view.
    unsafe fn store_one(&self, value: f32, row: u64, col: u64);
}

impl<S: Store<1>> StoreOne for S {
    #[inline(always)]
    unsafe fn store_one(&self, value: f32, row: u64, col: u64) {
        // SAFETY: forwarded to the caller.
        unsafe { self.store([value], row, col) }
    }
}

/// A row-major `(rows, cols)` view of `T` in global memory, rows `row_stride` elements apart,
/// starting `first` elements past a 16-byte boundary (0 for aligned views), so a pack's
/// index is exact wherever its first element is aligned (see `RowShape::head`).
#[derive(Clone, Copy)]
pub struct RowMajor<T> {
    /// The 16-byte boundary at or before the view's start.
    base: GlobalAddr,
    first: u64,
    row_stride: u64,
    _element: PhantomData<T>,
}

impl<T: Scalar> RowMajor<T> {
    /// # Safety
    /// `address` must be a generic address of global memory holding the view; for packs of
    /// `N`, it and `row_stride * size_of::<T>()` must be multiples of `N * size_of::<T>()`.
    #[inline(always)]
    pub unsafe fn new(address: u64, row_stride: u64) -> Self {
        // SAFETY: forwarded to the caller.
        unsafe { Self::past_boundary(address, row_stride, 0) }
    }

    /// A view starting `first` elements past a 16-byte boundary. Passing every array's
    /// `first` as one value (the launch's `RowShape::phase`) lets their rows share one
    /// index computation.
    ///
    /// # Safety
    /// `address` must be a generic address of global memory holding the view, `first`
    /// elements past a 16-byte boundary. Packs of `N` may be accessed only where their first
    /// element's address is a multiple of `N * size_of::<T>()`.
    #[inline(always)]
    pub unsafe fn past_boundary(address: u64, row_stride: u64, first: u64) -> Self {
        // SAFETY: forwarded to the caller; the boundary lies in the same global window.
        let base = unsafe { GlobalAddr::from_generic(address - first * T::BYTES as u64) };
        RowMajor { base, first, row_stride, _element: PhantomData }
    }

    #[inline(always)]
    fn pack_index<const N: usize>(&self, row: u64, col: u64) -> u64 {
        (self.first + row * self.row_stride + col) / N as u64
    }

    /// Address of element `(row, col)`.
    #[inline(always)]
    pub fn at(&self, row: u64, col: u64) -> GlobalAddr {
        self.base.offset((self.first + row * self.row_stride + col) * T::BYTES as u64)
    }
}

/// Loads straight from a [`RowMajor`] view.
#[derive(Clone, Copy)]
pub struct DirectLoad<T>(pub RowMajor<T>);

/// Loads straight from a [`RowMajor`] view read once beside re-read data (a norm's gamma
/// and beta): f32 rows bypass L1 ([`Pack::load_streaming`]), so the re-read data stays
/// there. 16-bit rows, whose weight takes half the bytes, lose that way, so they load as
/// [`DirectLoad`] does (docs/DECISIONS.md, "Rows that bypass L1 beside the weight").
#[derive(Clone, Copy)]
pub struct StreamLoad<T>(pub RowMajor<T>);

/// Stores straight into a [`RowMajor`] view.
#[derive(Clone, Copy)]
pub struct DirectStore<T>(pub RowMajor<T>);

impl<T: Scalar, const N: usize> Pack<T, N> {
    /// The lanes as f32.
    #[inline(always)]
    pub fn to_f32(&self) -> [f32; N] {
        unrolled_array(|lane| self.get_f32(lane))
    }
}

impl<T: Scalar, const N: usize> Load<N> for DirectLoad<T> {
    type Fetched = Pack<T, N>;
    type Exact = T;

    #[inline(always)]
    fn source(&self) -> Option<RowMajor<T>> {
        Some(self.0)
    }

    #[inline(always)]
    unsafe fn fetch(&self, row: u64, col: u64) -> Pack<T, N> {
        // SAFETY: forwarded to the caller.
        unsafe { Pack::load(self.0.base, self.0.pack_index::<N>(row, col)) }
    }

    #[inline(always)]
    unsafe fn convert(&self, pack: Pack<T, N>, _row: u64, _col: u64) -> [f32; N] {
        pack.to_f32()
    }
}

impl<T: Scalar, const N: usize> Load<N> for StreamLoad<T> {
    type Fetched = Pack<T, N>;
    type Exact = T;

    #[inline(always)]
    fn source(&self) -> Option<RowMajor<T>> {
        Some(self.0)
    }

    #[inline(always)]
    unsafe fn fetch(&self, row: u64, col: u64) -> Pack<T, N> {
        let index = self.0.pack_index::<N>(row, col);
        // SAFETY: forwarded to the caller.
        unsafe { if T::BYTES == 4 { Pack::load_streaming(self.0.base, index) } else { Pack::load(self.0.base, index) } }
    }

    #[inline(always)]
    unsafe fn convert(&self, pack: Pack<T, N>, _row: u64, _col: u64) -> [f32; N] {
        pack.to_f32()
    }
}

impl<T: Scalar, const N: usize> Store<N> for DirectStore<T> {
    #[inline(always)]
    unsafe fn store(&self, values: [f32; N], row: u64, col: u64) {
        // SAFETY: forwarded to the caller.
        unsafe { Pack::<T, N>::from_f32(values).store(self.0.base, self.0.pack_index::<N>(row, col)) }
    }

    #[inline(always)]
    unsafe fn store_streaming(&self, values: [f32; N], row: u64, col: u64) {
        // SAFETY: forwarded to the caller.
        unsafe { Pack::<T, N>::from_f32(values).store_streaming(self.0.base, self.0.pack_index::<N>(row, col)) }
    }
}

/// A per-column vector (a norm's gamma or beta) of `T`, the same for every row. Its packs
/// follow the row's pack `N`, which for a wider `T` than the row's (f32 gamma beside f16
/// rows) spans more than 16 bytes: it loads in accesses of at most 16 bytes each.
#[derive(Clone, Copy)]
pub struct ColumnLoad<T> {
    base: GlobalAddr,
    /// Elements from one shifted copy of the vector to the next
    /// ([`crate::layout::column_copy_stride`]), for [`ColumnLoad::fetch_phased`]; 0 for a
    /// plain vector.
    copy_stride: u64,
    _element: PhantomData<T>,
}

impl<T: Scalar> ColumnLoad<T> {
    /// # Safety
    /// `address` must be a generic address of global memory holding the vector, aligned to
    /// `min(N * size_of::<T>(), 16)` for packs of `N`.
    #[inline(always)]
    pub unsafe fn new(address: u64) -> Self {
        // SAFETY: forwarded to the caller.
        ColumnLoad { base: unsafe { GlobalAddr::from_generic(address) }, copy_stride: 0, _element: PhantomData }
    }

    /// A vector of `cols` elements as its shifted copies, for [`ColumnLoad::fetch_phased`]:
    /// copy `h` holds elements `h..cols` from its start, and starts `h` strides of
    /// [`crate::layout::column_copy_stride`] past `address` (copy 0 is the vector itself).
    ///
    /// # Safety
    /// `address` must be a generic address of global memory holding the copies `0..N` for
    /// the packs of `N` read, aligned to 16 bytes.
    #[inline(always)]
    pub unsafe fn shifted(address: u64, cols: u64) -> Self {
        // SAFETY: forwarded to the caller.
        let plain = unsafe { ColumnLoad::new(address) };
        ColumnLoad { copy_stride: crate::layout::column_copy_stride(cols), ..plain }
    }

    /// The raw words of elements `col..col + N`: up to two 16-byte accesses (f32 columns
    /// beside 16-bit rows).
    ///
    /// # Safety
    /// They must be inside the vector, and `col` a multiple of `N`.
    #[inline(always)]
    pub unsafe fn fetch<const N: usize>(&self, col: u64) -> ColumnWords<T, N> {
        // SAFETY: forwarded to the caller.
        unsafe { fetch_aligned(self.base, col) }
    }

    /// As [`ColumnLoad::fetch`] from any column, for rows run from their heads (the phased
    /// paths), whose packs start at any column: packs of `N` that
    /// [`crate::layout::phased_columns_copied`] from the shifted copies, others an element at
    /// a time (single elements from copy 0, the vector itself, where there are copies).
    ///
    /// # Safety
    /// The elements must be inside the vector; packs of `N` that are copied need a load made
    /// by [`ColumnLoad::shifted`].
    #[inline(always)]
    pub unsafe fn fetch_phased<const N: usize>(&self, col: u64) -> ColumnWords<T, N> {
        // SAFETY: forwarded to the caller.
        unsafe {
            if crate::layout::phased_columns_copied(N) { self.fetch_shifted(col) } else { self.fetch_unaligned(col) }
        }
    }

    /// The pack from column `col` is copy `col % N` from the aligned element
    /// `col - col % N`, so it loads in whole accesses as an aligned pack does.
    ///
    /// # Safety
    /// As [`ColumnLoad::fetch_phased`], for a load with copies.
    #[inline(always)]
    unsafe fn fetch_shifted<const N: usize>(&self, col: u64) -> ColumnWords<T, N> {
        let copy = col % N as u64;
        let at = self.base.offset(copy * self.copy_stride * T::BYTES as u64);
        // SAFETY: copy `col % N` holds the vector's elements from `col % N` on, so element
        // `col` is its element `col - col % N`, a multiple of `N`; copies start aligned.
        unsafe { fetch_aligned(at, col - copy) }
    }

    /// An access per element: every row reads the vector again, so these hit L1 where it
    /// holds the vector.
    ///
    /// # Safety
    /// The elements must be inside the vector.
    #[inline(always)]
    unsafe fn fetch_unaligned<const N: usize>(&self, col: u64) -> ColumnWords<T, N> {
        let (per_access, per_word) = (PACK_BYTES / T::BYTES, 4 / T::BYTES);
        let mut words = [[0; 4]; 2];
        unroll::<N>(|j| {
            let at = self.base.offset((col + j as u64) * T::BYTES as u64);
            // SAFETY: one element inside the vector, aligned to its size.
            let [lane, ..] = unsafe { load_global_nc(at, T::BYTES) };
            let k = j % per_access;
            words[j / per_access][k / per_word] |= lane << lane_shift::<T>(k);
        });
        ColumnWords { words, _element: PhantomData }
    }

    /// Elements `col..col + N` as f32.
    ///
    /// # Safety
    /// As [`ColumnLoad::fetch`].
    #[inline(always)]
    pub unsafe fn load<const N: usize>(&self, col: u64) -> [f32; N] {
        // SAFETY: forwarded to the caller.
        unsafe { self.fetch::<N>(col) }.to_f32()
    }
}

/// Elements `col..col + N` of the vector of `T` at `base`, in accesses of at most 16 bytes.
///
/// # Safety
/// They must be inside the vector, `col` a multiple of `N`, and `base` aligned to
/// `min(N * size_of::<T>(), 16)`.
#[inline(always)]
unsafe fn fetch_aligned<T: Scalar, const N: usize>(base: GlobalAddr, col: u64) -> ColumnWords<T, N> {
    let per_access = PACK_BYTES / T::BYTES;
    let mut words = [[0; 4]; 2];
    unroll::<2>(|access| {
        let first = access * per_access;
        if first < N {
            let count = if N - first < per_access { N - first } else { per_access };
            let at = base.offset((col + first as u64) * T::BYTES as u64);
            // SAFETY: `count` elements inside the vector, aligned to their size (the
            // caller's alignment, and `first` is a multiple of the 16-byte access).
            words[access] = unsafe { load_global_nc(at, count * T::BYTES) };
        }
    });
    ColumnWords { words, _element: PhantomData }
}

/// What [`ColumnLoad::fetch`] read: `N` elements of `T` in at most two 16-byte accesses.
#[derive(Clone, Copy)]
pub struct ColumnWords<T, const N: usize> {
    words: [[u32; 4]; 2],
    _element: PhantomData<T>,
}

impl<T: Scalar, const N: usize> Default for ColumnWords<T, N> {
    fn default() -> Self {
        ColumnWords { words: [[0; 4]; 2], _element: PhantomData }
    }
}

impl<T: Scalar, const N: usize> ColumnWords<T, N> {
    #[inline(always)]
    pub fn to_f32(&self) -> [f32; N] {
        let per_access = PACK_BYTES / T::BYTES;
        unrolled_array(|j| lane_of::<T>(&self.words[j / per_access], j % per_access).to_f32())
    }
}
