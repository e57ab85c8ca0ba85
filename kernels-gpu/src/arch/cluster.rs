//! Thread-block clusters (sm_90): the block's place in its cluster, the cluster barrier,
//! mbarriers, and mbarrier-counted stores into another block's shared memory (`mapa`,
//! `st.async`). The shared array where blocks exchange partials is in `shared`, with the
//! block's other static arrays.

#[cfg(feature = "cluster")]
use super::SharedAddr;
#[cfg(feature = "cluster")]
use core::arch::asm;

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
