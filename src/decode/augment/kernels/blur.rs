//! `gaussian_blur(kernel_size, sigma)` on `uint8` as torchvision v2's
//! tensor kernel computes it: the 1-D kernel is the softmax of
//! `-(x / sigma)^2` over `x = linspace(-lim, lim, k)` with
//! `lim = (k - 1) / (2 sqrt 2)` (a Gaussian of `sigma` in pixels), in
//! float32; the image is reflect-padded by `k / 2` (no edge repeated), each
//! channel convolved with the outer product of the two kernels in float32,
//! then rounded half to even.
//!
//! The 2-D kernel is an outer product, so the convolution is done as two
//! 1-D passes (rows, then columns) through a float32 copy: the same sums
//! in another order, which moves a value by float32 rounding only (a
//! level at a tie, rarely; the measured agreement is in
//! docs/AUGMENTATION.md).

use std::cell::RefCell;

use super::base::{clamp_cast, round_even, CHANNELS};

/// The largest kernel side a request may name: a blur reads `k` values per
/// output value in each pass, so this bounds a sample's time.
pub const MAX_BLUR_KERNEL: u32 = 127;

/// torchvision's `_get_gaussian_kernel1d` in float32, written into
/// `kernel` (a buffer reused sample after sample: no allocation once it
/// has grown).
pub fn gaussian_kernel_into(kernel: &mut Vec<f32>, size: usize, sigma: f32) {
    let lim = (size as f64 - 1.0) / (2.0 * std::f64::consts::SQRT_2);
    let (start, end) = (-lim as f32, lim as f32);
    let steps = size.max(1);
    let step = if steps > 1 {
        (end - start) / (steps - 1) as f32
    } else {
        0.0
    };
    // torch's linspace fills the first half from the start and the
    // second from the end, so the kernel is symmetric to the bit.
    let halfway = steps / 2;
    kernel.clear();
    kernel.extend((0..steps).map(|i| {
        let x = if i < halfway {
            start + step * i as f32
        } else {
            end - step * (steps - 1 - i) as f32
        };
        let scaled = x / sigma;
        -(scaled * scaled)
    }));
    // The softmax: exp(e - max), over its sum.
    let peak = kernel.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    kernel.iter_mut().for_each(|e| *e = (*e - peak).exp());
    let total: f32 = kernel.iter().sum();
    kernel.iter_mut().for_each(|w| *w /= total);
}

/// [`gaussian_kernel_into`] into a new vector.
#[cfg(test)]
pub fn gaussian_kernel(size: usize, sigma: f32) -> Vec<f32> {
    let mut kernel = Vec::with_capacity(size);
    gaussian_kernel_into(&mut kernel, size, sigma);
    kernel
}

/// The index `i` of a row or column of `n` read through reflect padding
/// (`-1` is `1`, `n` is `n - 2`; periodic past one reflection, so any
/// offset maps inside).
fn reflect(i: isize, n: usize) -> usize {
    if n == 1 {
        return 0;
    }
    let period = 2 * (n as isize - 1);
    let folded = i.rem_euclid(period);
    if folded < n as isize {
        folded as usize
    } else {
        (period - folded) as usize
    }
}

/// What the taps a blur leaves out may add to a value, at most, in levels:
/// half a float32 ulp of 255 (2^-17), below what the float32 sums
/// themselves round away. A Gaussian of a small sigma in a wide kernel
/// (SimCLR's 23 pixels, sigma from 0.1) puts weights of 1e-20 on its outer
/// taps: summing them changes no value, and costs most of the time.
const DROPPED_TAPS_LEVELS: f64 = 1.0 / 131_072.0;

/// The largest level a tap multiplies.
const LARGEST_LEVEL: f64 = 255.0;

/// The half of a symmetric `kernel` the passes read, written into `half`:
/// the centre weight, then each pair's weight outward, up to the radius
/// past which every remaining pair's weights together move a value by at
/// most [`DROPPED_TAPS_LEVELS`] (each pass leaves out at most that much).
fn half_kernel_into(half: &mut Vec<f32>, kernel: &[f32]) {
    let centre = kernel.len() / 2;
    let mut radius = centre;
    let mut dropped = 0.0f64;
    while radius > 0 {
        let pair = 2.0 * f64::from(kernel[centre + radius]);
        if (dropped + pair) * LARGEST_LEVEL > DROPPED_TAPS_LEVELS {
            break;
        }
        dropped += pair;
        radius -= 1;
    }
    half.clear();
    half.extend_from_slice(&kernel[centre..=centre + radius]);
}

/// What a blur works in, per decode thread, reused: the row pass's
/// float32 output, one padded source row, the kernels and their halves,
/// where each pair of taps reads.
#[derive(Default)]
struct Scratch {
    rows: Vec<f32>,
    line: Vec<f32>,
    kx: Vec<f32>,
    ky: Vec<f32>,
    half_x: Vec<f32>,
    half_y: Vec<f32>,
    pairs: Vec<(usize, usize)>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Blurs one `width`-wide packed RGB output in place with a
/// `kernel_x x kernel_y` Gaussian of `sigma` (both odd sides).
pub fn gaussian_blur(pixels: &mut [u8], width: u32, (kernel_x, kernel_y): (u32, u32), sigma: f32) {
    let w = width as usize;
    if w == 0 || pixels.is_empty() {
        return;
    }
    SCRATCH.with(|scratch| {
        let Scratch {
            rows,
            line,
            kx,
            ky,
            half_x,
            half_y,
            pairs,
        } = &mut *scratch.borrow_mut();
        gaussian_kernel_into(kx, kernel_x as usize, sigma);
        gaussian_kernel_into(ky, kernel_y as usize, sigma);
        half_kernel_into(half_x, kx);
        half_kernel_into(half_y, ky);
        blur_passes(pixels, w, half_x, half_y, rows, line, pairs);
    });
}

/// Output values a pass sums at once, in registers: each pair's weight is
/// multiplied into a block of this many and added to their running sums,
/// which are stored once after the centre tap.
const BLOCK: usize = 16;

/// `out[j]`: the symmetric taps around `source[centre + j]`, each pair
/// `(left, right)` of `pairs` the offsets of a tap and its mirror, of
/// weight `half[1 + i]`. Summed outward in, the pair's two values added
/// before their shared weight multiplies them, the centre last: the
/// smallest terms first, and half the products of a tap at a time.
#[inline(always)]
fn symmetric_sum(
    out: &mut [f32],
    source: &[f32],
    centre: usize,
    pairs: &[(usize, usize)],
    half: &[f32],
) {
    let len = out.len();
    let blocks = len / BLOCK * BLOCK;
    let block_at = |offset: usize, start: usize| -> &[f32; BLOCK] {
        source[offset + start..offset + start + BLOCK]
            .try_into()
            .expect("a block of the row")
    };
    for start in (0..blocks).step_by(BLOCK) {
        let mut sums = [0.0f32; BLOCK];
        for (&(left, right), &weight) in pairs.iter().zip(&half[1..]).rev() {
            let (lefts, rights) = (block_at(left, start), block_at(right, start));
            for ((sum, &l), &r) in sums.iter_mut().zip(lefts).zip(rights) {
                *sum += weight * (l + r);
            }
        }
        for (sum, &value) in sums.iter_mut().zip(block_at(centre, start)) {
            *sum += half[0] * value;
        }
        out[start..start + BLOCK].copy_from_slice(&sums);
    }
    for at in blocks..len {
        let mut sum = 0.0f32;
        for (&(left, right), &weight) in pairs.iter().zip(&half[1..]).rev() {
            sum += weight * (source[left + at] + source[right + at]);
        }
        out[at] = sum + half[0] * source[centre + at];
    }
}

simd_kernel! {
/// The two passes, rows then columns, each output's taps summed in
/// registers a block at a time ([`symmetric_sum`]).
fn blur_passes(
    pixels: &mut [u8],
    w: usize,
    half_x: &[f32],
    half_y: &[f32],
    rows: &mut Vec<f32>,
    line: &mut Vec<f32>,
    pairs: &mut Vec<(usize, usize)>,
) {
    let stride = w * CHANNELS;
    let h = pixels.len() / stride;
    let (rx, ry) = (half_x.len() - 1, half_y.len() - 1);
    rows.clear();
    rows.resize(pixels.len(), 0.0);
    line.clear();
    line.resize((w + 2 * rx) * CHANNELS + stride, 0.0);
    let pad = rx * CHANNELS;
    let (padded, column) = line.split_at_mut((w + 2 * rx) * CHANNELS);
    // Along a padded row, a tap `i` pixels left of the centre reads `i`
    // pixels before it: the same offsets for every row.
    pairs.clear();
    pairs.extend((1..=rx).map(|i| (pad - i * CHANNELS, pad + i * CHANNELS)));
    for y in 0..h {
        let source = &pixels[y * stride..(y + 1) * stride];
        // The row itself as one conversion the compiler vectorizes; only
        // the padding's few pixels go through the reflection (a division
        // per pixel cost more than the taps).
        for (value, &level) in padded[pad..pad + stride].iter_mut().zip(source) {
            *value = f32::from(level);
        }
        let padding = (0..rx).chain(w + rx..w + 2 * rx);
        for at in padding {
            let x = reflect(at as isize - rx as isize, w);
            let at = at * CHANNELS;
            for c in 0..CHANNELS {
                padded[at + c] = f32::from(source[x * CHANNELS + c]);
            }
        }
        symmetric_sum(&mut rows[y * stride..(y + 1) * stride], padded, pad, pairs, half_x);
    }
    let rows: &[f32] = rows;
    for y in 0..h {
        let row_at = |offset: isize| reflect(y as isize + offset, h) * stride;
        pairs.clear();
        pairs.extend((1..=ry as isize).map(|i| (row_at(-i), row_at(i))));
        symmetric_sum(column, rows, y * stride, pairs, half_y);
        for (out, &value) in pixels[y * stride..(y + 1) * stride].iter_mut().zip(column.iter()) {
            // Rounded half to even, then clamped and cast as a whole number.
            *out = clamp_cast(round_even(value));
        }
    }
}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The direct 2-D convolution in float64: the reference the passes
    /// are held to.
    fn direct(pixels: &[u8], width: usize, k: usize, sigma: f32) -> Vec<u8> {
        let kernel: Vec<f64> = gaussian_kernel(k, sigma)
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        let h = pixels.len() / (3 * width);
        let r = (k / 2) as isize;
        let mut out = vec![0u8; pixels.len()];
        for y in 0..h {
            for x in 0..width {
                for c in 0..3 {
                    let mut sum = 0.0;
                    for (i, wy) in kernel.iter().enumerate() {
                        for (j, wx) in kernel.iter().enumerate() {
                            let sy = reflect(y as isize + i as isize - r, h);
                            let sx = reflect(x as isize + j as isize - r, width);
                            sum += wy * wx * f64::from(pixels[(sy * width + sx) * 3 + c]);
                        }
                    }
                    out[(y * width + x) * 3 + c] = sum.round_ties_even().clamp(0.0, 255.0) as u8;
                }
            }
        }
        out
    }

    #[test]
    fn the_kernel_is_torchvisions_gaussian() {
        let kernel = gaussian_kernel(9, 1.5);
        assert!((kernel.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        // Symmetric to the bit, and exp(-d^2 / (2 sigma^2)) between taps.
        for i in 0..4 {
            assert_eq!(kernel[i], kernel[8 - i]);
        }
        let ratio = kernel[4] / kernel[5];
        assert!(
            (ratio - (1.0f32 / (2.0 * 1.5 * 1.5)).exp()).abs() < 1e-5,
            "{ratio}"
        );
        assert_eq!(gaussian_kernel(1, 0.7), vec![1.0]);
    }

    #[test]
    fn reflection_repeats_no_edge() {
        let rows: Vec<usize> = (-3..8).map(|i| reflect(i, 5)).collect();
        assert_eq!(rows, [3, 2, 1, 0, 1, 2, 3, 4, 3, 2, 1]);
        assert_eq!(reflect(-40, 3), reflect(0, 3));
        assert_eq!(reflect(7, 1), 0);
    }

    /// The passes' arithmetic one whole row at a time, pair by pair (no
    /// blocks): the blocked passes must give the same bits.
    fn pair_by_pair(pixels: &mut [u8], w: usize, half_x: &[f32], half_y: &[f32]) {
        let stride = w * 3;
        let h = pixels.len() / stride;
        let mut rows = vec![0.0f32; pixels.len()];
        let at =
            |y: usize, x: isize, c: usize| f32::from(pixels[y * stride + reflect(x, w) * 3 + c]);
        for y in 0..h {
            for x in 0..w as isize {
                for c in 0..3 {
                    let mut sum = 0.0f32;
                    for i in (1..half_x.len()).rev() {
                        let i_ = i as isize;
                        sum += half_x[i] * (at(y, x - i_, c) + at(y, x + i_, c));
                    }
                    rows[y * stride + x as usize * 3 + c] = sum + half_x[0] * at(y, x, c);
                }
            }
        }
        for y in 0..h as isize {
            let row = |offset: isize| reflect(y + offset, h) * stride;
            for j in 0..stride {
                let mut sum = 0.0f32;
                for i in (1..half_y.len()).rev() {
                    let i_ = i as isize;
                    sum += half_y[i] * (rows[row(-i_) + j] + rows[row(i_) + j]);
                }
                let value = sum + half_y[0] * rows[row(0) + j];
                pixels[y as usize * stride + j] = clamp_cast(round_even(value));
            }
        }
    }

    fn half_kernel(size: usize, sigma: f32) -> Vec<f32> {
        let mut half = Vec::new();
        half_kernel_into(&mut half, &gaussian_kernel(size, sigma));
        half
    }

    #[test]
    fn blocked_passes_give_the_bits_of_pair_by_pair() {
        for (width, height) in [(224usize, 224usize), (96, 96), (37, 23), (5, 1), (1, 7)] {
            let pixels: Vec<u8> = (0..width * height * 3)
                .map(|i| (crate::hash::fmix64(i as u64 * 7 + 3) % 256) as u8)
                .collect();
            for (k, sigma) in [
                (9u32, 0.1f32),
                (9, 1.7),
                (23, 2.0),
                (23, 0.9),
                (3, 0.8),
                (1, 0.5),
            ] {
                let mut blocked = pixels.clone();
                gaussian_blur(&mut blocked, width as u32, (k, k), sigma);
                let mut reference = pixels.clone();
                let half = half_kernel(k as usize, sigma);
                pair_by_pair(&mut reference, width, &half, &half);
                assert!(
                    blocked == reference,
                    "{width}x{height}, k {k}, sigma {sigma}"
                );
            }
        }
    }

    #[test]
    fn only_taps_that_cannot_move_a_value_are_left_out() {
        for k in [3usize, 9, 23, 127] {
            for step in 1..=60 {
                let sigma = step as f32 * 0.05;
                let kernel = gaussian_kernel(k, sigma);
                let half = half_kernel(k, sigma);
                let (centre, radius) = (k / 2, half.len() - 1);
                assert_eq!(half[..], kernel[centre..=centre + radius]);
                let dropped: f64 = kernel[centre + radius + 1..]
                    .iter()
                    .map(|&w| 2.0 * f64::from(w))
                    .sum();
                assert!(
                    dropped * LARGEST_LEVEL <= DROPPED_TAPS_LEVELS,
                    "k {k} sigma {sigma}"
                );
                if radius > 0 {
                    // The innermost kept pair would have passed the bound.
                    let kept = 2.0 * f64::from(kernel[centre + radius]);
                    assert!((dropped + kept) * LARGEST_LEVEL > DROPPED_TAPS_LEVELS);
                }
            }
        }
        // SimCLR's kernel: nearly whole at sigma 2, a third of it at 0.6,
        // the centre alone at 0.1.
        assert_eq!(half_kernel(23, 2.0).len(), 12);
        assert!(half_kernel(23, 0.6).len() <= 5);
        assert_eq!(half_kernel(23, 0.1).len(), 1);
    }

    #[test]
    fn the_two_passes_equal_the_direct_convolution() {
        let (width, height) = (37usize, 23usize);
        let pixels: Vec<u8> = (0..width * height * 3)
            .map(|i| (crate::hash::fmix64(i as u64 / 5) % 256) as u8)
            .collect();
        for (k, sigma) in [
            (9, 0.1f32),
            (9, 2.0),
            (3, 0.8),
            (23, 5.0),
            (23, 2.0),
            (23, 0.7),
            (9, 0.45),
        ] {
            let mut blurred = pixels.clone();
            gaussian_blur(&mut blurred, width as u32, (k, k), sigma);
            let reference = direct(&pixels, width, k as usize, sigma);
            let off = blurred
                .iter()
                .zip(&reference)
                .filter(|(a, b)| a != b)
                .count();
            let worst = blurred
                .iter()
                .zip(&reference)
                .map(|(&a, &b)| (i16::from(a) - i16::from(b)).abs())
                .max()
                .unwrap();
            assert!(
                worst <= 1 && off * 1000 <= blurred.len(),
                "k {k}: {off} off, worst {worst}"
            );
        }
    }
}
