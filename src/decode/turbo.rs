//! The fast JPEG path: libjpeg-turbo with DCT-domain scaling.
//!
//! A JPEG can be decoded at 1/8, 2/8, ... 8/8 of its size for a fraction of
//! the full cost. We decode at the smallest such size that still covers the
//! output (so quality is kept: the final resize only ever shrinks), then
//! resize with fast_image_resize. Anything libjpeg-turbo cannot decode to RGB
//! (e.g. CMYK) falls back to the `image` crate.

use std::cell::RefCell;

use turbojpeg::{Decompressor, Image, PixelFormat, ScalingFactor};

use super::{
    resize_rgb, source_crop, DecodeError, Decoder, ImageCrateDecoder, OutputSpec, MAX_SOURCE_PIXELS,
};
use crate::shard::ImageFormat;

thread_local! {
    // One decompressor and one scratch buffer per decode thread, reused for
    // every image: no per-sample allocation on this path.
    static STATE: RefCell<Option<(Decompressor, Vec<u8>)>> = const { RefCell::new(None) };
}

/// Which DCT scale factors the decoder may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScaleFactors {
    /// 1/8, 1/4, 1/2, 1: the factors libjpeg-turbo decodes with SIMD.
    #[default]
    PowersOfTwo,
    /// Any n/8 (3/8, 5/8, ... use libjpeg-turbo's plain C IDCT).
    AnyEighth,
    /// Never scale (full-size decode).
    None,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct TurboJpegDecoder {
    pub factors: ScaleFactors,
}

/// The smallest allowed scale at which the source crop still covers the output.
pub fn dct_scale(
    width: u32,
    height: u32,
    spec: &OutputSpec,
    factors: ScaleFactors,
) -> ScalingFactor {
    let (_, _, crop_w, crop_h) = source_crop(width, height, spec);
    let need_w = f64::from(spec.width) / crop_w;
    let need_h = f64::from(spec.height) / crop_h;
    let need = need_w.max(need_h);
    let allowed: &[usize] = match factors {
        ScaleFactors::PowersOfTwo => &[1, 2, 4, 8],
        ScaleFactors::AnyEighth => &[1, 2, 3, 4, 5, 6, 7, 8],
        ScaleFactors::None => &[8],
    };
    allowed
        .iter()
        .map(|&num| ScalingFactor::new(num, 8))
        .find(|factor| factor.num() as f64 / factor.denom() as f64 >= need)
        .unwrap_or(ScalingFactor::ONE)
}

impl TurboJpegDecoder {
    fn decode_jpeg(
        &self,
        data: &[u8],
        spec: &OutputSpec,
        out: &mut [u8],
    ) -> Result<(), DecodeError> {
        STATE.with(|state| {
            let mut state = state.borrow_mut();
            if state.is_none() {
                let decompressor =
                    Decompressor::new().map_err(|e| DecodeError::Corrupt(e.to_string()))?;
                *state = Some((decompressor, Vec::new()));
            }
            let Some((decompressor, scratch)) = state.as_mut() else {
                return Err(DecodeError::Corrupt("no decompressor".into()));
            };
            let header = decompressor
                .read_header(data)
                .map_err(|e| DecodeError::Corrupt(e.to_string()))?;
            let (width, height) = (header.width as u32, header.height as u32);
            if u64::from(width) * u64::from(height) > MAX_SOURCE_PIXELS {
                return Err(DecodeError::TooLarge { width, height });
            }
            let factor = dct_scale(width, height, spec, self.factors);
            decompressor
                .set_scaling_factor(factor)
                .map_err(|e| DecodeError::Corrupt(e.to_string()))?;
            let (scaled_w, scaled_h) = (factor.scale(header.width), factor.scale(header.height));
            scratch.resize(scaled_w * scaled_h * 3, 0);
            let image = Image {
                pixels: scratch.as_mut_slice(),
                width: scaled_w,
                pitch: scaled_w * 3,
                height: scaled_h,
                format: PixelFormat::RGB,
            };
            decompressor
                .decompress(data, image)
                .map_err(|e| DecodeError::Corrupt(e.to_string()))?;
            resize_rgb(scratch, scaled_w as u32, scaled_h as u32, spec, out)
        })
    }
}

impl Decoder for TurboJpegDecoder {
    fn decode_into(
        &self,
        format: ImageFormat,
        data: &[u8],
        spec: &OutputSpec,
        out: &mut [u8],
    ) -> Result<(), DecodeError> {
        if format != ImageFormat::Jpeg {
            return ImageCrateDecoder.decode_into(format, data, spec, out);
        }
        match self.decode_jpeg(data, spec, out) {
            Ok(()) => Ok(()),
            Err(too_large @ DecodeError::TooLarge { .. }) => Err(too_large),
            // CMYK, unusual sampling, or a truncated file libjpeg-turbo
            // rejects: the other decoder decides.
            Err(_) => ImageCrateDecoder.decode_into(format, data, spec, out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::ResizeMode;

    #[test]
    fn picks_the_smallest_scale_that_covers_the_output() {
        let spec = OutputSpec {
            height: 224,
            width: 224,
            mode: ResizeMode::CenterCrop,
        };
        let any = ScaleFactors::AnyEighth;
        let pow2 = ScaleFactors::PowersOfTwo;
        // 500x375: crop 375x375 -> needs 224/375 = 0.597 -> 5/8, or 1 in powers of two.
        assert_eq!(dct_scale(500, 375, &spec, any), ScalingFactor::new(5, 8));
        assert_eq!(dct_scale(500, 375, &spec, pow2), ScalingFactor::ONE);
        // 2000x1500: needs 0.149 -> 2/8 = 1/4.
        assert_eq!(dct_scale(2000, 1500, &spec, any), ScalingFactor::new(1, 4));
        assert_eq!(dct_scale(2000, 1500, &spec, pow2), ScalingFactor::new(1, 4));
        // Smaller than the output: full size.
        assert_eq!(dct_scale(100, 100, &spec, any), ScalingFactor::ONE);
    }

    #[cfg(feature = "dev")]
    #[test]
    fn fast_path_stays_close_to_a_full_decode() {
        let pixels = crate::dev::synthetic::synthetic_image(3, 3, 3, 640, 480);
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90)
            .encode_image(&pixels)
            .unwrap();
        let spec = OutputSpec {
            height: 224,
            width: 224,
            mode: ResizeMode::CenterCrop,
        };
        let mut fast = vec![0u8; spec.bytes()];
        let mut reference = vec![0u8; spec.bytes()];
        TurboJpegDecoder {
            factors: ScaleFactors::AnyEighth,
        }
        .decode_into(ImageFormat::Jpeg, &jpeg, &spec, &mut fast)
        .unwrap();
        ImageCrateDecoder
            .decode_into(ImageFormat::Jpeg, &jpeg, &spec, &mut reference)
            .unwrap();
        let psnr = crate::dev::kernel::psnr(&fast, &reference);
        assert!(psnr > 30.0, "PSNR {psnr:.1} dB");
    }
}
