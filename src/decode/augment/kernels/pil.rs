//! PIL's kernels as timm's RandAugment runs them (`timm.data.auto_augment`
//! calls `ImageEnhance`, `ImageOps` and `Image.transform` on an RGB
//! image), on the same packed RGB rows as the torchvision kernels.
//!
//! Each reproduces Pillow's C code where it rounds and in which precision:
//! `Image.blend` in float32 with a truncating cast, the 3x3 smoothing
//! filter in float32 with a half added before truncating, the luma in
//! 16.16 fixed point, the affine samplers in double with PIL's own cubic
//! (the a = -1 spline, not the resize's a = -0.5) and edge replication
//! inside the image, the fill colour outside it. The golden vectors replay
//! each with timm's own op functions on PIL images (docs/AUGMENTATION.md
//! has the agreement).

use super::base::{floor_f64, CHANNELS};
use super::colour::through_table;

/// How timm's geometric ops sample (PIL's `resample`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PilResample {
    #[default]
    Bilinear,
    Bicubic,
}

/// `Image.blend(degenerate, image, alpha)` for one value: PIL takes `alpha`
/// as a float32 and truncates, clamping only when it extrapolates.
#[inline(always)]
fn blend(degenerate: u8, image: u8, alpha: f32, extrapolates: bool) -> u8 {
    let value = f32::from(degenerate) + alpha * (i32::from(image) - i32::from(degenerate)) as f32;
    if extrapolates {
        if value <= 0.0 {
            return 0;
        }
        if value >= 255.0 {
            return 255;
        }
    }
    value as u8
}

fn extrapolates(alpha: f32) -> bool {
    !(0.0..=1.0).contains(&alpha)
}

/// PIL's `convert("L")`: ITU-R 601-2 luma in 16.16 fixed point, rounded.
#[inline(always)]
fn luma(pixel: &[u8]) -> u8 {
    let weighted = u32::from(pixel[0]) * 19595
        + u32::from(pixel[1]) * 38470
        + u32::from(pixel[2]) * 7471
        + 0x8000;
    (weighted >> 16) as u8
}

/// `ImageEnhance.Brightness(image).enhance(factor)`: a blend with black.
pub fn brightness(pixels: &mut [u8], factor: f64) {
    let alpha = factor as f32;
    let outside = extrapolates(alpha);
    through_table(pixels, |level| blend(0, level, alpha, outside));
}

/// `ImageEnhance.Color(image).enhance(factor)`: a blend with the image's
/// luma (`convert("L").convert("RGB")`).
pub fn color(pixels: &mut [u8], factor: f64) {
    let alpha = factor as f32;
    let outside = extrapolates(alpha);
    for pixel in pixels.chunks_exact_mut(CHANNELS) {
        let gray = luma(pixel);
        for value in pixel.iter_mut() {
            *value = blend(gray, *value, alpha, outside);
        }
    }
}

/// `ImageEnhance.Contrast(image).enhance(factor)`: a blend with the mean
/// luma, `int(mean + 0.5)`, over the whole image.
pub fn contrast(pixels: &mut [u8], factor: f64) {
    let count = pixels.len() / CHANNELS;
    if count == 0 {
        return;
    }
    let sum: u64 = pixels
        .chunks_exact(CHANNELS)
        .map(|p| u64::from(luma(p)))
        .sum();
    // ImageStat's sum is exact in a double, its mean a true division.
    let mean = ((sum as f64) / (count as f64) + 0.5) as u8;
    let alpha = factor as f32;
    let outside = extrapolates(alpha);
    through_table(pixels, |level| blend(mean, level, alpha, outside));
}

/// `ImageEnhance.Sharpness(image).enhance(factor)`: a blend with
/// `filter(ImageFilter.SMOOTH)` (`[[1,1,1],[1,5,1],[1,1,1]] / 13` in
/// float32, the rows summed bottom to top, a half added, truncated); the
/// one-pixel border is the image's own, so it stays as it is.
pub fn sharpness(pixels: &mut [u8], width: u32, factor: f64) {
    let width = width as usize;
    let row = width * CHANNELS;
    if row == 0 {
        return;
    }
    let height = pixels.len() / row;
    if height < 3 || width < 3 {
        return;
    }
    let source = pixels.to_vec();
    let side = 1.0f32 / 13.0;
    let centre = 5.0f32 / 13.0;
    let alpha = factor as f32;
    let outside = extrapolates(alpha);
    let triple = |line: &[u8], at: usize, middle: f32| {
        f32::from(line[at - CHANNELS]) * side
            + f32::from(line[at]) * middle
            + f32::from(line[at + CHANNELS]) * side
    };
    for y in 1..height - 1 {
        let above = &source[(y - 1) * row..y * row];
        let here = &source[y * row..(y + 1) * row];
        let below = &source[(y + 1) * row..(y + 2) * row];
        let out = &mut pixels[y * row..(y + 1) * row];
        for at in CHANNELS..row - CHANNELS {
            let mut sum = 0.5f32;
            sum += triple(below, at, side);
            sum += triple(here, at, centre);
            sum += triple(above, at, side);
            let smooth = sum.clamp(0.0, 255.0) as u8;
            out[at] = blend(smooth, here[at], alpha, outside);
        }
    }
}

/// `ImageOps.autocontrast(image)` (no cutoff): each channel's lowest level
/// to 0 and highest to 255, `int(level * scale + offset)` in double.
pub fn autocontrast(pixels: &mut [u8]) {
    let mut tables = [[0u8; 256]; CHANNELS];
    for (channel, table) in tables.iter_mut().enumerate() {
        let mut seen = [false; 256];
        for &value in pixels.iter().skip(channel).step_by(CHANNELS) {
            seen[usize::from(value)] = true;
        }
        let low = seen.iter().position(|&s| s).unwrap_or(0);
        let high = seen.iter().rposition(|&s| s).unwrap_or(0);
        for (level, entry) in table.iter_mut().enumerate() {
            *entry = if high <= low {
                level as u8
            } else {
                let scale = 255.0 / (high - low) as f64;
                let offset = -(low as f64) * scale;
                (level as f64 * scale + offset).trunc().clamp(0.0, 255.0) as u8
            };
        }
    }
    for pixel in pixels.chunks_exact_mut(CHANNELS) {
        for (value, table) in pixel.iter_mut().zip(&tables) {
            *value = table[usize::from(*value)];
        }
    }
}

/// timm's `solarize_add(image, add, thresh=128)`: `min(255, x + add)` for
/// values below the threshold.
pub fn solarize_add(pixels: &mut [u8], add: u32, threshold: u32) {
    through_table(pixels, |level| {
        if u32::from(level) < threshold {
            (u32::from(level) + add).min(255) as u8
        } else {
            level
        }
    });
}

/// PIL's `Image.transform(size, AFFINE, matrix, resample, fillcolor)`:
/// each output pixel's centre `(x + 0.5, y + 0.5)` through `matrix` (the
/// output-to-input map PIL takes) to a source point, sampled there, or
/// `fill` where that point is outside the image. Bicubic runs a pixel's
/// three channels as lanes of one AVX2 vector where the CPU has it (the
/// same double operations in the same order, so the same bytes).
pub fn affine(
    pixels: &mut [u8],
    width: u32,
    matrix: [f64; 6],
    resample: PilResample,
    fill: [u8; 3],
) {
    let width = width as usize;
    let row = width * CHANNELS;
    if row == 0 {
        return;
    }
    let height = pixels.len() / row;
    // One byte past the last pixel: the vector path reads four bytes a
    // pixel.
    let mut source = Vec::with_capacity(pixels.len() + 1);
    source.extend_from_slice(pixels);
    source.push(0);
    let image = Source {
        pixels: &source,
        width,
        height,
    };
    #[cfg(target_arch = "x86_64")]
    if resample == PilResample::Bicubic
        && super::base::simd_enabled()
        && std::arch::is_x86_feature_detected!("avx2")
    {
        // SAFETY: the CPU has AVX2, checked just above; `source` holds a
        // byte past its last pixel.
        unsafe { x86::bicubic(&image, pixels, matrix, fill) };
        return;
    }
    each_source_point(
        &image,
        pixels,
        matrix,
        fill,
        |xin, yin, out| match resample {
            PilResample::Bilinear => image.bilinear(xin, yin, out),
            PilResample::Bicubic => image.bicubic(xin, yin, out),
        },
    );
}

/// Maps each output pixel's centre through `matrix` and hands the source
/// point to `sample`, or writes `fill` where it is outside the image
/// (PIL's `ImagingGenericTransform` with `affine_transform`).
#[inline(always)]
fn each_source_point(
    image: &Source,
    pixels: &mut [u8],
    [a, b, c, d, e, f]: [f64; 6],
    fill: [u8; 3],
    mut sample: impl FnMut(f64, f64, &mut [u8]),
) {
    let (width, height) = (image.width, image.height);
    let (w, h) = (width as f64, height as f64);
    for (y, line) in pixels.chunks_exact_mut(width * CHANNELS).enumerate() {
        let yc = y as f64 + 0.5;
        for (x, out) in line.chunks_exact_mut(CHANNELS).enumerate() {
            let xc = x as f64 + 0.5;
            let xin = a * xc + b * yc + c;
            let yin = d * xc + e * yc + f;
            if xin < 0.0 || xin >= w || yin < 0.0 || yin >= h {
                out.copy_from_slice(&fill);
            } else {
                sample(xin, yin, out);
            }
        }
    }
}

/// A sample point's whole part and step (PIL's `FLOOR` and `xin - x`).
#[inline(always)]
fn split(v: f64) -> (i64, f64) {
    let whole = floor_f64(v);
    (whole as i64, v - whole)
}

struct Source<'a> {
    pixels: &'a [u8],
    width: usize,
    height: usize,
}

impl Source<'_> {
    /// The byte offset of column `x` clamped into the image (PIL's
    /// `XCLIP`).
    #[inline(always)]
    fn column(&self, x: i64) -> usize {
        x.clamp(0, self.width as i64 - 1) as usize * CHANNELS
    }

    /// The byte offset of row `y` clamped into the image. PIL clamps the
    /// first row it reads and replaces each later one outside the image by
    /// the one above it, which is the same row as clamping each.
    #[inline(always)]
    fn row(&self, y: i64) -> usize {
        y.clamp(0, self.height as i64 - 1) as usize * self.width * CHANNELS
    }

    /// PIL's `bilinear_filter32RGB`, truncated. A step of 0 leaves the
    /// first tap exactly (`a + (b - a) * 0`), so that pass is skipped.
    #[inline(always)]
    fn bilinear(&self, xin: f64, yin: f64, out: &mut [u8]) {
        let ((x, dx), (y, dy)) = (split(xin - 0.5), split(yin - 0.5));
        let columns = [self.column(x), self.column(x + 1)];
        let line = |row: usize, channel: usize| {
            let left = f64::from(self.pixels[row + columns[0] + channel]);
            if dx == 0.0 {
                return left;
            }
            let right = f64::from(self.pixels[row + columns[1] + channel]);
            left + (right - left) * dx
        };
        let (top, bottom) = (self.row(y), self.row(y + 1));
        for (channel, value) in out.iter_mut().enumerate() {
            let first = line(top, channel);
            let v = if dy == 0.0 {
                first
            } else {
                first + (line(bottom, channel) - first) * dy
            };
            *value = v as u8;
        }
    }

    /// PIL's `bicubic_filter32RGB`: its a = -1 cubic over 4 x 4 sources,
    /// clamped to 0..=255 and truncated. A step of 0 gives the second tap
    /// exactly (`p1 + 0 * (...)`), so that pass reads one tap a row (or
    /// one row), as the shears and translations always do on one axis.
    /// The channels go as lanes of one array, each lane PIL's arithmetic,
    /// so the compiler can hold a pixel in one vector.
    #[inline(always)]
    fn bicubic(&self, xin: f64, yin: f64, out: &mut [u8]) {
        let ((x, dx), (y, dy)) = (split(xin - 0.5), split(yin - 0.5));
        let (x, y) = (x - 1, y - 1);
        let columns = [0, 1, 2, 3].map(|i| self.column(x + i));
        let line = |row: usize| -> Lanes<f64> {
            if dx == 0.0 {
                return lanes_f64(self.taps(row + columns[1]));
            }
            cubic_int_lanes(
                [
                    self.taps(row + columns[0]),
                    self.taps(row + columns[1]),
                    self.taps(row + columns[2]),
                    self.taps(row + columns[3]),
                ],
                dx,
            )
        };
        let v = if dy == 0.0 {
            line(self.row(y + 1))
        } else {
            cubic_lanes(
                [
                    line(self.row(y)),
                    line(self.row(y + 1)),
                    line(self.row(y + 2)),
                    line(self.row(y + 3)),
                ],
                dy,
            )
        };
        for (value, v) in out.iter_mut().zip(v) {
            *value = if v <= 0.0 {
                0
            } else if v >= 255.0 {
                255
            } else {
                v as u8
            };
        }
    }

    /// One source pixel's levels as lanes (the fourth unused).
    #[inline(always)]
    fn taps(&self, at: usize) -> Lanes<i32> {
        let pixel = &self.pixels[at..at + CHANNELS];
        [
            i32::from(pixel[0]),
            i32::from(pixel[1]),
            i32::from(pixel[2]),
            0,
        ]
    }
}

/// A pixel's channels in the lanes of one array (the fourth unused).
type Lanes<T> = [T; 4];

#[inline(always)]
fn lanes_f64(levels: Lanes<i32>) -> Lanes<f64> {
    let mut out = [0.0; 4];
    for lane in 0..4 {
        out[lane] = f64::from(levels[lane]);
    }
    out
}

/// [`cubic_int`] lane by lane.
#[inline(always)]
fn cubic_int_lanes([v1, v2, v3, v4]: [Lanes<i32>; 4], d: f64) -> Lanes<f64> {
    let mut out = [0.0; 4];
    for lane in 0..4 {
        out[lane] = cubic_int([v1[lane], v2[lane], v3[lane], v4[lane]], d);
    }
    out
}

/// [`cubic`] lane by lane.
#[inline(always)]
fn cubic_lanes([v1, v2, v3, v4]: [Lanes<f64>; 4], d: f64) -> Lanes<f64> {
    let mut out = [0.0; 4];
    for lane in 0..4 {
        out[lane] = cubic([v1[lane], v2[lane], v3[lane], v4[lane]], d);
    }
    out
}

/// PIL's `BICUBIC` macro on four levels (int arithmetic for its sums).
#[inline(always)]
fn cubic_int([v1, v2, v3, v4]: [i32; 4], d: f64) -> f64 {
    let p1 = f64::from(v2);
    let p2 = f64::from(-v1 + v3);
    let p3 = f64::from(2 * (v1 - v2) + v3 - v4);
    let p4 = f64::from(-v1 + v2 - v3 + v4);
    p1 + d * (p2 + d * (p3 + d * p4))
}

/// PIL's `BICUBIC` macro on four doubles (the vertical pass).
#[inline(always)]
fn cubic([v1, v2, v3, v4]: [f64; 4], d: f64) -> f64 {
    let p1 = v2;
    let p2 = -v1 + v3;
    let p3 = 2.0 * (v1 - v2) + v3 - v4;
    let p4 = -v1 + v2 - v3 + v4;
    p1 + d * (p2 + d * (p3 + d * p4))
}

/// Python's `round(x, 15)`: to 15 decimals and back, correctly rounded.
fn round15(x: f64) -> f64 {
    format!("{x:.15}").parse().unwrap_or(x)
}

/// Python's float `%`: the remainder with the divisor's sign.
fn python_mod(x: f64, divisor: f64) -> f64 {
    let remainder = x % divisor;
    if remainder != 0.0 {
        if (divisor < 0.0) != (remainder < 0.0) {
            remainder + divisor
        } else {
            remainder
        }
    } else {
        0.0f64.copysign(divisor)
    }
}

/// The matrix `Image.rotate(degrees)` hands `transform` for a
/// `width x height` image about its centre, or None where PIL copies the
/// image (an angle of 0 modulo 360). PIL transposes at 90, 180 and 270
/// instead of sampling: those angles are refused by the op's bounds.
pub fn rotate_matrix(degrees: f64, width: u32, height: u32) -> Option<[f64; 6]> {
    let angle = python_mod(degrees, 360.0);
    if angle == 0.0 {
        return None;
    }
    let (cx, cy) = (f64::from(width) / 2.0, f64::from(height) / 2.0);
    let radians = -angle.to_radians();
    let (cos, sin) = (round15(radians.cos()), round15(radians.sin()));
    let (a, b, d, e) = (cos, sin, round15(-radians.sin()), cos);
    let c = a * -cx + b * -cy + 0.0 + cx;
    let f = d * -cx + e * -cy + 0.0 + cy;
    Some([a, b, c, d, e, f])
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::decode::augment::kernels::base::CHANNELS;
    use crate::decode::augment::kernels::pil::{each_source_point, split, Source};

    /// A source pixel's three levels (and the next byte, unused) as i32
    /// lanes.
    #[inline(always)]
    unsafe fn taps(pixels: *const u8, at: usize) -> __m128i {
        let word = (pixels.add(at) as *const i32).read_unaligned();
        _mm_cvtepu8_epi32(_mm_cvtsi32_si128(word))
    }

    /// `p1 + d * (p2 + d * (p3 + d * p4))`, PIL's Horner order.
    #[inline(always)]
    unsafe fn horner(p: [__m256d; 4], d: __m256d) -> __m256d {
        let inner = _mm256_add_pd(p[2], _mm256_mul_pd(d, p[3]));
        let inner = _mm256_add_pd(p[1], _mm256_mul_pd(d, inner));
        _mm256_add_pd(p[0], _mm256_mul_pd(d, inner))
    }

    /// PIL's cubic on four taps of levels: its sums in int, exact.
    #[inline(always)]
    unsafe fn cubic_int([v1, v2, v3, v4]: [__m128i; 4], d: __m256d) -> __m256d {
        let twice = _mm_slli_epi32::<1>(_mm_sub_epi32(v1, v2));
        let p3 = _mm_sub_epi32(_mm_add_epi32(twice, v3), v4);
        let p4 = _mm_add_epi32(_mm_sub_epi32(_mm_sub_epi32(v2, v1), v3), v4);
        let p = [v2, _mm_sub_epi32(v3, v1), p3, p4].map(|lanes| _mm256_cvtepi32_pd(lanes));
        horner(p, d)
    }

    /// PIL's cubic on four rows' doubles, in its order of operations
    /// (`-v1 + v3`, `2 * (v1 - v2) + v3 - v4`, `-v1 + v2 - v3 + v4`).
    #[inline(always)]
    unsafe fn cubic([v1, v2, v3, v4]: [__m256d; 4], d: __m256d) -> __m256d {
        let twice = _mm256_mul_pd(_mm256_set1_pd(2.0), _mm256_sub_pd(v1, v2));
        let p3 = _mm256_sub_pd(_mm256_add_pd(twice, v3), v4);
        let p4 = _mm256_add_pd(_mm256_sub_pd(_mm256_sub_pd(v2, v1), v3), v4);
        horner([v2, _mm256_sub_pd(v3, v1), p3, p4], d)
    }

    /// [`Source::bicubic`] over the whole output, a pixel's channels as
    /// lanes.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn bicubic(
        image: &Source,
        pixels: &mut [u8],
        matrix: [f64; 6],
        fill: [u8; 3],
    ) {
        let base = image.pixels.as_ptr();
        each_source_point(image, pixels, matrix, fill, |xin, yin, out| {
            let ((x, dx), (y, dy)) = (split(xin - 0.5), split(yin - 0.5));
            let (x, y) = (x - 1, y - 1);
            let columns = [0, 1, 2, 3].map(|i| image.column(x + i));
            let vdx = _mm256_set1_pd(dx);
            let line = |row: usize| {
                if dx == 0.0 {
                    return _mm256_cvtepi32_pd(taps(base, row + columns[1]));
                }
                cubic_int(columns.map(|column| taps(base, row + column)), vdx)
            };
            let v = if dy == 0.0 {
                line(image.row(y + 1))
            } else {
                let rows = [0, 1, 2, 3].map(|i| line(image.row(y + i)));
                cubic(rows, _mm256_set1_pd(dy))
            };
            // Clamped to 0..=255, then truncated: PIL's `v <= 0`, `v >= 255`
            // and `(UINT8)v`.
            let clamped =
                _mm256_min_pd(_mm256_max_pd(v, _mm256_setzero_pd()), _mm256_set1_pd(255.0));
            let levels = _mm256_cvttpd_epi32(clamped);
            let bytes = _mm_cvtsi128_si32(_mm_packus_epi16(
                _mm_packus_epi32(levels, levels),
                _mm_setzero_si128(),
            ))
            .to_le_bytes();
            out.copy_from_slice(&bytes[..CHANNELS]);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_to_15_decimals_is_pythons() {
        assert_eq!(round15(0.5), 0.5);
        assert_eq!(round15(0.123_456_789_012_345_67), 0.123_456_789_012_346);
        assert_eq!(round15(-0.999_999_999_999_999_9), -1.0);
        assert_eq!(python_mod(-12.5, 360.0), 347.5);
        assert_eq!(python_mod(-0.0, 360.0), 0.0);
    }

    #[test]
    fn identity_transforms_leave_the_image() {
        let width = 9u32;
        let pixels: Vec<u8> = (0..9 * 7 * 3).map(|i| (i * 37 % 256) as u8).collect();
        for resample in [PilResample::Bilinear, PilResample::Bicubic] {
            let mut out = pixels.clone();
            affine(
                &mut out,
                width,
                [1.0, 0.0, 0.0, 0.0, 1.0, 0.0],
                resample,
                [1, 2, 3],
            );
            assert_eq!(out, pixels, "{resample:?}");
        }
        assert_eq!(rotate_matrix(0.0, 9, 7), None);
        assert_eq!(rotate_matrix(-360.0, 9, 7), None);
    }

    #[test]
    fn a_whole_shift_moves_pixels_and_fills_the_gap() {
        let width = 5u32;
        let pixels: Vec<u8> = (0..5 * 4 * 3).map(|i| i as u8).collect();
        let mut out = pixels.clone();
        // The output at x reads the input at x + 2.
        affine(
            &mut out,
            width,
            [1.0, 0.0, 2.0, 0.0, 1.0, 0.0],
            PilResample::Bicubic,
            [9, 8, 7],
        );
        for y in 0..4 {
            for x in 0..5 {
                let got = &out[(y * 5 + x) * 3..][..3];
                if x + 2 < 5 {
                    assert_eq!(got, &pixels[(y * 5 + x + 2) * 3..][..3]);
                } else {
                    assert_eq!(got, [9, 8, 7]);
                }
            }
        }
    }

    #[test]
    fn blends_truncate_inside_and_clamp_outside() {
        assert_eq!(blend(10, 20, 0.55, false), 15);
        assert_eq!(blend(100, 250, 1.9, true), 255);
        assert_eq!(blend(100, 5, 1.9, true), 0);
        let mut flat = vec![77u8; 5 * 5 * 3];
        sharpness(&mut flat, 5, 1.8);
        assert!(flat.iter().all(|&v| v == 77));
    }

    #[test]
    fn the_lookup_ops_follow_imageops() {
        // timm's 0 bits (PosterizeIncreasing at magnitude 10) and threshold
        // 256 through the shared kernels: black, and nothing inverted.
        let mut levels: Vec<u8> = (0..=255).collect();
        super::super::posterize(&mut levels, 0);
        assert!(levels.iter().all(|&v| v == 0));
        let mut levels: Vec<u8> = (0..=255).collect();
        super::super::solarize(&mut levels, 256.0);
        assert!(levels.iter().enumerate().all(|(i, &v)| usize::from(v) == i));
        let mut levels: Vec<u8> = (0..=255).collect();
        solarize_add(&mut levels, 110, 128);
        assert_eq!(
            (levels[0], levels[127], levels[128], levels[200]),
            (110, 237, 128, 200)
        );
        // One level per channel spread to 0..=255.
        let mut two = vec![10, 20, 30, 61, 20, 40];
        autocontrast(&mut two);
        assert_eq!(two, [0, 20, 0, 255, 20, 255]);
    }
}
