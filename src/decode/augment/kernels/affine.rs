//! Geometric kernels: torchvision's tensor `affine` and `rotate`
//! (`expand=False`) on `uint8`.
//!
//! torchvision builds the inverse matrix in double precision, casts it to
//! float32, maps each output pixel's centre through it in float32
//! (`_affine_grid`), samples with `grid_sample(align_corners=False)`
//! (nearest rounds half to even; zero outside the image), blends a fill
//! colour through a sampled mask channel when one is given, rounds and
//! casts. Every step here is the same one in the same precision, so the
//! sampled positions agree with torchvision's to the last float32 bit
//! wherever the arithmetic is ordered alike.

use super::base::{floor, round_even, CHANNELS};

/// How a geometric op samples its source (torchvision's tensor path takes
/// these two).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Interpolation {
    /// torchvision's default for the auto-augment policies.
    #[default]
    Nearest,
    Bilinear,
}

/// How a geometric op samples and what it writes where its source is
/// outside the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sampling {
    pub interpolation: Interpolation,
    /// `None` is torchvision's `fill=None`: zero padding, no mask (which
    /// differs from an explicit black under bilinear sampling at the edge).
    pub fill: Option<[u8; 3]>,
}

/// `affine(angle, translate, scale=1, shear, center)`, `center` in pixel
/// coordinates (`None`: the image centre), on packed RGB rows of `width`.
pub fn affine(
    pixels: &mut [u8],
    width: u32,
    angle: f64,
    translate: [f64; 2],
    shear: [f64; 2],
    center: Option<[f64; 2]>,
    sampling: Sampling,
) {
    let transform = Affine {
        angle,
        translate,
        scale: 1.0,
        shear,
        center,
    };
    affine_with(pixels, width, transform, sampling);
}

/// The arguments of torchvision's `affine` (angle clockwise, in degrees;
/// translate in pixels; shear in degrees along x and y).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Affine {
    pub angle: f64,
    pub translate: [f64; 2],
    pub scale: f64,
    pub shear: [f64; 2],
    /// In pixel coordinates; `None`: the image centre.
    pub center: Option<[f64; 2]>,
}

/// `affine(...)` with any scale, on packed RGB rows of `width`.
pub fn affine_with(pixels: &mut [u8], width: u32, transform: Affine, sampling: Sampling) {
    let height = pixels.len() / (width as usize * CHANNELS).max(1);
    let (w, h) = (f64::from(width), height as f64);
    let center = transform
        .center
        .map_or([0.0, 0.0], |[x, y]| [x - w * 0.5, y - h * 0.5]);
    let matrix = inverse_affine_matrix(
        center,
        transform.angle,
        transform.translate,
        transform.scale,
        transform.shear,
    );
    sample_grid(pixels, width, matrix, sampling);
}

/// `rotate(angle)` about the image centre, counter-clockwise, with
/// torchvision's exact paths for multiples of 90 degrees.
pub fn rotate(pixels: &mut [u8], width: u32, angle: f64, sampling: Sampling) {
    let height = pixels.len() / (width as usize * CHANNELS).max(1);
    let angle = angle.rem_euclid(360.0);
    let square = height == width as usize;
    match angle {
        0.0 => {}
        180.0 => quarter_turns(pixels, width, 2),
        90.0 if square => quarter_turns(pixels, width, 1),
        270.0 if square => quarter_turns(pixels, width, 3),
        _ => {
            let matrix = inverse_affine_matrix([0.0, 0.0], -angle, [0.0, 0.0], 1.0, [0.0, 0.0]);
            sample_grid(pixels, width, matrix, sampling);
        }
    }
}

/// `vertical_flip`: the rows in reverse order.
pub fn vertical_flip(pixels: &mut [u8], width: u32) {
    let row = width as usize * CHANNELS;
    if row == 0 {
        return;
    }
    let rows = pixels.len() / row;
    for top in 0..rows / 2 {
        let (upper, lower) = pixels.split_at_mut((rows - 1 - top) * row);
        upper[top * row..(top + 1) * row].swap_with_slice(&mut lower[..row]);
    }
}

/// torchvision's `_get_inverse_affine_matrix`, in double (dividing by a
/// scale of 1 changes no bit).
fn inverse_affine_matrix(
    center: [f64; 2],
    angle: f64,
    translate: [f64; 2],
    scale: f64,
    shear: [f64; 2],
) -> [f64; 6] {
    let rot = angle.to_radians();
    let (sx, sy) = (shear[0].to_radians(), shear[1].to_radians());
    let [cx, cy] = center;
    let [tx, ty] = translate;
    let cos_sy = sy.cos();
    let tan_sx = sx.tan();
    let rot_minus_sy = rot - sy;
    let (cx_plus_tx, cy_plus_ty) = (cx + tx, cy + ty);
    let a = rot_minus_sy.cos() / cos_sy;
    let b = -(a * tan_sx + rot.sin());
    let c = rot_minus_sy.sin() / cos_sy;
    let d = rot.cos() - c * tan_sx;
    let mut matrix = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0];
    matrix[2] += cx - matrix[0] * cx_plus_tx - matrix[1] * cy_plus_ty;
    matrix[5] += cy - matrix[3] * cx_plus_tx - matrix[4] * cy_plus_ty;
    matrix
}

/// `torch.rot90(k, dims=(-2, -1))`: `k` quarter turns counter-clockwise.
fn quarter_turns(pixels: &mut [u8], width: u32, turns: u32) {
    let width = width as usize;
    let height = pixels.len() / (width * CHANNELS).max(1);
    let source = pixels.to_vec();
    let at = |y: usize, x: usize| (y * width + x) * CHANNELS;
    for y in 0..height {
        for x in 0..width {
            let from = match turns {
                1 => at(x, width - 1 - y),
                2 => at(height - 1 - y, width - 1 - x),
                _ => at(height - 1 - x, y),
            };
            let to = at(y, x);
            pixels[to..to + CHANNELS].copy_from_slice(&source[from..from + CHANNELS]);
        }
    }
}

simd_kernel! {
/// Samples the image through `matrix` (output centre-relative coordinates
/// to source centre-relative ones) as `_affine_grid` + `grid_sample` +
/// `_apply_grid_transform` do. A row at a time: first every pixel's source
/// coordinates (plain float32 arithmetic the compiler vectorizes), then
/// the samples.
fn sample_grid(pixels: &mut [u8], width: u32, matrix: [f64; 6], sampling: Sampling) {
    let w = width as usize;
    if w == 0 {
        return;
    }
    let h = pixels.len() / (w * CHANNELS);
    // One byte past the last pixel: the AVX2 sampler reads four bytes a
    // pixel.
    let mut source = Vec::with_capacity(pixels.len() + 1);
    source.extend_from_slice(pixels);
    source.push(0);
    let theta = matrix.map(|m| m as f32);
    let (half_w, half_h) = (0.5 * w as f32, 0.5 * h as f32);
    // `theta.transpose(1, 2).div_([0.5 w, 0.5 h])`.
    let x_row = [theta[0] / half_w, theta[3] / half_h];
    let y_row = [theta[1] / half_w, theta[4] / half_h];
    let one_row = [theta[2] / half_w, theta[5] / half_h];
    let (size_w, size_h) = (w as f32, h as f32);
    let (mut xs, mut ys) = (vec![0.0f32; w], vec![0.0f32; w]);
    for y in 0..h {
        let base_y = linspace_at(h, y);
        for (x, (ix, iy)) in xs.iter_mut().zip(ys.iter_mut()).enumerate() {
            let base_x = linspace_at(w, x);
            let grid_x = base_x * x_row[0] + base_y * y_row[0] + one_row[0];
            let grid_y = base_x * x_row[1] + base_y * y_row[1] + one_row[1];
            // Far outside is outside either way: clamped into the range
            // the rounding shortcuts take.
            *ix = (((grid_x + 1.0) * size_w - 1.0) / 2.0).clamp(-1e6, 1e6);
            *iy = (((grid_y + 1.0) * size_h - 1.0) / 2.0).clamp(-1e6, 1e6);
        }
        let row = &mut pixels[y * w * CHANNELS..(y + 1) * w * CHANNELS];
        // Eight pixels at a time where the CPU has AVX2, the rest (or all)
        // one at a time: the same float32 steps either way.
        let (fill, interpolation) = (sampling.fill, sampling.interpolation);
        let done = in_eights(interpolation, &source, (w, h), &xs, &ys, fill, row);
        let (xs, ys, rest) = (&xs[done..], &ys[done..], &mut row[done * CHANNELS..]);
        match interpolation {
            Interpolation::Nearest => nearest_row(&source, (w, h), xs, ys, fill, rest),
            Interpolation::Bilinear => bilinear_row(&source, (w, h), xs, ys, fill, rest),
        }
    }
}
}

/// `torch.linspace((1 - n) / 2, (n - 1) / 2, n)[i]` in float32: the centre
/// of pixel `i` relative to the image centre (exact for any image side).
#[inline(always)]
fn linspace_at(n: usize, i: usize) -> f32 {
    i as f32 - (n as f32 - 1.0) * 0.5
}

/// Nearest sampling of one row: each output is a source pixel's bytes (an
/// integer sampled, masked and rounded is itself), or zero outside the
/// image, or the fill there when one is given (the sampled mask is 0).
#[inline(always)]
fn nearest_row(
    source: &[u8],
    (w, h): (usize, usize),
    xs: &[f32],
    ys: &[f32],
    fill: Option<[u8; 3]>,
    row: &mut [u8],
) {
    let outside = fill.unwrap_or([0; 3]);
    for ((out, &ix), &iy) in row.chunks_exact_mut(CHANNELS).zip(xs).zip(ys) {
        let (x, y) = (round_even(ix), round_even(iy));
        if x < 0.0 || y < 0.0 || x >= w as f32 || y >= h as f32 {
            out.copy_from_slice(&outside);
        } else {
            let at = (y as i32 as usize * w + x as i32 as usize) * CHANNELS;
            out.copy_from_slice(&source[at..at + CHANNELS]);
        }
    }
}

/// Bilinear sampling of one row, the fill blended through the sampled mask
/// as torchvision does, rounded half to even.
#[inline(always)]
fn bilinear_row(
    source: &[u8],
    (w, h): (usize, usize),
    xs: &[f32],
    ys: &[f32],
    fill: Option<[u8; 3]>,
    row: &mut [u8],
) {
    let fill = fill.map(|f| f.map(f32::from));
    for ((out, &ix), &iy) in row.chunks_exact_mut(CHANNELS).zip(xs).zip(ys) {
        let (mut value, mask) = bilinear(source, w, h, ix, iy);
        if let Some(fill) = fill {
            for (channel, fill) in value.iter_mut().zip(fill) {
                *channel = (*channel - fill) * mask + fill;
            }
        }
        for (out, channel) in out.iter_mut().zip(value) {
            *out = round_even(channel.clamp(0.0, 255.0)) as u8;
        }
    }
}

/// The row's leading multiple of 8 pixels sampled with AVX2 (where the CPU
/// has it and benchmarks have not turned it off); the pixels it did.
/// `source` has one byte past its last pixel.
fn in_eights(
    interpolation: Interpolation,
    source: &[u8],
    size: (usize, usize),
    xs: &[f32],
    ys: &[f32],
    fill: Option<[u8; 3]>,
    row: &mut [u8],
) -> usize {
    #[cfg(target_arch = "x86_64")]
    if super::base::simd_enabled() && std::arch::is_x86_feature_detected!("avx2") {
        let sampler = match interpolation {
            Interpolation::Nearest => x86::nearest_eights,
            Interpolation::Bilinear => x86::bilinear_eights,
        };
        // SAFETY: the CPU has AVX2, checked just above; the slices' bounds
        // are checked inside.
        return unsafe { sampler(source, size, xs, ys, fill, row) };
    }
    let _ = (interpolation, source, size, xs, ys, fill, row);
    0
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::decode::augment::kernels::base::CHANNELS;

    /// Eight pixels' bytes at source coordinates `x`, `y` (whole numbers)
    /// and which lie inside the `w x h` image: those outside read pixel 0,
    /// valid memory, for the caller to mask (four bytes from each pixel's
    /// first: `source` holds one byte past its last pixel).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn gather(
        base: *const i32,
        x: __m256,
        y: __m256,
        (w, h): (usize, usize),
    ) -> (__m256i, __m256) {
        let zero = _mm256_setzero_ps();
        let inside = _mm256_and_ps(
            _mm256_and_ps(
                _mm256_cmp_ps::<_CMP_GE_OQ>(x, zero),
                _mm256_cmp_ps::<_CMP_GE_OQ>(y, zero),
            ),
            _mm256_and_ps(
                _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(w as f32)),
                _mm256_cmp_ps::<_CMP_LT_OQ>(y, _mm256_set1_ps(h as f32)),
            ),
        );
        let mask = _mm256_castps_si256(inside);
        let xi = _mm256_and_si256(_mm256_cvttps_epi32(x), mask);
        let yi = _mm256_and_si256(_mm256_cvttps_epi32(y), mask);
        let row = _mm256_mullo_epi32(yi, _mm256_set1_epi32(w as i32));
        let at = _mm256_mullo_epi32(
            _mm256_add_epi32(row, xi),
            _mm256_set1_epi32(CHANNELS as i32),
        );
        // SAFETY: every index is a pixel's first byte (or 0), and the
        // caller's `source` holds one byte past its last pixel.
        (unsafe { _mm256_i32gather_epi32::<1>(base, at) }, inside)
    }

    /// The leading multiple of 8 of a row's pixels, or 0 where `source` is
    /// not the `w x h` image with its byte past the end (or too large to
    /// index in 32 bits).
    fn eights(source: &[u8], (w, h): (usize, usize), xs: &[f32], ys: &[f32], row: &[u8]) -> usize {
        let bytes = w * h * CHANNELS;
        if bytes + 1 > source.len() || bytes >= i32::MAX as usize {
            return 0;
        }
        xs.len().min(ys.len()).min(row.len() / CHANNELS) / 8 * 8
    }

    /// Eight output pixels per step, each lane `nearest_row`'s steps: the
    /// coordinates rounded half to even, the bounds, the source pixel's
    /// bytes or the colour outside.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn nearest_eights(
        source: &[u8],
        (w, h): (usize, usize),
        xs: &[f32],
        ys: &[f32],
        fill: Option<[u8; 3]>,
        row: &mut [u8],
    ) -> usize {
        let eights = eights(source, (w, h), xs, ys, row);
        let outside = fill.unwrap_or([0; 3]);
        let base = source.as_ptr() as *const i32;
        let mut done = 0;
        while done < eights {
            // SAFETY: `done + 8 <= eights`, within both slices.
            let ix = unsafe { _mm256_loadu_ps(xs.as_ptr().add(done)) };
            let iy = unsafe { _mm256_loadu_ps(ys.as_ptr().add(done)) };
            let x = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(ix);
            let y = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(iy);
            // SAFETY: AVX2 is on in this function; `source` is checked above.
            let (bytes, inside) = unsafe { gather(base, x, y, (w, h)) };
            let inside = _mm256_castps_si256(inside);
            let (mut values, mut masks) = ([0i32; 8], [0i32; 8]);
            // SAFETY: 8 lanes into arrays of 8.
            unsafe {
                _mm256_storeu_si256(values.as_mut_ptr() as *mut __m256i, bytes);
                _mm256_storeu_si256(masks.as_mut_ptr() as *mut __m256i, inside);
            }
            for lane in 0..8 {
                let at = (done + lane) * CHANNELS;
                let pixel = if masks[lane] != 0 {
                    let [r, g, b, _] = values[lane].to_le_bytes();
                    [r, g, b]
                } else {
                    outside
                };
                row[at..at + CHANNELS].copy_from_slice(&pixel);
            }
            done += 8;
        }
        done
    }

    /// Eight output pixels per step, each lane the scalar `bilinear` and
    /// `bilinear_row` steps in their order: floor, the four weights, each
    /// neighbour inside the image added in turn (one outside adds nothing:
    /// its weight is taken as zero, and `a + 0 * v` is `a`), the mask as
    /// the sum of those weights, the fill, clamp and round half to even.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn bilinear_eights(
        source: &[u8],
        (w, h): (usize, usize),
        xs: &[f32],
        ys: &[f32],
        fill: Option<[u8; 3]>,
        row: &mut [u8],
    ) -> usize {
        let eights = eights(source, (w, h), xs, ys, row);
        let (zero, one) = (_mm256_setzero_ps(), _mm256_set1_ps(1.0));
        let byte = _mm256_set1_epi32(0xff);
        let fills = fill.map(|f| f.map(|c| _mm256_set1_ps(f32::from(c))));
        let base = source.as_ptr() as *const i32;
        let mut done = 0;
        while done < eights {
            // SAFETY: `done + 8 <= eights`, within both slices.
            let ix = unsafe { _mm256_loadu_ps(xs.as_ptr().add(done)) };
            let iy = unsafe { _mm256_loadu_ps(ys.as_ptr().add(done)) };
            let x0 = _mm256_floor_ps(ix);
            let y0 = _mm256_floor_ps(iy);
            let x1 = _mm256_add_ps(x0, one);
            let y1 = _mm256_add_ps(y0, one);
            let east = _mm256_sub_ps(ix, x0);
            let south = _mm256_sub_ps(iy, y0);
            let west = _mm256_sub_ps(one, east);
            let north = _mm256_sub_ps(one, south);
            let corners = [
                (x0, y0, _mm256_mul_ps(north, west)),
                (x1, y0, _mm256_mul_ps(north, east)),
                (x0, y1, _mm256_mul_ps(south, west)),
                (x1, y1, _mm256_mul_ps(south, east)),
            ];
            let mut value = [zero; 3];
            let mut mask = zero;
            for (x, y, weight) in corners {
                // SAFETY: AVX2 is on in this function; `source` is checked above.
                let (bytes, inside) = unsafe { gather(base, x, y, (w, h)) };
                let weight = _mm256_and_ps(weight, inside);
                let channels = [
                    _mm256_and_si256(bytes, byte),
                    _mm256_and_si256(_mm256_srli_epi32::<8>(bytes), byte),
                    _mm256_and_si256(_mm256_srli_epi32::<16>(bytes), byte),
                ];
                for (sum, channel) in value.iter_mut().zip(channels) {
                    let product = _mm256_mul_ps(weight, _mm256_cvtepi32_ps(channel));
                    *sum = _mm256_add_ps(*sum, product);
                }
                mask = _mm256_add_ps(mask, weight);
            }
            let mut lanes = [[0i32; 8]; 3];
            for (c, sum) in value.iter().enumerate() {
                let mut v = *sum;
                if let Some(fills) = fills {
                    v = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(v, fills[c]), mask), fills[c]);
                }
                let clamped = _mm256_max_ps(_mm256_min_ps(v, _mm256_set1_ps(255.0)), zero);
                let rounded =
                    _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(clamped);
                // SAFETY: 8 lanes into an array of 8.
                unsafe {
                    _mm256_storeu_si256(
                        lanes[c].as_mut_ptr() as *mut __m256i,
                        _mm256_cvtps_epi32(rounded),
                    )
                };
            }
            for lane in 0..8 {
                let at = (done + lane) * CHANNELS;
                for (c, channel) in lanes.iter().enumerate() {
                    row[at + c] = channel[lane] as u8;
                }
            }
            done += 8;
        }
        done
    }
}

/// The four neighbours weighted as `grid_sample`'s bilinear mode weighs
/// them, those outside the image contributing zero; the mask is the sum of
/// the weights inside.
#[inline(always)]
fn bilinear(source: &[u8], w: usize, h: usize, ix: f32, iy: f32) -> ([f32; 3], f32) {
    let (x0, y0) = (floor(ix), floor(iy));
    let (x1, y1) = (x0 + 1.0, y0 + 1.0);
    // PyTorch's CPU kernel's weights, in its order of operations.
    let (east, south) = (ix - x0, iy - y0);
    let (west, north) = (1.0 - east, 1.0 - south);
    let corners = [
        (x0, y0, north * west),
        (x1, y0, north * east),
        (x0, y1, south * west),
        (x1, y1, south * east),
    ];
    let mut value = [0.0f32; 3];
    let mut mask = 0.0f32;
    for (x, y, weight) in corners {
        if x < 0.0 || y < 0.0 || x >= w as f32 || y >= h as f32 {
            continue;
        }
        let at = (y as i32 as usize * w + x as i32 as usize) * CHANNELS;
        for (c, channel) in value.iter_mut().enumerate() {
            *channel += weight * f32::from(source[at + c]);
        }
        mask += weight;
    }
    (value, mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(width: usize, height: usize) -> Vec<u8> {
        (0..width * height * CHANNELS)
            .map(|v| (v % 251) as u8)
            .collect()
    }

    #[test]
    fn an_integer_translation_moves_pixels_and_fills_the_edge() {
        let mut pixels = ramp(6, 4);
        let before = pixels.clone();
        let nearest = Sampling {
            fill: Some([1, 2, 3]),
            ..Sampling::default()
        };
        affine(&mut pixels, 6, 0.0, [2.0, 0.0], [0.0, 0.0], None, nearest);
        for y in 0..4 {
            let row = y * 18;
            assert_eq!(pixels[row..row + 6], [1, 2, 3, 1, 2, 3]);
            assert_eq!(pixels[row + 6..row + 18], before[row..row + 12]);
        }
    }

    #[test]
    fn quarter_turns_compose_to_the_identity() {
        let mut pixels = ramp(5, 5);
        let before = pixels.clone();
        rotate(&mut pixels, 5, 90.0, Sampling::default());
        assert_ne!(pixels, before);
        rotate(&mut pixels, 5, -90.0, Sampling::default());
        assert_eq!(pixels, before);
        rotate(&mut pixels, 5, 180.0, Sampling::default());
        rotate(&mut pixels, 5, 540.0, Sampling::default());
        assert_eq!(pixels, before);
    }

    #[test]
    fn a_non_square_quarter_turn_samples_like_any_other_angle() {
        let mut pixels = ramp(6, 4);
        rotate(&mut pixels, 6, 90.0, Sampling::default());
        // The corners of a 6x4 image rotated in place fall outside it.
        assert_eq!(pixels[..3], [0, 0, 0]);
    }
}
