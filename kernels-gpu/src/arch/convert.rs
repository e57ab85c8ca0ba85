//! Float conversions that `as` cannot express: f32 to bf16, which core has no type for.
//! The host version rounds the same way in software, so CPU tests see the device's values.

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
