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

/// Signed byte `lane` (0 to 3) of a word as f32, exactly, given the word with every byte's
/// sign bit flipped (`word ^ 0x8080_8080`, shared by its four lanes): the byte, now
/// `q + 128`, becomes the low bits of the f32 `2^23 + q + 128` beside that number's
/// exponent byte, then `2^23 + 128` is subtracted. Device: one `prmt` (bytes: the lane's,
/// two zeros, 0x4b) and one `sub.f32`; no conversion instruction.
#[inline(always)]
pub fn i8_lane_to_f32(flipped: u32, lane: usize) -> f32 {
    const TWO_POW_23: u32 = 0x4b00_0000;
    let bits: u32;
    #[cfg(target_arch = "nvptx64")]
    {
        // Bytes 0-3 are `flipped`'s, 4-7 `TWO_POW_23`'s: the lane's, byte 4 (0) twice, byte 7.
        let selector = 0x7440 | lane as u32;
        // SAFETY: a pure register-to-register instruction.
        unsafe {
            core::arch::asm!("prmt.b32 {d}, {a}, {b}, {s};", d = out(reg32) bits, a = in(reg32) flipped,
                b = in(reg32) TWO_POW_23, s = in(reg32) selector, options(pure, nomem, nostack));
        }
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        bits = TWO_POW_23 | ((flipped >> (8 * lane)) & 0xff);
    }
    f32::from_bits(bits) - (8_388_608.0 + 128.0)
}

#[cfg(test)]
mod tests {
    use super::i8_lane_to_f32;

    #[test]
    fn every_byte_of_a_word_converts_exactly() {
        for q in i8::MIN..=i8::MAX {
            let word = u32::from_le_bytes([0, q as u8, 0x7f, q as u8]);
            assert_eq!(i8_lane_to_f32(word ^ 0x8080_8080, 1), q as f32);
            assert_eq!(i8_lane_to_f32(word ^ 0x8080_8080, 3), q as f32);
            assert_eq!(i8_lane_to_f32(word ^ 0x8080_8080, 2), 127.0);
        }
    }
}
