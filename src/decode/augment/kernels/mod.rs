//! The pixel kernels the ops after the crop run on a finished output
//! (packed RGB rows, `uint8`), apart from the op rows that decide when and
//! with what they run (`../ops/`).
//!
//! Each kernel reproduces torchvision's tensor kernel on `uint8`
//! (`torchvision.transforms.v2.functional`), where it truncates, where it
//! rounds and in which precision (float32), so that a sample the server
//! augmented and the same decision replayed with torchvision agree to the
//! level (docs/AUGMENTATION.md has the measured agreement per op).
//!
//! Speed without changing a byte: plain loops the compiler vectorizes,
//! each built twice by `simd_kernel!` (baseline and AVX2, picked at run
//! time); per-value formulas evaluated once per level into a table; the
//! geometric samplers eight pixels at a time in `affine.rs`'s `x86` module,
//! lane by lane the scalar steps. A test holds every AVX2 build to its
//! baseline's bytes. None allocates more than one output-sized copy.

#[macro_use]
mod base;
mod affine;
mod blur;
mod colour;
mod erase;
pub mod pil;

pub use affine::{affine, affine_with, rotate, vertical_flip, Affine, Interpolation, Sampling};
pub use base::set_simd;
pub use blur::{gaussian_blur, MAX_BLUR_KERNEL};
pub use colour::{
    adjust_brightness, adjust_contrast, adjust_hue, adjust_saturation, adjust_sharpness,
    autocontrast, equalize, grayscale, invert, permute_channels, posterize, solarize,
};
pub use erase::{erase, noise_level, EraseFill};
pub use pil::PilResample;

#[cfg(test)]
mod tests {
    use super::base::{floor, round_even};

    #[test]
    fn the_rounding_shortcuts_equal_the_library_calls() {
        let mut x = -3000.0f32;
        while x < 3000.0 {
            for v in [x, x + 0.5, x - 0.5, x + 1e-3, -x - 0.25] {
                assert_eq!(round_even(v), v.round_ties_even(), "{v}");
                assert_eq!(floor(v), v.floor(), "{v}");
            }
            x += 0.37;
        }
        for v in [
            8_388_607.5f32,
            8_388_608.0,
            -8_388_609.0,
            3e9,
            -3e9,
            f32::MAX,
            f32::MIN,
        ] {
            assert_eq!(floor(v), v.floor(), "{v}");
        }
        for v in [f32::INFINITY, f32::NEG_INFINITY] {
            assert_eq!(floor(v), v);
        }
        assert_eq!(floor(f32::NAN), 0.0);
    }
}

#[cfg(test)]
mod simd_tests {
    use super::*;

    /// Every kernel gives the same bytes in its AVX2 build as in the
    /// baseline one (where the CPU has AVX2; elsewhere both are baseline).
    #[test]
    fn the_avx2_build_gives_the_baseline_bytes() {
        let (width, height) = (61u32, 47usize);
        let source: Vec<u8> = (0..width as usize * height * 3)
            .map(|i| (crate::hash::fmix64(i as u64) % 256) as u8)
            .collect();
        let sampling = |interpolation| Sampling {
            interpolation,
            fill: Some([9, 8, 7]),
        };
        type Kernel<'a> = Box<dyn Fn(&mut [u8]) + 'a>;
        let runs: Vec<Kernel<'_>> = vec![
            Box::new(|p| adjust_brightness(p, 1.3)),
            Box::new(|p| adjust_saturation(p, 0.4)),
            Box::new(|p| adjust_contrast(p, 1.7)),
            Box::new(|p| adjust_sharpness(p, width, 1.9)),
            Box::new(|p| adjust_hue(p, -0.3)),
            Box::new(grayscale),
            Box::new(autocontrast),
            Box::new(equalize),
            Box::new(|p| solarize(p, 100.5)),
            Box::new(move |p| gaussian_blur(p, width, (9, 5), 1.3)),
            Box::new(move |p| rotate(p, width, 33.0, sampling(Interpolation::Bilinear))),
            Box::new(move |p| {
                affine(
                    p,
                    width,
                    0.0,
                    [0.0, 0.0],
                    [17.0, 0.0],
                    Some([0.0, 0.0]),
                    sampling(Interpolation::Nearest),
                )
            }),
            // PIL's bicubic (timm's ops): a rotation, a shear (one row a
            // pixel) and a shift along y (one column a pixel).
            Box::new(move |p| {
                let matrix = pil::rotate_matrix(-23.7, width, height as u32).unwrap();
                pil::affine(p, width, matrix, PilResample::Bicubic, [1, 2, 3])
            }),
            Box::new(move |p| {
                let shear = [1.0, 0.27, 0.0, 0.0, 1.0, 0.0];
                pil::affine(p, width, shear, PilResample::Bicubic, [1, 2, 3])
            }),
            Box::new(move |p| {
                let shift = [1.0, 0.0, 0.0, 0.0, 1.0, -13.3];
                pil::affine(p, width, shift, PilResample::Bicubic, [1, 2, 3])
            }),
        ];
        for (index, run) in runs.iter().enumerate() {
            let mut outputs = Vec::new();
            for simd in [true, false] {
                set_simd(simd);
                let mut pixels = source.clone();
                run(&mut pixels);
                outputs.push(pixels);
            }
            set_simd(true);
            assert_eq!(outputs[0], outputs[1], "kernel {index}");
        }
    }
}
