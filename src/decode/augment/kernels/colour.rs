//! Colour kernels: torchvision's `adjust_*`, `posterize`, `solarize`,
//! `autocontrast`, `equalize`, `invert` and `rgb_to_grayscale` on `uint8`.
//!
//! torchvision computes these in float32 and casts back with `.to(uint8)`,
//! which truncates (no rounding) after clamping; the kernels do the same in
//! `f32`, so the last level agrees wherever float32 does.

use super::base::{clamp_cast, floor, CHANNELS};

/// torchvision's luma weights (ITU-R 601-2, as PIL's "L" conversion).
const LUMA: [f32; 3] = [0.2989, 0.587, 0.114];

/// Each value through a table of what a per-value formula gives each of
/// the 256 levels: the formula runs 256 times instead of once a value,
/// with the same float32 steps, so the bytes are the formula's.
pub(super) fn through_table(pixels: &mut [u8], formula: impl Fn(u8) -> u8) {
    let table: [u8; 256] = std::array::from_fn(|level| formula(level as u8));
    for value in pixels.iter_mut() {
        *value = table[usize::from(*value)];
    }
}

/// [`through_table`] with a table per channel.
fn through_tables(pixels: &mut [u8], tables: &[[u8; 256]; CHANNELS]) {
    for pixel in pixels.chunks_exact_mut(CHANNELS) {
        for (value, table) in pixel.iter_mut().zip(tables) {
            *value = table[usize::from(*value)];
        }
    }
}

/// `floor(luma)` of a pixel as an integer (the luma is within 0..=255).
#[inline(always)]
fn floored_luma(pixel: &[u8]) -> u32 {
    // SAFETY: a weighted mean of bytes with weights summing to ~1 is
    // finite and within 0..=255.
    unsafe { luma(pixel).to_int_unchecked::<i32>() as u32 }
}

/// The float32 luma torchvision's kernels blend with (before any floor).
fn luma(pixel: &[u8]) -> f32 {
    f32::from(pixel[0]) * LUMA[0] + f32::from(pixel[1]) * LUMA[1] + f32::from(pixel[2]) * LUMA[2]
}

simd_kernel! {
/// `adjust_brightness(factor)`: `x * factor`.
pub fn adjust_brightness(pixels: &mut [u8], factor: f32) {
    for value in pixels.iter_mut() {
        *value = clamp_cast(f32::from(*value) * factor);
    }
}
}

/// torchvision's `_blend(x, other, ratio)`: `x * ratio + other * (1 - ratio)`,
/// with `1 - ratio` taken in double precision as Python does.
fn blend_factors(ratio: f32) -> (f32, f32) {
    (ratio, (1.0 - f64::from(ratio)) as f32)
}

simd_kernel! {
/// `adjust_saturation(factor)` (AutoAugment's `Color`): a blend with the
/// floored luma of each pixel.
pub fn adjust_saturation(pixels: &mut [u8], factor: f32) {
    let (keep, other) = blend_factors(factor);
    for pixel in pixels.chunks_exact_mut(CHANNELS) {
        let gray = floored_luma(pixel) as f32 * other;
        for value in pixel.iter_mut() {
            *value = clamp_cast(f32::from(*value) * keep + gray);
        }
    }
}
}

simd_kernel! {
/// `adjust_contrast(factor)`: a blend with the mean of the floored luma over
/// the whole image.
pub fn adjust_contrast(pixels: &mut [u8], factor: f32) {
    let count = pixels.len() / CHANNELS;
    if count == 0 {
        return;
    }
    // The floored lumas are integers: their sum is exact.
    let sum: u64 = pixels
        .chunks_exact(CHANNELS)
        .map(|pixel| u64::from(floored_luma(pixel)))
        .sum();
    let mean = (sum as f64 / count as f64) as f32;
    let (keep, other) = blend_factors(factor);
    let offset = mean * other;
    through_table(pixels, |x| clamp_cast(f32::from(x) * keep + offset));
}
}

simd_kernel! {
/// `adjust_sharpness(factor)`: a blend with the 3x3 smoothing
/// `[[1,1,1],[1,5,1],[1,1,1]] / 13`, rounded, over the interior; the
/// one-pixel border is left as it is (torchvision's valid convolution).
pub fn adjust_sharpness(pixels: &mut [u8], width: u32, factor: f32) {
    let width = width as usize;
    let row = width * CHANNELS;
    if row == 0 {
        return;
    }
    let height = pixels.len() / row;
    if height <= 2 || width <= 2 {
        return;
    }
    let alpha = (1.0 - f64::from(factor)) as f32;
    let source = pixels.to_vec();
    for y in 1..height - 1 {
        let (above, here, below) = (
            &source[(y - 1) * row..y * row],
            &source[y * row..(y + 1) * row],
            &source[(y + 1) * row..(y + 2) * row],
        );
        let out = &mut pixels[y * row..(y + 1) * row];
        for index in CHANNELS..row - CHANNELS {
            let neighbours = u32::from(above[index - CHANNELS])
                + u32::from(above[index])
                + u32::from(above[index + CHANNELS])
                + u32::from(here[index - CHANNELS])
                + u32::from(here[index + CHANNELS])
                + u32::from(below[index - CHANNELS])
                + u32::from(below[index])
                + u32::from(below[index + CHANNELS]);
            let centre = u32::from(here[index]);
            // round((n + 5c) / 13): never a tie (13 is odd), so integer
            // rounding equals torchvision's float32 `round_()`.
            let blurred = ((neighbours + 5 * centre) * 2 + 13) / 26;
            let x = f32::from(here[index]);
            out[index] = clamp_cast(x + alpha * (blurred as f32 - x));
        }
    }
}
}

/// `posterize(bits)`: keeps the top `bits` bits of each value.
pub fn posterize(pixels: &mut [u8], bits: u8) {
    if bits >= 8 {
        return;
    }
    let mask = (((1u16 << bits) - 1) << (8 - bits)) as u8;
    for value in pixels.iter_mut() {
        *value &= mask;
    }
}

simd_kernel! {
/// `solarize(threshold)`: inverts each value at or above `threshold`.
pub fn solarize(pixels: &mut [u8], threshold: f64) {
    through_table(pixels, |x| if f64::from(x) >= threshold { 255 - x } else { x });
}
}

/// `permute_channels(permutation)`: output channel `c` is input channel
/// `order[c]`.
pub fn permute_channels(pixels: &mut [u8], order: [u8; 3]) {
    let order = order.map(usize::from);
    for pixel in pixels.chunks_exact_mut(CHANNELS) {
        let source = [pixel[0], pixel[1], pixel[2]];
        for (out, &from) in pixel.iter_mut().zip(&order) {
            *out = source[from];
        }
    }
}

/// `invert`: `255 - x`.
pub fn invert(pixels: &mut [u8]) {
    for value in pixels.iter_mut() {
        *value = !*value;
    }
}

simd_kernel! {
/// `rgb_to_grayscale(num_output_channels=3)`: the truncated luma in each
/// channel.
pub fn grayscale(pixels: &mut [u8]) {
    for pixel in pixels.chunks_exact_mut(CHANNELS) {
        let gray = clamp_cast(luma(pixel));
        pixel.fill(gray);
    }
}
}

simd_kernel! {
/// `autocontrast`: each channel stretched from its own min..max to 0..255;
/// a flat channel is left as it is.
pub fn autocontrast(pixels: &mut [u8]) {
    if pixels.len() < CHANNELS {
        return;
    }
    let (mut low, mut high) = ([255u8; CHANNELS], [0u8; CHANNELS]);
    for pixel in pixels.chunks_exact(CHANNELS) {
        for c in 0..CHANNELS {
            low[c] = low[c].min(pixel[c]);
            high[c] = high[c].max(pixel[c]);
        }
    }
    let tables: [[u8; 256]; CHANNELS] = std::array::from_fn(|c| {
        std::array::from_fn(|level| {
            let level = level as u8;
            if low[c] == high[c] {
                return level;
            }
            let inverse_scale = f32::from(high[c] - low[c]) * (1.0f64 / 255.0) as f32;
            clamp_cast((f32::from(level) - f32::from(low[c])) / inverse_scale)
        })
    });
    through_tables(pixels, &tables);
}
}

simd_kernel! {
/// `equalize`: each channel through PIL's histogram-equalizing table,
/// `lut[k] = (cdf[k-1] + step / 2) / step` with `step` the pixels that are
/// not of the channel's largest value, over 255; a channel whose step is 0
/// is left as it is.
pub fn equalize(pixels: &mut [u8]) {
    let count = (pixels.len() / CHANNELS) as u64;
    for channel in 0..CHANNELS {
        let mut histogram = [0u64; 256];
        for &value in pixels.iter().skip(channel).step_by(CHANNELS) {
            histogram[usize::from(value)] += 1;
        }
        let Some(largest) = histogram.iter().rposition(|&n| n > 0) else {
            return;
        };
        let step = (count - histogram[largest]) / 255;
        if step == 0 {
            continue;
        }
        let mut table = [0u8; 256];
        let mut below = 0u64;
        for (level, entry) in table.iter_mut().enumerate() {
            *entry = ((below + step / 2) / step).min(255) as u8;
            below += histogram[level];
        }
        for value in pixels.iter_mut().skip(channel).step_by(CHANNELS) {
            *value = table[usize::from(*value)];
        }
    }
}
}

/// Pixels per block of [`adjust_hue`]: each step runs over a block's
/// lanes as a plain loop, which the compiler turns into vector code.
const HUE_LANES: usize = 16;

simd_kernel! {
/// `adjust_hue(factor)`, `factor` in `[-0.5, 0.5]`: through HSV in float32
/// as torchvision's `_rgb_to_hsv` / `_hsv_to_rgb`, back to `uint8` by its
/// `to_dtype` (`x * 255.999`, truncated). A block of pixels at a time, each
/// step branch-free over the block (selects where torchvision masks), so
/// the lanes are vector lanes; every value takes the float32 operations of
/// [`hue_pixel`], in its order.
pub fn adjust_hue(pixels: &mut [u8], factor: f32) {
    let mut blocks = pixels.chunks_exact_mut(HUE_LANES * CHANNELS);
    for block in &mut blocks {
        let mut rgb = [[0.0f32; HUE_LANES]; CHANNELS];
        for (lane, pixel) in block.chunks_exact(CHANNELS).enumerate() {
            for c in 0..CHANNELS {
                rgb[c][lane] = f32::from(pixel[c]);
            }
        }
        let mut out = [[0u8; HUE_LANES]; CHANNELS];
        for lane in 0..HUE_LANES {
            let shifted = hue_pixel([rgb[0][lane], rgb[1][lane], rgb[2][lane]], factor);
            for c in 0..CHANNELS {
                out[c][lane] = shifted[c];
            }
        }
        for (lane, pixel) in block.chunks_exact_mut(CHANNELS).enumerate() {
            for c in 0..CHANNELS {
                pixel[c] = out[c][lane];
            }
        }
    }
    for pixel in blocks.into_remainder().chunks_exact_mut(CHANNELS) {
        let levels = [0, 1, 2].map(|c| f32::from(pixel[c]));
        pixel.copy_from_slice(&hue_pixel(levels, factor));
    }
}
}

/// One pixel's hue shift (its levels as floats), branch-free.
#[inline(always)]
fn hue_pixel(levels: [f32; CHANNELS], factor: f32) -> [u8; CHANNELS] {
    let to_float = (1.0f64 / 255.0) as f32;
    let to_byte = (255.0f64 + 1.0 - 1e-3) as f32;
    let [r, g, b] = levels.map(|level| level * to_float);
    let (hue, saturation, value) = rgb_to_hsv(r, g, b);
    let shifted = hue + factor;
    let hue = shifted - floor(shifted);
    hsv_to_rgb(hue, saturation, value).map(|channel| clamp_cast(channel * to_byte))
}

#[inline(always)]
fn rgb_to_hsv(r: f32, g: f32, b: f32) -> (f32, f32, f32) {
    let high = r.max(g).max(b);
    let low = r.min(g).min(b);
    let flat = high == low;
    let range = high - low;
    let saturation = range / if flat { 1.0 } else { high };
    let divisor = if flat { 1.0 } else { range };
    let (rc, gc, bc) = (
        (high - r) / divisor,
        (high - g) / divisor,
        (high - b) / divisor,
    );
    // torchvision's masks: red where the maximum is red, green where it is
    // green and not red, blue elsewhere.
    let from_red = bc - gc;
    let from_green = rc + 2.0 - bc;
    let from_blue = gc + 4.0 - rc;
    let hue = if high == r {
        from_red
    } else if high == g {
        from_green
    } else {
        from_blue
    };
    // torchvision: `(h / 6 + 1) fmod 1`, with the sixth taken in float32;
    // the sum is in [0, 2), where the remainder is exact as a subtraction.
    let sum = hue * (1.0f64 / 6.0) as f32 + 1.0;
    let hue = if sum >= 1.0 { sum - 1.0 } else { sum };
    (hue, saturation, high)
}

#[inline(always)]
fn hsv_to_rgb(hue: f32, saturation: f32, value: f32) -> [f32; 3] {
    let sixths = hue * 6.0;
    let sector = floor(sixths);
    let fraction = sixths - sector;
    let sxf = saturation * fraction;
    let one_minus_s = 1.0 - saturation;
    let q = ((1.0 - sxf) * value).clamp(0.0, 1.0);
    let t = ((sxf + one_minus_s) * value).clamp(0.0, 1.0);
    let p = (one_minus_s * value).clamp(0.0, 1.0);
    // torchvision's `i % 6` of the sector in [0, 6]: 6 is 0.
    let sector = if sector >= 6.0 { sector - 6.0 } else { sector };
    // Its table, sector by sector: red v q p p t v, green t v v q p p,
    // blue p p t v v q.
    let red = if sector == 0.0 || sector == 5.0 {
        value
    } else if sector == 1.0 {
        q
    } else if sector == 4.0 {
        t
    } else {
        p
    };
    let green = if sector == 1.0 || sector == 2.0 {
        value
    } else if sector == 0.0 {
        t
    } else if sector == 3.0 {
        q
    } else {
        p
    };
    let blue = if sector == 3.0 || sector == 4.0 {
        value
    } else if sector == 2.0 {
        t
    } else if sector == 5.0 {
        q
    } else {
        p
    };
    [red, green, blue]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hue shift as it was written before its blocks: the sector's
    /// table looked up, the sector taken by `rem_euclid`.
    fn hue_by_table(pixel: &mut [u8], factor: f32) {
        let to_float = (1.0f64 / 255.0) as f32;
        let to_byte = (255.0f64 + 1.0 - 1e-3) as f32;
        let [r, g, b] = [0, 1, 2].map(|c| f32::from(pixel[c]) * to_float);
        let (hue, saturation, value) = rgb_to_hsv(r, g, b);
        let shifted = hue + factor;
        let hue = shifted - shifted.floor();
        let sixths = hue * 6.0;
        let sector = sixths.floor();
        let fraction = sixths - sector;
        let sxf = saturation * fraction;
        let one_minus_s = 1.0 - saturation;
        let q = ((1.0 - sxf) * value).clamp(0.0, 1.0);
        let t = ((sxf + one_minus_s) * value).clamp(0.0, 1.0);
        let p = (one_minus_s * value).clamp(0.0, 1.0);
        let vpqt = [value, p, q, t];
        const SELECT: [[usize; 6]; 3] =
            [[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]];
        let sector = (sector as i32).rem_euclid(6) as usize;
        for c in 0..CHANNELS {
            pixel[c] = clamp_cast(vpqt[SELECT[c][sector]] * to_byte);
        }
    }

    /// Every colour, through the blocks (both builds) and the remainder,
    /// takes the bytes of the table form.
    #[test]
    fn the_hue_blocks_give_the_table_forms_bytes_for_every_colour() {
        let colours: Vec<u8> = (0..1u32 << 24)
            .flat_map(|c| [(c >> 16) as u8, (c >> 8) as u8, c as u8])
            .collect();
        for factor in [-0.5f32, -0.137, 0.02, 0.5] {
            let mut expected = colours.clone();
            for pixel in expected.chunks_exact_mut(CHANNELS) {
                hue_by_table(pixel, factor);
            }
            for simd in [true, false] {
                super::super::base::set_simd(simd);
                let mut blocks = colours.clone();
                adjust_hue(&mut blocks, factor);
                // 7 pixels: the remainder path alone.
                let mut short = colours[..21].to_vec();
                adjust_hue(&mut short, factor);
                super::super::base::set_simd(true);
                assert!(blocks == expected, "factor {factor}, simd {simd}");
                assert_eq!(short[..], expected[..21]);
            }
        }
    }

    #[test]
    fn colour_kernels_truncate_as_torchvision_does() {
        let mut pixels = [100u8, 200, 50];
        adjust_brightness(&mut pixels, 1.5);
        assert_eq!(pixels, [150, 255, 75]);
        let mut pixels = [10u8, 20, 30];
        adjust_brightness(&mut pixels, 0.33);
        // 3.3, 6.6, 9.9 truncate.
        assert_eq!(pixels, [3, 6, 9]);
        let mut pixels = [0u8, 127, 128, 255, 200, 1];
        posterize(&mut pixels, 1);
        assert_eq!(pixels, [0, 0, 128, 128, 128, 0]);
        let mut pixels = [10u8, 178, 179, 255, 0, 100];
        solarize(&mut pixels, 178.5);
        assert_eq!(pixels, [10, 178, 76, 0, 0, 100]);
        let mut pixels = [0u8, 255, 17];
        invert(&mut pixels);
        assert_eq!(pixels, [255, 0, 238]);
    }

    #[test]
    fn a_flat_channel_is_left_by_autocontrast_and_equalize() {
        let mut pixels: Vec<u8> = (0..16).flat_map(|i| [50, 100 + i, 7]).collect();
        let before = pixels.clone();
        autocontrast(&mut pixels);
        for (after, before) in pixels.chunks(3).zip(before.chunks(3)) {
            assert_eq!((after[0], after[2]), (before[0], before[2]));
        }
        assert_eq!(pixels[1], 0);
        // torchvision's float32 scale lands just below 255 here, truncated.
        assert_eq!(pixels[16 * 3 - 2], 254);
        let mut flat = vec![9u8; 30];
        equalize(&mut flat);
        assert_eq!(flat, vec![9u8; 30]);
    }

    #[test]
    fn hue_by_zero_keeps_pixels_within_a_level() {
        let mut pixels: Vec<u8> = (0..=255u8).flat_map(|v| [v, 255 - v, v / 2]).collect();
        let before = pixels.clone();
        adjust_hue(&mut pixels, 0.0);
        for (a, b) in pixels.iter().zip(&before) {
            assert!(a.abs_diff(*b) <= 1, "{a} vs {b}");
        }
    }

    #[test]
    fn sharpness_leaves_the_border() {
        let mut pixels: Vec<u8> = (0..5 * 5 * 3).map(|v| (v * 37 % 251) as u8).collect();
        let before = pixels.clone();
        adjust_sharpness(&mut pixels, 5, 2.0);
        let row = 15;
        assert_eq!(pixels[..row], before[..row]);
        assert_eq!(pixels[4 * row..], before[4 * row..]);
        for y in 0..5 {
            assert_eq!(pixels[y * row..y * row + 3], before[y * row..y * row + 3]);
        }
        assert_ne!(pixels, before);
    }
}
