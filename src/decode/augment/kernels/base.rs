//! What every kernel is built on: the macro that compiles a kernel twice
//! (baseline and AVX2), the switch between the two builds, and the rounding
//! steps without library calls. The kernel files import this one and never
//! their parent, so the parent only declares and re-exports them.

use std::sync::atomic::{AtomicBool, Ordering};

/// Bytes per pixel of the packed RGB rows every kernel works on.
pub(super) const CHANNELS: usize = 3;

/// Defines a kernel once and compiles it twice: for the build's baseline
/// and, on x86-64, with AVX2 (chosen at run time where the CPU has it).
/// Both are the same source, so the same float32 operations in the same
/// order (no FMA is enabled: a fused multiply-add would round differently
/// from torchvision); AVX2 only widens what the compiler vectorizes.
macro_rules! simd_kernel {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) {
            #[inline(always)]
            fn portable($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($arg: $ty),*) {
                    portable($($arg),*)
                }
                if $crate::decode::augment::kernels::base::simd_enabled()
                    && std::arch::is_x86_feature_detected!("avx2")
                {
                    // SAFETY: the CPU has AVX2, checked just above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            portable($($arg),*)
        }
    };
}

static SIMD: AtomicBool = AtomicBool::new(true);

/// Whether kernels take their AVX2 build where the CPU has it (on unless a
/// benchmark turned it off to measure the baseline build).
pub fn simd_enabled() -> bool {
    SIMD.load(Ordering::Relaxed)
}

/// Turns the kernels' AVX2 builds off (or back on): for benchmarks that
/// compare them with the baseline build. The pixels are the same either way.
pub fn set_simd(enabled: bool) {
    SIMD.store(enabled, Ordering::Relaxed);
}

/// `x.round_ties_even()` for `|x| < 2^22` without a library call (the
/// baseline x86-64 target has no rounding instruction, and `roundevenf`
/// cost more than the rest of a geometric op): adding and removing 1.5 ×
/// 2^23 leaves the nearest integer, ties to even, in the default rounding
/// mode.
#[inline(always)]
pub(super) fn round_even(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

/// A float level to `uint8`: truncated toward zero after `clamp_(0, 255)`,
/// as torchvision's `.to(uint8)` does (the caller rounds first where
/// torchvision does).
#[inline(always)]
#[allow(clippy::manual_clamp)] // `clamp` keeps a NaN, which the cast must not see
pub(super) fn clamp_cast(value: f32) -> u8 {
    // `max` then `min` take the number over a NaN (a factor from a
    // hostile wire), so the value is always in range: the unchecked cast
    // is a plain truncation the compiler vectorizes, where `as u8`'s
    // saturation kept these loops scalar.
    let clamped = value.max(0.0).min(255.0);
    // SAFETY: `clamped` is finite and within 0..=255.
    unsafe { clamped.to_int_unchecked::<i32>() as u8 }
}

/// `x.floor()` for every finite `x` without a library call (NaN gives 0).
#[inline(always)]
#[allow(clippy::manual_clamp)] // `clamp` keeps a NaN, which the cast must not see
pub(super) fn floor(x: f32) -> f32 {
    // Past 2^23 every float is whole. Clamped into that range first, the
    // value takes the plain truncation the compiler vectorizes: `as i32`'s
    // saturation is a compare and branch per lane, which kept the hue's
    // blocks scalar.
    const WHOLE_PAST: f32 = 8_388_608.0;
    let bounded = x.max(-WHOLE_PAST).min(WHOLE_PAST);
    // SAFETY: `bounded` is finite and within ±2^23.
    let truncated = unsafe { bounded.to_int_unchecked::<i32>() } as f32;
    let floored = if truncated > x {
        truncated - 1.0
    } else {
        truncated
    };
    if x.abs() < WHOLE_PAST {
        floored
    } else if x.is_nan() {
        0.0
    } else {
        x
    }
}

/// `x.floor()` in double without a library call; exact for |x| < 2^63
/// (pixel coordinates and levels many times over).
#[inline(always)]
pub(super) fn floor_f64(x: f64) -> f64 {
    let truncated = x as i64 as f64;
    if truncated > x {
        truncated - 1.0
    } else {
        truncated
    }
}
