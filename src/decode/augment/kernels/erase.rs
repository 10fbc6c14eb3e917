//! Erasing: torchvision's `erase(i, j, h, w, v)` on `uint8`, with `v` one
//! colour or per-pixel noise.
//!
//! The recipes erase after `Normalize`, with 0 (the dataset's mean) or
//! `N(0, 1)` noise per value. The server's output is `uint8` before the
//! client normalizes, so both are carried back through the normalization:
//! a normalized value `z` of channel `c` is the level
//! `floor((mean[c] + std[c] * z) * 255 + 0.5)`, clamped. The noise is a pure
//! function of the sample's draw (`noise`) and the value's position in the
//! box, so a client replays it without the server (Python:
//! `shardfeed._ops.erase_noise`).

use super::base::CHANNELS;
use crate::plan::rng::output_at;

/// What an erased box is filled with, in `uint8` levels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EraseFill {
    Colour([u8; 3]),
    /// `N(0, 1)` per value in normalized space, from the seed `noise`, through
    /// the stream's normalization.
    Noise {
        noise: u64,
        mean: [f32; 3],
        std: [f32; 3],
    },
}

/// Fills rows `top..top+height`, columns `left..left+width` of packed RGB
/// rows of `width_px`.
pub fn erase(
    pixels: &mut [u8],
    width_px: u32,
    (top, left, height, width): (u32, u32, u32, u32),
    fill: EraseFill,
) {
    let row = width_px as usize * CHANNELS;
    for y in 0..height as usize {
        let start = (top as usize + y) * row + left as usize * CHANNELS;
        let Some(line) = pixels.get_mut(start..start + width as usize * CHANNELS) else {
            return;
        };
        match fill {
            EraseFill::Colour(colour) => {
                for pixel in line.chunks_exact_mut(CHANNELS) {
                    pixel.copy_from_slice(&colour);
                }
            }
            EraseFill::Noise { noise, mean, std } => {
                for (x, pixel) in line.chunks_exact_mut(CHANNELS).enumerate() {
                    for (c, value) in pixel.iter_mut().enumerate() {
                        // torchvision's `v` is [C, h, w]: the index runs over
                        // channels first.
                        let index = (c * height as usize + y) * width as usize + x;
                        let z = standard_normal(noise, index as u64);
                        *value = noise_level(z, mean[c], std[c]);
                    }
                }
            }
        }
    }
}

/// The `uint8` level of a normalized value `z` of a channel with `mean`
/// and `std` (in [0, 1] units, as torchvision's `Normalize` takes them
/// after `ToDtype(float32, scale=True)`).
pub fn noise_level(z: f64, mean: f32, std: f32) -> u8 {
    // floor(x + 0.5): the same rounding in numpy, whichever way ties go.
    ((f64::from(mean) + f64::from(std) * z) * 255.0 + 0.5)
        .floor()
        .clamp(0.0, 255.0) as u8
}

/// The `index`-th standard normal of the seed: Box–Muller over two
/// outputs of the crate's generator (SplitMix64, `plan::rng`) at positions
/// `2 index` and `2 index + 1`, the cosine
/// branch. Stateless, so any value can be made alone (and in numpy).
fn standard_normal(seed: u64, index: u64) -> f64 {
    let at = |k: u64| output_at(seed, k);
    let unit = 1.0 / (1u64 << 53) as f64;
    // (0, 1]: the logarithm never sees 0.
    let u1 = ((at(2 * index) >> 11) + 1) as f64 * unit;
    let u2 = (at(2 * index + 1) >> 11) as f64 * unit;
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_box_is_filled_and_nothing_else() {
        let mut pixels = vec![7u8; 5 * 4 * 3];
        erase(&mut pixels, 5, (1, 2, 2, 3), EraseFill::Colour([1, 2, 3]));
        for y in 0..4 {
            for x in 0..5 {
                let at = (y * 5 + x) * 3;
                let inside = (1..3).contains(&y) && (2..5).contains(&x);
                let want = if inside { [1, 2, 3] } else { [7, 7, 7] };
                assert_eq!(pixels[at..at + 3], want, "({x}, {y})");
            }
        }
    }

    #[test]
    fn noise_is_standard_normal() {
        let n = 200_000u64;
        let draws: Vec<f64> = (0..n).map(|i| standard_normal(99, i)).collect();
        let mean = draws.iter().sum::<f64>() / n as f64;
        let var = draws.iter().map(|z| (z - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "{mean}");
        assert!((var - 1.0).abs() < 0.02, "{var}");
        let within_one = draws.iter().filter(|z| z.abs() < 1.0).count() as f64 / n as f64;
        assert!((within_one - 0.6827).abs() < 0.005, "{within_one}");
    }
}
