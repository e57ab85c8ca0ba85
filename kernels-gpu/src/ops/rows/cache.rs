//! Row caches in shared memory: a block's (or a cluster block's) share of a row, copied in
//! with `cp.async` where the load has a source, some packs held in registers.

use super::split::{BlockRow, Slice, block_packs, block_packs_from, block_packs_loaded};
use crate::abi::PACK_BYTES;
use crate::arch::{
    SharedAddr, block_dim_x, commit_async_copies, copy_async, load_global_nc, load_shared, store_shared, thread_idx_x,
    wait_async_groups_but,
};
use crate::pack::{Load, Pack, RowMajor};
use crate::scalar::Scalar;
use crate::unroll::unroll;
use core::cell::Cell;
use core::marker::PhantomData;

/// A block's row cached in shared memory as `C` (the dtype holding the row's values
/// exactly, so a 16-bit row takes half the bytes of f32), in packs of `P` elements. A pack's
/// bytes are split into accesses of at most 16 bytes, access `q` of every pack stored
/// together, so a warp's vector accesses are consecutive and conflict-free. A thread reads
/// back only the packs it wrote (after `wait_async_copies` for copied ones): no barrier
/// guards the cache.
#[derive(Clone, Copy)]
pub(crate) struct RowCache<C, const P: usize> {
    pub(super) base: SharedAddr,
    pub(super) slice: Slice,
    pub(super) _element: PhantomData<C>,
}

impl<C: Scalar, const P: usize> RowCache<C, P> {
    /// Bytes of one access.
    pub(super) const ACCESS: usize = if P * C::BYTES < PACK_BYTES { P * C::BYTES } else { PACK_BYTES };
    /// Accesses per pack (1, or 2 for packs of 8 f32s).
    pub(super) const ACCESSES: usize = P * C::BYTES / Self::ACCESS;
    /// Elements per access.
    pub(super) const PER_ACCESS: usize = Self::ACCESS / C::BYTES;

    /// The cache of `slice` of a row, at `base`.
    #[inline(always)]
    pub(crate) fn new(base: SharedAddr, slice: Slice) -> Self {
        RowCache { base, slice, _element: PhantomData }
    }

    /// Where the shared memory after this cache starts (for a second cached array).
    #[inline(always)]
    pub(crate) fn end(&self) -> SharedAddr {
        self.base.offset(self.slice.packs as u32 * (P * C::BYTES) as u32)
    }

    #[inline(always)]
    pub(super) fn at(&self, local: u64, access: usize) -> SharedAddr {
        self.base.offset((access as u32 * self.slice.packs as u32 + local as u32) * Self::ACCESS as u32)
    }

    /// Caches this thread's packs of `row` as `load` reads them. A load with a source has
    /// its packs copied to shared memory as the source holds them (`cp.async`: all in
    /// flight at once, no registers; read them after `wait_async_copies`). Other loads'
    /// packs are fetched in batches, converted and written. Why the copies:
    /// ptxas issued each register-staged pack's shared store right after its load, and the
    /// next load only after that store.
    ///
    /// A row the previous row's last pass prefetched ([`RowCache::prefetch`]) is not
    /// requested again.
    ///
    /// # Safety
    /// `at.row` must be a row of `shape`, whose packs the launch sized the cache for.
    #[inline(always)]
    pub(crate) unsafe fn fill<L: Load<P, Exact = C>>(&self, load: &L, at: BlockRow) {
        if self.requested(load, at) {
            return;
        }
        let row = at.row;
        let slice = self.slice.in_row(at);
        match load.source() {
            // cp.async moves 4, 8 or 16 bytes; a source's pack is one access.
            // SAFETY: the pack is inside the row and the cache.
            Some(view) if Self::ACCESS >= 4 => {
                block_packs::<P>(slice, |local, col| unsafe { self.copy_pack(load, view, row, col, local) })
            }
            // Single 8- or 16-bit elements: copied through registers, still untransformed.
            Some(view) => block_packs_loaded::<P, _>(
                slice,
                // SAFETY: the element is inside the row.
                |col| unsafe { load_global_nc(view.at(row, col), Self::ACCESS) },
                // SAFETY: the element is inside the cache.
                |local, _, words| unsafe { store_shared(self.at(local, 0), Self::ACCESS, words) },
            ),
            None => block_packs_loaded::<P, _>(
                slice,
                // SAFETY: the pack is inside the row.
                |col| unsafe { load.fetch(row, col) },
                // SAFETY: what `fetch` returned for this pack; the pack is inside the cache.
                |local, col, fetched| unsafe { self.write(local, load.convert(fetched, row, col)) },
            ),
        }
    }

    /// Caches this thread's packs of `at.row` as `load` reads them, and its packs of the same
    /// slice into `other` as `other_load` reads them: where both caches copy, pack by pack,
    /// each array's copies of a pack a group of their own (`self`'s first), as the last
    /// pass's prefetches order them, so [`HeldRowCache::landed_pairs`] can take each pack as
    /// it lands; else as [`RowCache::fill`] for each.
    ///
    /// # Safety
    /// As [`RowCache::fill`], for both caches (`other` of the same slice).
    #[inline(always)]
    pub(super) unsafe fn fill_pair<L: Load<P, Exact = C>, D: Scalar, M: Load<P, Exact = D>>(
        &self,
        load: &L,
        other: &RowCache<D, P>,
        other_load: &M,
        at: BlockRow,
    ) {
        // SAFETY: forwarded to the caller.
        unsafe { self.copy_pair(load, other, other_load, at, true) };
    }

    /// [`RowCache::fill_pair`]'s copies: each pack's of each array a group of its own where
    /// `group_per_pack` (a constant after inlining), else left in the open group.
    ///
    /// # Safety
    /// As [`RowCache::fill`], for both caches.
    #[inline(always)]
    pub(super) unsafe fn copy_pair<L: Load<P, Exact = C>, D: Scalar, M: Load<P, Exact = D>>(
        &self,
        load: &L,
        other: &RowCache<D, P>,
        other_load: &M,
        at: BlockRow,
        group_per_pack: bool,
    ) {
        match (load.source(), other_load.source()) {
            (Some(view), Some(other_view)) if self.copies(load) && other.copies(other_load) => {
                if self.requested(load, at) {
                    return;
                }
                let row = at.row;
                // SAFETY: the pack is inside the row and both caches.
                block_packs::<P>(self.slice.in_row(at), |local, col| unsafe {
                    self.start_copy(load, view, row, col, local);
                    if group_per_pack {
                        commit_async_copies();
                    }
                    other.start_copy(other_load, other_view, row, col, local);
                    if group_per_pack {
                        commit_async_copies();
                    }
                });
            }
            // SAFETY: forwarded to the caller.
            _ => unsafe {
                self.fill(load, at);
                other.fill(other_load, at);
            },
        }
    }

    /// Starts copying pack `local` of the cache from `view` at `col` of `row` where `load`
    /// reads it, and closes the pack's group (empty where the load does not read it), so each
    /// pack's copies stay a group of their own.
    ///
    /// # Safety
    /// The pack must be inside the row and the cache.
    #[inline(always)]
    pub(super) unsafe fn copy_pack<L: Load<P, Exact = C>>(
        &self,
        load: &L,
        view: RowMajor<C>,
        row: u64,
        col: u64,
        local: u64,
    ) {
        // SAFETY: forwarded to the caller.
        unsafe { self.start_copy(load, view, row, col, local) };
        commit_async_copies();
    }

    /// Starts copying pack `local` of the cache from `view` at `col` of `row` where `load`
    /// reads it, in the group of copies still open.
    ///
    /// # Safety
    /// As [`RowCache::copy_pack`].
    #[inline(always)]
    pub(super) unsafe fn start_copy<L: Load<P, Exact = C>>(
        &self,
        load: &L,
        view: RowMajor<C>,
        row: u64,
        col: u64,
        local: u64,
    ) {
        if load.reads(row, col) {
            // SAFETY: forwarded to the caller; a source's pack is one access, aligned to its size.
            unsafe { copy_async(self.at(local, 0), view.at(row, col), Self::ACCESS) };
        }
    }

    /// Caches this thread's packs of `at.row` into this cache and `other` (of the same
    /// slice) as [`RowCache::fill_pair`] does, but as one group of copies committed after
    /// the last, so that [`wait_async_groups_but`]`(1)` waits for an earlier row's group
    /// while this one is still in flight (a staged row: see `BackwardRows::cached`). Caches
    /// that do not copy are filled before this returns; their group is empty.
    ///
    /// # Safety
    /// As [`RowCache::fill`], for both caches.
    #[inline(always)]
    pub(super) unsafe fn stage_pair<L: Load<P, Exact = C>, D: Scalar, M: Load<P, Exact = D>>(
        &self,
        load: &L,
        other: &RowCache<D, P>,
        other_load: &M,
        at: BlockRow,
    ) {
        // SAFETY: forwarded to the caller; the row is copied even where the one before
        // requested it (a staged row's successor is marked so by the row walk).
        unsafe { self.copy_pair(load, other, other_load, BlockRow { prefetched: false, ..at }, false) };
        commit_async_copies();
    }

    /// Whether the cache copies `load`'s packs (`cp.async`) rather than staging them.
    #[inline(always)]
    pub(crate) fn copies<L: Load<P, Exact = C>>(&self, load: &L) -> bool {
        load.source().is_some() && Self::ACCESS >= 4
    }

    /// Whether the previous row's last pass already requested row `at`'s packs
    /// ([`RowCache::prefetch`]): only caches that copy prefetch.
    #[inline(always)]
    pub(super) fn requested<L: Load<P, Exact = C>>(&self, load: &L, at: BlockRow) -> bool {
        at.prefetched && self.copies(load)
    }

    /// The row after `at` (and its head) that this cache prefetches for `load`, if any.
    #[inline(always)]
    pub(super) fn prefetched_row<L: Load<P, Exact = C>>(&self, load: &L, at: BlockRow) -> Option<(u64, u64)> {
        at.next.filter(|_| self.copies(load))
    }

    /// `cached`, the values of the pack at `col` of `row` as the cache holds them, as `load`
    /// gives them: transformed where the cache holds the load's source.
    ///
    /// # Safety
    /// As [`Load::transform`].
    #[inline(always)]
    pub(super) unsafe fn loaded<L: Load<P, Exact = C>>(load: &L, cached: [f32; P], row: u64, col: u64) -> [f32; P] {
        // SAFETY: forwarded to the caller.
        if load.source().is_some() { unsafe { load.transform(cached, row, col) } } else { cached }
    }

    /// Starts copying pack `local` of the row after `at` into its slot, where there is one
    /// and the cache copies `load`: the next row's loads then overlap the rest of this row.
    ///
    /// # Safety
    /// As [`RowCache::fill`]; this thread must be done reading pack `local` of `at.row`
    /// (the copy lands in the same slot: call this after the values read are used).
    #[inline(always)]
    pub(crate) unsafe fn prefetch<L: Load<P, Exact = C>>(&self, load: &L, at: BlockRow, local: u64) {
        if let (Some(view), Some((next, head))) = (load.source(), self.prefetched_row(load, at)) {
            let col = Slice { head, ..self.slice }.col::<P>(local);
            // SAFETY: the pack is inside the row and the cache.
            unsafe { self.copy_pack(load, view, next, col, local) };
        }
    }

    /// Calls `f(local)` for this thread's packs of the row it filled or prefetched, each
    /// pack waited for on its own: the first packs are used while later ones are still in
    /// flight. Each pack's copies are `groups` groups of their own, committed pack by pack
    /// (1 for this cache alone, 2 for [`HeldRowCache::landed_pairs`]); packs not copied
    /// are there already.
    #[inline(always)]
    pub(crate) fn landed_packs(&self, groups: u32, mut f: impl FnMut(u64)) {
        let mut after = self.slice.thread_packs();
        block_packs::<P>(self.slice, |local, _| {
            after -= 1;
            wait_async_groups_but(after * groups);
            f(local);
        });
    }

    /// The values of pack `local` of the slice of row `at` as `load` gives them: the cached
    /// ones, transformed where the cache holds the load's source.
    ///
    /// # Safety
    /// This thread must have filled the pack through `load` (and waited for its copies).
    #[inline(always)]
    pub(crate) unsafe fn read<L: Load<P, Exact = C>>(&self, load: &L, at: BlockRow, local: u64) -> [f32; P] {
        // SAFETY: forwarded to the caller.
        unsafe {
            let cached = self.read_cached(local);
            Self::loaded(load, cached, at.row, self.slice.in_row(at).col::<P>(local))
        }
    }

    /// # Safety
    /// `pack` must be a pack of the row, inside the shared memory the launch sized.
    #[inline(always)]
    pub(super) unsafe fn write(&self, pack: u64, values: [f32; P]) {
        let words = Self::to_words(values);
        unroll::<2>(|access| {
            if access < Self::ACCESSES {
                // SAFETY: forwarded to the caller; the access is aligned to its size.
                unsafe { store_shared(self.at(pack, access), Self::ACCESS, words[access]) };
            }
        });
    }

    /// # Safety
    /// As [`RowCache::write`], after this thread wrote `pack`.
    #[inline(always)]
    pub(super) unsafe fn read_cached(&self, pack: u64) -> [f32; P] {
        let mut words = [[0; 4]; 2];
        unroll::<2>(|access| {
            if access < Self::ACCESSES {
                // SAFETY: forwarded to the caller.
                words[access] = unsafe { load_shared(self.at(pack, access), Self::ACCESS) };
            }
        });
        Self::from_words(words)
    }

    /// A pack's values as the cache holds them: `C`s, in the words of each access.
    #[inline(always)]
    pub(super) fn to_words(values: [f32; P]) -> PackWords {
        let mut words = [[0; 4]; 2];
        unroll::<2>(|access| {
            if access < Self::ACCESSES {
                let mut pack = Pack::<C, 8>::new();
                unroll::<8>(|k| {
                    if k < Self::PER_ACCESS {
                        pack.set(k, C::from_f32(values[access * Self::PER_ACCESS + k]));
                    }
                });
                words[access] = pack.words();
            }
        });
        words
    }

    /// The values of a pack the cache holds as `words` ([`RowCache::to_words`]).
    #[inline(always)]
    pub(super) fn from_words(words: PackWords) -> [f32; P] {
        let mut values = [0.0; P];
        unroll::<2>(|access| {
            if access < Self::ACCESSES {
                let pack = Pack::<C, 8>::from_words(words[access]);
                unroll::<8>(|k| {
                    if k < Self::PER_ACCESS {
                        values[access * Self::PER_ACCESS + k] = pack.get_f32(k);
                    }
                });
            }
        });
        values
    }
}

/// The words a cache holds of one pack, one array of up to 16 bytes per access.
pub(super) type PackWords = [[u32; 4]; 2];

/// Where [`HeldRowCache`] keeps one of this thread's packs.
#[derive(Clone, Copy)]
pub(crate) enum CachedPack {
    /// In registers: the thread's `k`-th pack of the slice.
    Held(usize),
    /// In shared memory: pack `local` of the part of the slice there.
    Shared(u64),
}

/// A [`RowCache`] that keeps each thread's first `HELD` packs of the block's slice in
/// registers and only the rest in shared memory, so a slice up to `HELD * block` packs
/// larger than a block's shared memory still fits: the cluster path then splits a row over
/// fewer blocks, keeping more SMs busy (clusters of 16 leave 20 of the H100's 132 idle,
/// clusters of 8 leave 12). Held packs are loaded into their registers, whose loads stay in
/// flight until the values are used, and prefetched for the next row the same way.
pub(crate) struct HeldRowCache<C, const P: usize, const HELD: usize> {
    pub(super) slice: Slice,
    pub(super) held: Cell<[PackWords; HELD]>,
    /// The rest of the slice, past the held packs.
    pub(super) shared: RowCache<C, P>,
}

impl<C: Scalar, const P: usize, const HELD: usize> HeldRowCache<C, P, HELD> {
    /// The cache of `slice` of a row, its shared part at `base`.
    #[inline(always)]
    pub(crate) fn new(base: SharedAddr, slice: Slice) -> Self {
        let held = (HELD as u64 * block_dim_x() as u64).min(slice.packs);
        let rest = Slice { first: slice.first + held, packs: slice.packs - held, ..slice };
        HeldRowCache { slice, held: Cell::new([[[0; 4]; 2]; HELD]), shared: RowCache::new(base, rest) }
    }

    /// Where the shared memory after this cache starts (for a second cached array).
    #[inline(always)]
    pub(crate) fn end(&self) -> SharedAddr {
        self.shared.end()
    }

    /// Calls `f(pack, col)` for this thread's packs of the slice of row `at`, the held ones
    /// first (as [`block_packs`] orders them).
    #[inline(always)]
    pub(crate) fn packs(&self, at: BlockRow, mut f: impl FnMut(CachedPack, u64)) {
        self.numbered_packs::<0>(at, |pack, col, _| f(pack, col));
    }

    /// As [`HeldRowCache::packs`], with `Some(n)` for this thread's `n`-th pack where `n`
    /// is below `K`: those calls are unrolled, so `n` is a constant that may index registers.
    #[inline(always)]
    pub(crate) fn numbered_packs<const K: usize>(
        &self,
        at: BlockRow,
        mut f: impl FnMut(CachedPack, u64, Option<usize>),
    ) {
        self.held_packs(at, |k, col| f(CachedPack::Held(k), col, (k < K).then_some(k)));
        let shared = self.shared.slice.in_row(at);
        unroll::<K>(|n| {
            if n >= HELD
                && let Some((local, col)) = shared.thread_pack::<P>(n - HELD)
            {
                f(CachedPack::Shared(local), col, Some(n));
            }
        });
        let skip = K.saturating_sub(HELD) as u32;
        block_packs_from::<P>(shared, skip, |local, col| f(CachedPack::Shared(local), col, None));
    }

    /// Calls `f(k, col)` for this thread's held packs of the slice of row `at`.
    #[inline(always)]
    pub(super) fn held_packs(&self, at: BlockRow, mut f: impl FnMut(usize, u64)) {
        let slice = self.slice.in_row(at);
        unroll::<HELD>(|k| {
            if let Some((_, col)) = slice.thread_pack::<P>(k) {
                f(k, col);
            }
        });
    }

    /// Caches this thread's packs of `at.row` as [`RowCache::fill`] does, the held ones
    /// loaded into registers.
    ///
    /// # Safety
    /// As [`RowCache::fill`].
    #[inline(always)]
    pub(crate) unsafe fn fill<L: Load<P, Exact = C>>(&self, load: &L, at: BlockRow) {
        self.hold_row(load, at);
        // SAFETY: forwarded to the caller.
        unsafe { self.shared.fill(load, at) };
    }

    /// Loads this thread's held packs of `at.row` into their registers, unless the last
    /// row's pass prefetched them.
    #[inline(always)]
    pub(super) fn hold_row<L: Load<P, Exact = C>>(&self, load: &L, at: BlockRow) {
        if !self.shared.requested(load, at) {
            // SAFETY: the pack is inside the row.
            self.held_packs(at, |k, col| unsafe { self.hold(k, load, at.row, col) });
        }
    }

    /// Caches this thread's packs of `at.row` into this cache and `other` as
    /// [`RowCache::fill_pair`] does, the held ones loaded into registers.
    ///
    /// # Safety
    /// As [`RowCache::fill`], for both caches (`other` of the same slice).
    #[inline(always)]
    pub(crate) unsafe fn fill_pair<L: Load<P, Exact = C>, D: Scalar, M: Load<P, Exact = D>>(
        &self,
        load: &L,
        other: &HeldRowCache<D, P, HELD>,
        other_load: &M,
        at: BlockRow,
    ) {
        self.hold_row(load, at);
        other.hold_row(other_load, at);
        // SAFETY: forwarded to the caller.
        unsafe { self.shared.fill_pair(load, &other.shared, other_load, at) };
    }

    /// Caches this thread's packs of `at.row` into this cache and `other` as one group of
    /// copies ([`RowCache::stage_pair`]), its shared part alone.
    ///
    /// # Safety
    /// As [`RowCache::fill`], for both caches (`other` of the same slice); the caches must
    /// hold no packs in registers (`HELD` 0), whose registers would take the staged row
    /// over the one in use.
    #[inline(always)]
    pub(crate) unsafe fn stage_pair<L: Load<P, Exact = C>, D: Scalar, M: Load<P, Exact = D>>(
        &self,
        load: &L,
        other: &HeldRowCache<D, P, HELD>,
        other_load: &M,
        at: BlockRow,
    ) {
        // SAFETY: forwarded to the caller.
        unsafe { self.shared.stage_pair(load, &other.shared, other_load, at) };
    }

    /// As [`HeldRowCache::packs`] over a row filled or prefetched through this cache and
    /// `other` (of the same slice) pack by pack ([`HeldRowCache::fill_pair`], or prefetches
    /// of this cache's pack then `other`'s): each shared pack is waited for on its own, the
    /// first used while later ones are still in flight (the held ones are loaded into
    /// registers, waited for where used).
    #[inline(always)]
    pub(crate) fn landed_pairs<L: Load<P, Exact = C>, D: Scalar, M: Load<P, Exact = D>>(
        &self,
        load: &L,
        other: &HeldRowCache<D, P, HELD>,
        other_load: &M,
        at: BlockRow,
        mut f: impl FnMut(CachedPack, u64),
    ) {
        let groups = self.shared.copies(load) as u32 + other.shared.copies(other_load) as u32;
        self.held_packs(at, |k, col| f(CachedPack::Held(k), col));
        let shared = self.shared.slice.in_row(at);
        self.shared.landed_packs(groups, |local| f(CachedPack::Shared(local), shared.col::<P>(local)));
    }

    /// Loads held pack `k` of `row`, at `col`, into its registers.
    ///
    /// # Safety
    /// The pack must be inside the row, aligned to its size.
    #[inline(always)]
    pub(super) unsafe fn hold<L: Load<P, Exact = C>>(&self, k: usize, load: &L, row: u64, col: u64) {
        let mut held = self.held.get();
        // SAFETY: forwarded to the caller. A source's pack is one access, held as the
        // source stores it, as `RowCache::fill` copies it.
        held[k] = unsafe {
            match load.source() {
                Some(view) => [load_global_nc(view.at(row, col), RowCache::<C, P>::ACCESS), [0; 4]],
                None => RowCache::<C, P>::to_words(load.load(row, col)),
            }
        };
        self.held.set(held);
    }

    /// As [`RowCache::prefetch`], for any of this thread's packs.
    ///
    /// # Safety
    /// As [`RowCache::prefetch`].
    #[inline(always)]
    pub(crate) unsafe fn prefetch<L: Load<P, Exact = C>>(&self, load: &L, at: BlockRow, pack: CachedPack) {
        // SAFETY: forwarded to the caller; the held pack is inside the next row.
        unsafe {
            match pack {
                CachedPack::Held(k) => {
                    if let Some((next, head)) = self.shared.prefetched_row(load, at) {
                        let local = thread_idx_x() as u64 + k as u64 * block_dim_x() as u64;
                        self.hold(k, load, next, Slice { head, ..self.slice }.col::<P>(local));
                    }
                }
                CachedPack::Shared(local) => self.shared.prefetch(load, at, local),
            }
        }
    }

    /// As [`RowCache::read`], for any of this thread's packs.
    ///
    /// # Safety
    /// As [`RowCache::read`].
    #[inline(always)]
    pub(crate) unsafe fn read<L: Load<P, Exact = C>>(
        &self,
        load: &L,
        at: BlockRow,
        pack: CachedPack,
        col: u64,
    ) -> [f32; P] {
        // SAFETY: forwarded to the caller.
        unsafe {
            match pack {
                CachedPack::Held(k) => {
                    RowCache::<C, P>::loaded(load, RowCache::<C, P>::from_words(self.held.get()[k]), at.row, col)
                }
                CachedPack::Shared(local) => self.shared.read(load, at, local),
            }
        }
    }
}
