//! Device facts the row planner's enumerator works from where no driver answers: the
//! per-SM limits of each compute capability, and offline [`DeviceInfo`] profiles of GPUs.
//! Both are the vendors' published figures (NVIDIA's CUDA C++ Programming Guide, "Technical
//! Specifications per Compute Capability", and each GPU's data sheet); a figure a live
//! driver reports instead is named where it is used. Facts only: nothing here prefers a
//! plan.
#![cfg_attr(not(test), allow(dead_code))] // Only tests read the profiles.

use super::dispatch::{RESERVED_SHARED_BYTES, SHARED_ALLOCATION_BYTES};
use crate::DeviceInfo;

/// What an SM of one compute capability holds and what one launch may ask of it: the
/// limits an occupancy calculation needs beyond [`DeviceInfo`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchLimits {
    pub compute_capability: (u32, u32),
    /// 32-bit registers of an SM's register file.
    pub registers_per_multiprocessor: u32,
    /// The most registers one block's threads may take together.
    pub registers_per_block: u32,
    pub max_registers_per_thread: u32,
    /// Registers go to a warp in units of this many (a thread's count times 32, rounded up).
    pub register_allocation_unit: u32,
    /// The SM's sub-partitions, each with its share of the register file; a warp's registers
    /// come from one, and a block's launch check rounds its warps up to a multiple of them.
    pub register_sub_partitions: u32,
    pub max_blocks_per_multiprocessor: u32,
    pub max_threads_per_multiprocessor: u32,
    pub max_threads_per_block: u32,
    /// Shared memory of one SM at the largest carveout.
    pub max_shared_bytes_per_multiprocessor: u32,
    /// Shared memory one block may take (static and dynamic) once its kernel opts in.
    pub max_shared_bytes_per_block_optin: u32,
    /// Shared memory the driver keeps for itself in every resident block, beside its own.
    pub reserved_shared_bytes_per_block: u32,
    /// A block's shared memory (its own and the reserved) is allotted in units of this many
    /// bytes.
    pub shared_allocation_unit: u32,
    /// Blocks a cluster may have once its kernel allows non-portable sizes.
    pub max_cluster_blocks: u32,
}

/// sm_80 (A100): the register file and launch limits every capability below shares.
const SM_80: ArchLimits = ArchLimits {
    compute_capability: (8, 0),
    registers_per_multiprocessor: 65536,
    registers_per_block: 65536,
    max_registers_per_thread: 255,
    register_allocation_unit: 256,
    register_sub_partitions: 4,
    max_blocks_per_multiprocessor: 32,
    max_threads_per_multiprocessor: 2048,
    max_threads_per_block: 1024,
    max_shared_bytes_per_multiprocessor: 164 * 1024,
    max_shared_bytes_per_block_optin: 163 * 1024,
    reserved_shared_bytes_per_block: RESERVED_SHARED_BYTES,
    shared_allocation_unit: SHARED_ALLOCATION_BYTES,
    max_cluster_blocks: 0,
};

/// sm_86 (GA10x): 1536 threads, 16 blocks and 100 KB of shared memory an SM.
const SM_86: ArchLimits = ArchLimits {
    compute_capability: (8, 6),
    max_blocks_per_multiprocessor: 16,
    max_threads_per_multiprocessor: 1536,
    max_shared_bytes_per_multiprocessor: 100 * 1024,
    max_shared_bytes_per_block_optin: 99 * 1024,
    ..SM_80
};

/// sm_89 (Ada: L40S, RTX 4090): sm_86 with 24 blocks an SM.
const SM_89: ArchLimits = ArchLimits { compute_capability: (8, 9), max_blocks_per_multiprocessor: 24, ..SM_86 };

/// sm_90 (Hopper): 228 KB of shared memory an SM, and thread-block clusters of up to 8
/// blocks, 16 where the kernel allows non-portable sizes.
const SM_90: ArchLimits = ArchLimits {
    compute_capability: (9, 0),
    max_shared_bytes_per_multiprocessor: 228 * 1024,
    max_shared_bytes_per_block_optin: 227 * 1024,
    max_cluster_blocks: 16,
    ..SM_80
};

/// sm_100 (B200): sm_90's limits.
const SM_100: ArchLimits = ArchLimits { compute_capability: (10, 0), ..SM_90 };

/// The limits of compute capability `cc`; `None` for one this table does not list (sm_120,
/// whose figures are not stated here, and anything older than sm_80, where the driver
/// reserves no shared memory a block).
pub const fn arch_limits(cc: (u32, u32)) -> Option<ArchLimits> {
    match cc {
        (8, 0) => Some(SM_80),
        (8, 6) => Some(SM_86),
        (8, 9) => Some(SM_89),
        (9, 0) => Some(SM_90),
        (10, 0) => Some(SM_100),
        _ => None,
    }
}

/// A GPU that is not here, named as its driver names it: its product facts
/// (`multiprocessors`, L2, the DRAM's peak bandwidth) and its capability's per-SM limits, as
/// a driver would report them. No driver stands behind it (`driver_api` 0.0).
fn profile(
    name: &str,
    arch: ArchLimits,
    multiprocessors: u32,
    l2_bytes: u32,
    dram_bytes_per_second: u64,
) -> DeviceInfo {
    DeviceInfo {
        name: name.into(),
        ordinal: 0,
        compute_capability: arch.compute_capability,
        multiprocessors,
        max_threads_per_multiprocessor: arch.max_threads_per_multiprocessor,
        max_shared_bytes_per_block_optin: arch.max_shared_bytes_per_block_optin,
        max_shared_bytes_per_multiprocessor: arch.max_shared_bytes_per_multiprocessor,
        l2_bytes,
        dram_bytes_per_second,
        driver_api: (0, 0),
    }
}

/// Bytes in a (binary) megabyte, as L2 sizes are given.
const MB: u32 = 1 << 20;

/// The H100 SXM5 80 GB: 132 SMs, 50 MB of L2, HBM3 at 3.35 TB/s.
pub fn h100_sxm() -> DeviceInfo {
    profile("NVIDIA H100 80GB HBM3", SM_90, 132, 50 * MB, 3_350_000_000_000)
}

/// The H200 SXM 141 GB: the H100's 132 SMs, HBM3e at 4.8 TB/s. Its L2 is the 50 MB its
/// driver reports (the data sheet gives none; the GH100 die has 60 MB, not all enabled).
pub fn h200() -> DeviceInfo {
    profile("NVIDIA H200", SM_90, 132, 50 * MB, 4_800_000_000_000)
}

/// The A100 SXM4 80 GB: 108 SMs, 40 MB of L2, HBM2e at 2.039 TB/s.
pub fn a100_80gb_sxm() -> DeviceInfo {
    profile("NVIDIA A100-SXM4-80GB", SM_80, 108, 40 * MB, 2_039_000_000_000)
}

/// The L40S: 142 SMs, 96 MB of L2, GDDR6 at 864 GB/s.
pub fn l40s() -> DeviceInfo {
    profile("NVIDIA L40S", SM_89, 142, 96 * MB, 864_000_000_000)
}

/// The GeForce RTX 4090: 128 SMs, 72 MB of L2, GDDR6X at 1008 GB/s.
pub fn rtx_4090() -> DeviceInfo {
    profile("NVIDIA GeForce RTX 4090", SM_89, 128, 72 * MB, 1_008_000_000_000)
}

/// Every offline profile.
pub fn all() -> [DeviceInfo; 5] {
    [h100_sxm(), h200(), a100_80gb_sxm(), l40s(), rtx_4090()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_carry_their_capabilitys_limits() {
        for device in all() {
            let arch = arch_limits(device.compute_capability).unwrap();
            assert_eq!(device.max_threads_per_multiprocessor, arch.max_threads_per_multiprocessor, "{}", device.name);
            assert!(arch.max_shared_bytes_per_block_optin < arch.max_shared_bytes_per_multiprocessor);
            // The opt-in limit is the SM's shared memory less what the driver keeps a block.
            let unreserved = arch.max_shared_bytes_per_multiprocessor - arch.reserved_shared_bytes_per_block;
            assert_eq!(arch.max_shared_bytes_per_block_optin, unreserved, "{}", device.name);
        }
        // The figures the planner's own tests take for the H100.
        let (h100, tested) = (h100_sxm(), crate::launch::tests::h100());
        assert_eq!(
            (h100.multiprocessors, h100.max_shared_bytes_per_block_optin, h100.max_shared_bytes_per_multiprocessor),
            (
                tested.multiprocessors,
                tested.max_shared_bytes_per_block_optin,
                tested.max_shared_bytes_per_multiprocessor
            )
        );
        assert_eq!(arch_limits((12, 0)), None);
    }
}
