//! Device intrinsics: the only module that touches `core::arch::nvptx` or inline PTX.
//!
//! Thread/block indices, barriers, warp shuffles and ballots, dynamic shared memory and
//! global-memory vector accesses exist on the NVPTX target only. The math primitives
//! (`ex2`, `lg2`, `rsqrt`, `rcp`) and the bf16 conversion also have host versions, so the
//! portable math built on them ([`crate::math`], [`crate::functor`]) runs in CPU unit tests.

#[cfg(target_arch = "nvptx64")]
pub use device::*;

/// `2^x`. Device: `ex2.approx.ftz.f32` (max 2 ulp, one SFU op).
#[inline(always)]
pub fn ex2(x: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let y: f32;
        // SAFETY: a pure register-to-register instruction.
        unsafe {
            core::arch::asm!("ex2.approx.ftz.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x,
                options(pure, nomem, nostack));
        }
        y
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        x.exp2()
    }
}

/// `log2(x)`. Device: `lg2.approx.ftz.f32`.
#[inline(always)]
pub fn lg2(x: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let y: f32;
        // SAFETY: a pure register-to-register instruction.
        unsafe {
            core::arch::asm!("lg2.approx.ftz.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x,
                options(pure, nomem, nostack));
        }
        y
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        x.log2()
    }
}

/// `1/sqrt(x)`. Device: `rsqrt.approx.ftz.f32`.
#[inline(always)]
pub fn rsqrt(x: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let y: f32;
        // SAFETY: a pure register-to-register instruction.
        unsafe {
            core::arch::asm!("rsqrt.approx.ftz.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x,
                options(pure, nomem, nostack));
        }
        y
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        1.0 / x.sqrt()
    }
}

/// `1/x`. Device: `rcp.approx.ftz.f32` (1 ulp), instead of the IEEE division sequence.
#[inline(always)]
pub fn rcp(x: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let y: f32;
        // SAFETY: a pure register-to-register instruction.
        unsafe {
            core::arch::asm!("rcp.approx.ftz.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x,
                options(pure, nomem, nostack));
        }
        y
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        1.0 / x
    }
}

/// `a * b + c` rounded once (`fma.rn.f32`).
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let d: f32;
        // SAFETY: a pure register-to-register instruction.
        unsafe {
            core::arch::asm!("fma.rn.f32 {d}, {a}, {b}, {c};", d = out(reg32) d, a = in(reg32) a,
                b = in(reg32) b, c = in(reg32) c, options(pure, nomem, nostack));
        }
        d
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        a.mul_add(b, c)
    }
}

/// f32 to bf16 bits, round to nearest even; NaN stays a quiet NaN.
/// Device: one `cvt.rn.bf16.f32` (sm_80).
#[inline(always)]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    #[cfg(target_arch = "nvptx64")]
    {
        let y: u16;
        // SAFETY: a pure register-to-register instruction.
        unsafe {
            core::arch::asm!("cvt.rn.bf16.f32 {y}, {x};", y = out(reg16) y, x = in(reg32) x,
                options(pure, nomem, nostack));
        }
        y
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        crate::scalar::bf16_bits_round_to_nearest_even(x)
    }
}

#[cfg(target_arch = "nvptx64")]
mod device {
    use core::arch::{asm, global_asm, nvptx};

    #[cfg(feature = "cluster")]
    use crate::abi::CLUSTER_EXCHANGE_BYTES;

    /// Threads in a warp.
    pub const WARP_SIZE: u32 = 32;
    /// Member mask of a full warp.
    pub const FULL_MASK: u32 = 0xffff_ffff;

    #[inline(always)]
    pub fn thread_idx_x() -> u32 {
        // SAFETY: reads a special register.
        unsafe { nvptx::_thread_idx_x() as u32 }
    }

    #[inline(always)]
    pub fn block_idx_x() -> u32 {
        // SAFETY: reads a special register.
        unsafe { nvptx::_block_idx_x() as u32 }
    }

    #[inline(always)]
    pub fn block_dim_x() -> u32 {
        // SAFETY: reads a special register.
        unsafe { nvptx::_block_dim_x() as u32 }
    }

    #[inline(always)]
    pub fn grid_dim_x() -> u32 {
        // SAFETY: reads a special register.
        unsafe { nvptx::_grid_dim_x() as u32 }
    }

    /// Lane index within the warp.
    #[inline(always)]
    pub fn lane_id() -> u32 {
        thread_idx_x() % WARP_SIZE
    }

    /// Mask of the lanes below this one (`%lanemask_lt`).
    #[inline(always)]
    pub fn lanemask_lt() -> u32 {
        let m: u32;
        // SAFETY: reads a special register.
        unsafe { asm!("mov.u32 {m}, %lanemask_lt;", m = out(reg32) m, options(pure, nomem, nostack)) };
        m
    }

    /// Block-wide barrier (`bar.sync 0`).
    ///
    /// # Safety
    /// Every thread of the block must reach it (no divergent call sites).
    #[inline(always)]
    pub unsafe fn sync_threads() {
        // SAFETY: forwarded to the caller.
        unsafe { nvptx::_syncthreads() }
    }

    /// Aborts the kernel; the launch then reports an error to the host.
    #[inline(always)]
    pub fn trap() -> ! {
        // SAFETY: `trap` ends the thread; nothing after it runs.
        unsafe { nvptx::trap() }
    }

    /// Operand `c` of `shfl.sync` for a thread group of `width` lanes (a power of two up to 32):
    /// the segment mask in bits 8..13 and the clamp value in bits 0..4, as CUDA's `__shfl_*_sync`.
    #[inline(always)]
    const fn shfl_clamp(width: u32) -> u32 {
        ((WARP_SIZE - width) << 8) | 0x1f
    }

    macro_rules! shuffle {
        ($(#[$doc:meta])* $name:ident, $mode:literal) => {
            $(#[$doc])*
            ///
            /// # Safety
            /// Every lane named in `mask` must execute this same shuffle (convergence), and
            /// `width` must be a power of two no larger than 32.
            #[inline(always)]
            pub unsafe fn $name(mask: u32, value: u32, operand: u32, width: u32) -> u32 {
                let out: u32;
                // SAFETY: forwarded to the caller (convergence of the lanes in `mask`).
                unsafe {
                    asm!(concat!("shfl.sync.", $mode, ".b32 {out}, {value}, {operand}, {clamp}, {mask};"),
                        out = out(reg32) out, value = in(reg32) value, operand = in(reg32) operand,
                        clamp = in(reg32) shfl_clamp(width), mask = in(reg32) mask,
                        options(nomem, nostack));
                }
                out
            }
        };
    }

    shuffle!(
        /// Value of lane `lane ^ operand` within each group of `width` lanes.
        shfl_xor_u32,
        "bfly"
    );
    shuffle!(
        /// Value of lane `lane + operand` within each group of `width` lanes (own value past the end).
        shfl_down_u32,
        "down"
    );
    shuffle!(
        /// Value of lane `operand` of this lane's group of `width` lanes.
        shfl_idx_u32,
        "idx"
    );

    /// [`shfl_down_u32`] on an f32.
    ///
    /// # Safety
    /// As [`shfl_down_u32`].
    #[inline(always)]
    pub unsafe fn shfl_down(mask: u32, value: f32, delta: u32, width: u32) -> f32 {
        // SAFETY: forwarded to the caller.
        f32::from_bits(unsafe { shfl_down_u32(mask, value.to_bits(), delta, width) })
    }

    /// [`shfl_idx_u32`] on an f32.
    ///
    /// # Safety
    /// As [`shfl_idx_u32`].
    #[inline(always)]
    pub unsafe fn shfl_idx(mask: u32, value: f32, lane: u32, width: u32) -> f32 {
        // SAFETY: forwarded to the caller.
        f32::from_bits(unsafe { shfl_idx_u32(mask, value.to_bits(), lane, width) })
    }

    /// One bit per lane in `mask`: set where `predicate` holds (`vote.sync.ballot.b32`).
    ///
    /// # Safety
    /// Every lane named in `mask` must execute this same vote.
    #[inline(always)]
    pub unsafe fn ballot(mask: u32, predicate: bool) -> u32 {
        let out: u32;
        // SAFETY: forwarded to the caller (convergence of the lanes in `mask`).
        unsafe {
            asm!("{{ .reg .pred p; setp.ne.u32 p, {pred}, 0; vote.sync.ballot.b32 {out}, p, {mask}; }}",
                out = out(reg32) out, pred = in(reg32) predicate as u32, mask = in(reg32) mask,
                options(nomem, nostack));
        }
        out
    }

    global_asm!(".extern .shared .align 16 .b8 rill_dynamic_shared[];");
    global_asm!(".shared .align 16 .b8 rill_reduce_scratch[256];");

    /// Two words for each of 32 warps of static shared memory, for block-wide reductions.
    #[inline(always)]
    pub fn reduce_scratch() -> *mut u32 {
        let p: u64;
        // SAFETY: takes the address of the static shared array declared above.
        unsafe {
            asm!("cvta.shared.u64 {p}, rill_reduce_scratch;", p = out(reg64) p,
                options(pure, nomem, nostack));
        }
        p as *mut u32
    }

    /// An address in the block's shared-memory window (what `ld.shared`/`st.shared` take).
    #[derive(Clone, Copy)]
    pub struct SharedAddr(u32);

    impl SharedAddr {
        /// This address advanced by `bytes`.
        #[inline(always)]
        pub fn offset(self, bytes: u32) -> Self {
            SharedAddr(self.0 + bytes)
        }
    }

    /// Start of the block's dynamic shared memory (sized by the launch), as a shared-window
    /// address.
    #[inline(always)]
    pub fn dynamic_shared_addr() -> SharedAddr {
        let a: u32;
        // SAFETY: takes the shared-window address of the dynamic shared array declared above.
        unsafe {
            asm!("mov.u32 {a}, rill_dynamic_shared;", a = out(reg32) a, options(pure, nomem, nostack));
        }
        SharedAddr(a)
    }

    /// Loads `bytes` bytes (16, 8, 4 or 2; a constant after inlining) of shared memory in one
    /// access, as words. Not `pure`: shared memory changes under it, so it stays in program
    /// order with the stores.
    ///
    /// # Safety
    /// `addr` must be inside the block's shared memory, valid for reads of `bytes` bytes
    /// and aligned to `bytes`.
    #[inline(always)]
    pub unsafe fn load_shared(addr: SharedAddr, bytes: usize) -> [u32; 4] {
        let mut w = [0u32; 4];
        // SAFETY: forwarded to the caller; each arm reads exactly `bytes` bytes.
        unsafe {
            match bytes {
                16 => asm!("ld.shared.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
                    a = out(reg32) w[0], b = out(reg32) w[1], c = out(reg32) w[2], d = out(reg32) w[3],
                    p = in(reg32) addr.0, options(readonly, nostack)),
                8 => asm!("ld.shared.v2.u32 {{{a}, {b}}}, [{p}];", a = out(reg32) w[0], b = out(reg32) w[1],
                    p = in(reg32) addr.0, options(readonly, nostack)),
                4 => asm!("ld.shared.u32 {a}, [{p}];", a = out(reg32) w[0], p = in(reg32) addr.0,
                    options(readonly, nostack)),
                2 => {
                    let h: u16;
                    asm!("ld.shared.u16 {h}, [{p}];", h = out(reg16) h, p = in(reg32) addr.0,
                        options(readonly, nostack));
                    w[0] = h as u32;
                }
                _ => trap(),
            }
        }
        w
    }

    /// Starts copying `bytes` (16, 8 or 4; a constant after inlining) from global to shared
    /// memory without passing through registers (`cp.async`, sm_80): 16-byte copies bypass
    /// L1 (`.cg`). The data is there once this thread has run [`wait_async_copies`].
    ///
    /// # Safety
    /// `src` must be valid for reads and `dst` inside the block's shared memory, both for
    /// `bytes` and aligned to them; nobody writes `src` during the kernel.
    #[inline(always)]
    pub unsafe fn copy_async(dst: SharedAddr, src: GlobalAddr, bytes: usize) {
        // SAFETY: forwarded to the caller.
        unsafe {
            match bytes {
                16 => asm!("cp.async.cg.shared.global [{d}], [{s}], 16;", d = in(reg32) dst.0, s = in(reg64) src.0,
                    options(nostack)),
                8 => asm!("cp.async.ca.shared.global [{d}], [{s}], 8;", d = in(reg32) dst.0, s = in(reg64) src.0,
                    options(nostack)),
                4 => asm!("cp.async.ca.shared.global [{d}], [{s}], 4;", d = in(reg32) dst.0, s = in(reg64) src.0,
                    options(nostack)),
                _ => trap(),
            }
        }
    }

    /// Waits until this thread's [`copy_async`] copies have landed (`cp.async.wait_all`).
    #[inline(always)]
    pub fn wait_async_copies() {
        // SAFETY: waits on this thread's own copies only.
        unsafe { asm!("cp.async.wait_all;", options(nostack)) };
    }

    /// Closes a group of this thread's [`copy_async`] copies: the ones since the last group
    /// (`cp.async.commit_group`), which [`wait_async_groups_but`] waits for in order.
    #[inline(always)]
    pub fn commit_async_copies() {
        // SAFETY: marks this thread's own copies only.
        unsafe { asm!("cp.async.commit_group;", options(nostack)) };
    }

    /// Waits until at most `pending` of this thread's latest copy groups are still in
    /// flight (`cp.async.wait_group`, whose count is an immediate: above 7, waits as for 7).
    #[inline(always)]
    pub fn wait_async_groups_but(pending: u32) {
        macro_rules! wait_group {
            ($($n:literal)*) => {
                // SAFETY: waits on this thread's own copies only.
                match pending {
                    $($n => unsafe { asm!(concat!("cp.async.wait_group ", $n, ";"), options(nostack)) },)*
                    _ => unsafe { asm!("cp.async.wait_group 7;", options(nostack)) },
                }
            };
        }
        wait_group!(0 1 2 3 4 5 6);
    }

    #[cfg(feature = "cluster")]
    global_asm!(".shared .align 16 .b8 rill_cluster_exchange[{bytes}];", bytes = const CLUSTER_EXCHANGE_BYTES);

    /// Static shared memory where the blocks of a cluster exchange a reduction's partials
    /// (see [`CLUSTER_EXCHANGE_BYTES`]).
    #[cfg(feature = "cluster")]
    #[inline(always)]
    pub fn cluster_exchange() -> SharedAddr {
        let a: u32;
        // SAFETY: takes the shared-window address of the static array declared above.
        unsafe { asm!("mov.u32 {a}, rill_cluster_exchange;", a = out(reg32) a, options(pure, nomem, nostack)) };
        SharedAddr(a)
    }

    macro_rules! special_register {
        ($(#[$doc:meta])* $name:ident, $register:literal) => {
            $(#[$doc])*
            #[cfg(feature = "cluster")]
            #[inline(always)]
            pub fn $name() -> u32 {
                let r: u32;
                // SAFETY: reads a special register (sm_90).
                unsafe { asm!(concat!("mov.u32 {r}, ", $register, ";"), r = out(reg32) r, options(pure, nomem, nostack)) };
                r
            }
        };
    }

    special_register!(
        /// This block's rank in its cluster.
        cluster_rank,
        "%cluster_ctarank"
    );
    special_register!(
        /// Blocks per cluster.
        cluster_blocks,
        "%cluster_nctarank"
    );
    special_register!(
        /// This block's cluster, along x.
        cluster_id,
        "%clusterid.x"
    );
    special_register!(
        /// Clusters in the grid, along x.
        clusters,
        "%nclusterid.x"
    );

    /// Cluster-wide barrier: every thread of every block of the cluster arrives (releasing
    /// its shared-memory writes: `arrive`'s default semantics) and waits (acquiring the
    /// others': `wait`'s default; PTX ISA 7.8 has no explicit qualifiers for either).
    ///
    /// # Safety
    /// Every thread of every block of the cluster must call it, the same number of times.
    #[cfg(feature = "cluster")]
    #[inline(always)]
    pub unsafe fn cluster_sync() {
        // SAFETY: forwarded to the caller.
        unsafe { asm!("barrier.cluster.arrive.aligned;", "barrier.cluster.wait.aligned;", options(nostack)) };
    }

    /// Makes the mbarrier at `bar` (8 bytes, 8-aligned) expect one arrival per phase.
    ///
    /// # Safety
    /// `bar` must be 8-byte-aligned shared memory of this block that nothing uses as an
    /// mbarrier yet; one thread initializes it, and [`fence_barrier_init`] and a cluster
    /// barrier must follow before any other thread or block uses it.
    #[cfg(feature = "cluster")]
    #[inline(always)]
    pub unsafe fn init_barrier(bar: SharedAddr) {
        // SAFETY: forwarded to the caller.
        unsafe { asm!("mbarrier.init.shared::cta.b64 [{b}], 1;", b = in(reg32) bar.0, options(nostack)) };
    }

    /// Makes this thread's mbarrier initializations visible to the cluster's other blocks
    /// (`fence.mbarrier_init`, which the cluster barrier after it completes).
    #[cfg(feature = "cluster")]
    #[inline(always)]
    pub fn fence_barrier_init() {
        // SAFETY: a fence; it orders this thread's own initializations only.
        unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) };
    }

    /// Arrives once on the mbarrier at `bar`, announcing `bytes` the current phase awaits
    /// from [`store_remote_async`]s (`mbarrier.arrive.expect_tx`): the phase completes when
    /// both have happened.
    ///
    /// # Safety
    /// `bar` must be an mbarrier of this block initialized by [`init_barrier`]; one arrival
    /// per phase.
    #[cfg(feature = "cluster")]
    #[inline(always)]
    pub unsafe fn expect_bytes(bar: SharedAddr, bytes: u32) {
        // SAFETY: forwarded to the caller.
        unsafe {
            asm!("{{ .reg .b64 s; mbarrier.arrive.expect_tx.shared::cta.b64 s, [{b}], {n}; }}",
                b = in(reg32) bar.0, n = in(reg32) bytes, options(nostack));
        }
    }

    /// Waits until the phase of parity `parity` of the mbarrier at `bar` completes
    /// (`mbarrier.try_wait.parity`, which acquires what the transfers it counted wrote, and
    /// may suspend the thread a while before answering no).
    ///
    /// # Safety
    /// `bar` must be an mbarrier of this block initialized by [`init_barrier`], and the
    /// phase must be the current one or the one just completed.
    #[cfg(feature = "cluster")]
    #[inline(always)]
    #[allow(named_asm_labels, reason = "a PTX label is local to its braces' scope, so copies do not clash")]
    pub unsafe fn wait_barrier(bar: SharedAddr, parity: u32) {
        // SAFETY: forwarded to the caller.
        unsafe {
            asm!("{{ .reg .pred p; rill_wait: mbarrier.try_wait.parity.shared::cta.b64 p, [{b}], {q}; @!p bra rill_wait; }}",
                b = in(reg32) bar.0, q = in(reg32) parity, options(nostack));
        }
    }

    /// Writes `words` to `addr` in the shared memory of block `rank` of this cluster and
    /// counts their 8 bytes on that block's mbarrier at `bar` (`st.async` with
    /// `complete_tx`): no cluster barrier, the reader waits on its own mbarrier.
    ///
    /// # Safety
    /// `rank` must be a block of this cluster, still running; `addr` (8-byte-aligned) and
    /// `bar` (an initialized mbarrier awaiting these bytes) the same offsets as in this
    /// block's shared memory; nothing else writes or reads `addr` until the phase completes.
    #[cfg(feature = "cluster")]
    #[inline(always)]
    pub unsafe fn store_remote_async(addr: SharedAddr, bar: SharedAddr, rank: u32, words: [u32; 2]) {
        // SAFETY: forwarded to the caller.
        unsafe {
            asm!(concat!("{{ .reg .u32 a, b; mapa.shared::cluster.u32 a, {a}, {r}; mapa.shared::cluster.u32 b, {b}, {r}; ",
                    "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [a], {{{w0}, {w1}}}, [b]; }}"),
                a = in(reg32) addr.0, b = in(reg32) bar.0, r = in(reg32) rank,
                w0 = in(reg32) words[0], w1 = in(reg32) words[1], options(nostack));
        }
    }

    /// Start of the block's dynamic shared memory (sized by the launch), as a generic pointer.
    #[inline(always)]
    pub fn dynamic_shared<T>() -> *mut T {
        let p: u64;
        // SAFETY: takes the address of the dynamic shared array declared above.
        unsafe {
            asm!("cvta.shared.u64 {p}, rill_dynamic_shared;", p = out(reg64) p,
                options(pure, nomem, nostack));
        }
        p as *mut T
    }

    /// A device address known to be in the global state space.
    #[derive(Clone, Copy)]
    pub struct GlobalAddr(u64);

    impl GlobalAddr {
        /// # Safety
        /// `generic` must be a generic address of global memory (as `cuMemAlloc` returns).
        #[inline(always)]
        pub unsafe fn from_generic(generic: u64) -> Self {
            let g: u64;
            // SAFETY: a pure address conversion; the caller vouches the address is global.
            unsafe {
                asm!("cvta.to.global.u64 {g}, {p};", g = out(reg64) g, p = in(reg64) generic,
                    options(pure, nomem, nostack));
            }
            GlobalAddr(g)
        }

        /// This address advanced by `bytes`.
        #[inline(always)]
        pub fn offset(self, bytes: u64) -> Self {
            GlobalAddr(self.0 + bytes)
        }
    }

    /// Defines a read-only global load of 16, 8, 4 or 2 bytes with the `ld.global.nc`
    /// qualifiers `$hint` (empty, or an L1 eviction hint).
    macro_rules! global_nc_load {
        ($(#[$doc:meta])* $name:ident, $hint:literal) => {
            $(#[$doc])*
            ///
            /// # Safety
            /// `addr` must be valid for reads of `bytes` bytes (16, 8, 4 or 2; a constant after
            /// inlining), aligned to `bytes`, and not written by anyone during the kernel (the
            /// load goes through the read-only path, `.nc`).
            #[inline(always)]
            pub unsafe fn $name(addr: GlobalAddr, bytes: usize) -> [u32; 4] {
                let mut w = [0u32; 4];
                // SAFETY: forwarded to the caller; each arm reads exactly `bytes` bytes.
                unsafe {
                    match bytes {
                        16 => asm!(concat!("ld.global.nc", $hint, ".v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];"),
                            a = out(reg32) w[0], b = out(reg32) w[1], c = out(reg32) w[2], d = out(reg32) w[3],
                            p = in(reg64) addr.0, options(pure, readonly, nostack)),
                        8 => asm!(concat!("ld.global.nc", $hint, ".v2.u32 {{{a}, {b}}}, [{p}];"),
                            a = out(reg32) w[0], b = out(reg32) w[1], p = in(reg64) addr.0,
                            options(pure, readonly, nostack)),
                        4 => asm!(concat!("ld.global.nc", $hint, ".u32 {a}, [{p}];"), a = out(reg32) w[0],
                            p = in(reg64) addr.0, options(pure, readonly, nostack)),
                        2 => {
                            let h: u16;
                            asm!(concat!("ld.global.nc", $hint, ".u16 {h}, [{p}];"), h = out(reg16) h,
                                p = in(reg64) addr.0, options(pure, readonly, nostack));
                            w[0] = h as u32;
                        }
                        _ => trap(),
                    }
                }
                w
            }
        };
    }

    global_nc_load!(
        /// One access of `bytes` bytes, as words.
        load_global_nc,
        ""
    );
    global_nc_load!(
        /// As [`load_global_nc`], for data read once: it does not allocate in L1, so streaming
        /// rows through an SM leaves its L1 to what is re-read (a norm's gamma and beta).
        load_global_stream,
        ".L1::no_allocate"
    );

    /// Defines a store of the first `bytes` bytes of `w` (16, 8, 4 or 2; a constant after
    /// inlining) in one access to state space `$space`, at an `$addr` held in `$reg`.
    macro_rules! vector_store {
        ($(#[$doc:meta])* $name:ident, $space:literal, $addr:ty, $reg:ident) => {
            $(#[$doc])*
            ///
            /// # Safety
            /// `addr` must be valid for writes of `bytes` bytes and aligned to `bytes`.
            #[inline(always)]
            pub unsafe fn $name(addr: $addr, bytes: usize, w: [u32; 4]) {
                // SAFETY: forwarded to the caller; each arm writes exactly `bytes` bytes.
                unsafe {
                    match bytes {
                        16 => asm!(concat!("st.", $space, ".v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};"),
                            p = in($reg) addr.0, a = in(reg32) w[0], b = in(reg32) w[1], c = in(reg32) w[2],
                            d = in(reg32) w[3], options(nostack)),
                        8 => asm!(concat!("st.", $space, ".v2.u32 [{p}], {{{a}, {b}}};"),
                            p = in($reg) addr.0, a = in(reg32) w[0], b = in(reg32) w[1], options(nostack)),
                        4 => asm!(concat!("st.", $space, ".u32 [{p}], {a};"), p = in($reg) addr.0,
                            a = in(reg32) w[0], options(nostack)),
                        2 => asm!(concat!("st.", $space, ".u16 [{p}], {h};"), p = in($reg) addr.0,
                            h = in(reg16) w[0] as u16, options(nostack)),
                        _ => trap(),
                    }
                }
            }
        };
    }

    vector_store!(
        /// Stores to global memory.
        store_global,
        "global",
        GlobalAddr,
        reg64
    );
    vector_store!(
        /// Stores to the block's shared memory.
        store_shared,
        "shared",
        SharedAddr,
        reg32
    );

    macro_rules! paired {
        ($(#[$doc:meta])* $name:ident, $args:literal, ($($arg:ident),*)) => {
            $(#[$doc])*
            #[inline(always)]
            pub fn $name($($arg: u32),*) -> u32 {
                let d: u32;
                // SAFETY: a pure register-to-register instruction (sm_80).
                unsafe {
                    asm!($args, d = out(reg32) d, $($arg = in(reg32) $arg),*,
                        options(pure, nomem, nostack));
                }
                d
            }
        };
    }

    paired!(
        /// Two f16 lanes: `a * b + c`, each rounded once.
        fma_f16x2,
        "fma.rn.f16x2 {d}, {a}, {b}, {c};",
        (a, b, c)
    );
    paired!(
        /// Two bf16 lanes: `a * b + c`, each rounded once.
        fma_bf16x2,
        "fma.rn.bf16x2 {d}, {a}, {b}, {c};",
        (a, b, c)
    );
    paired!(
        /// Two f16 lanes: max, NaN propagating.
        max_nan_f16x2,
        "max.NaN.f16x2 {d}, {a}, {b};",
        (a, b)
    );
    paired!(
        /// Two bf16 lanes: max, NaN propagating.
        max_nan_bf16x2,
        "max.NaN.bf16x2 {d}, {a}, {b};",
        (a, b)
    );
}
