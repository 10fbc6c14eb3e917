//! The decoder seam and its portable implementation: the `image` crate's
//! decoders with fast_image_resize's convolution, which every other decoder
//! falls back to (and is measured against).

use std::cell::RefCell;

use fast_image_resize as fir;

use super::augment::{CropBox, OutputSpec};
use super::error::{DecodeError, MAX_SOURCE_PIXELS};
use super::jpeg::{check_jpeg_complete, check_jpeg_tables};
use crate::shard::ImageFormat;

pub trait Decoder: Send + Sync + std::fmt::Debug {
    /// Decodes `data` and writes the `crop` region of it, resized to
    /// `spec.width x spec.height` RGB, to `out` (`spec.bytes()` long).
    /// `crop.flipped` is the caller's to apply ([`decode_bounded`] does).
    fn decode_into(
        &self,
        format: ImageFormat,
        data: &[u8],
        spec: &OutputSpec,
        crop: &CropBox,
        out: &mut [u8],
    ) -> Result<(), DecodeError>;

    /// What decodes JPEGs, for logs, benchmarks and `Describe` (pixels from
    /// different decoders differ within the stated tolerances).
    fn name(&self) -> &'static str {
        "custom decoder"
    }
}

pub const IMAGE_CRATE_DECODER: &str = "image (zune-jpeg) + fast_image_resize";

/// The `image` crate's decoders (zune-jpeg, png, image-webp) with
/// fast_image_resize's SIMD convolution.
#[derive(Debug, Default, Clone, Copy)]
pub struct ImageCrateDecoder;

impl Decoder for ImageCrateDecoder {
    fn name(&self) -> &'static str {
        IMAGE_CRATE_DECODER
    }

    fn decode_into(
        &self,
        format: ImageFormat,
        data: &[u8],
        spec: &OutputSpec,
        crop: &CropBox,
        out: &mut [u8],
    ) -> Result<(), DecodeError> {
        let rgb = decode_rgb(format, data)?;
        let (width, height) = rgb.dimensions();
        resize_rgb(rgb.as_raw(), width, height, crop, spec, out)
    }
}

/// Full-size RGB8 decode with the `image` crate (grayscale, CMYK-converted,
/// 16-bit and alpha images all become RGB8), refusing decompression bombs
/// and JPEGs cut short (which zune-jpeg would fill in silently).
pub fn decode_rgb(format: ImageFormat, data: &[u8]) -> Result<image::RgbImage, DecodeError> {
    if format == ImageFormat::Jpeg {
        check_jpeg_complete(data)?;
        check_jpeg_tables(data)?;
    }
    let mut reader =
        image::ImageReader::with_format(std::io::Cursor::new(data), image_format(format));
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(MAX_SOURCE_PIXELS * 4);
    reader.limits(limits);
    let decoded = reader
        .decode()
        .map_err(|e| DecodeError::Corrupt(e.to_string()))?;
    let (width, height) = (decoded.width(), decoded.height());
    if u64::from(width) * u64::from(height) > MAX_SOURCE_PIXELS {
        return Err(DecodeError::TooLarge { width, height });
    }
    Ok(match decoded {
        image::DynamicImage::ImageRgb8(rgb) => rgb,
        other => other.to_rgb8(),
    })
}

pub(super) fn image_format(format: ImageFormat) -> image::ImageFormat {
    match format {
        ImageFormat::Jpeg => image::ImageFormat::Jpeg,
        ImageFormat::Png => image::ImageFormat::Png,
        ImageFormat::Webp => image::ImageFormat::WebP,
    }
}

thread_local! {
    // Resizers keep scratch buffers: one per decode thread, reused per image.
    static RESIZER: RefCell<fir::Resizer> = RefCell::new(fir::Resizer::new());
}

/// Resizes the `crop` region of packed RGB8 `src` into `out` per `spec`
/// (the spec's bilinear or bicubic convolution, which widens its support
/// when downscaling, so it antialiases; pixels just outside the box within
/// the image feed the filter at its edges, as in Pillow's
/// `resize(box=...)`).
pub fn resize_rgb(
    src: &[u8],
    width: u32,
    height: u32,
    crop: &CropBox,
    spec: &OutputSpec,
    out: &mut [u8],
) -> Result<(), DecodeError> {
    RESIZER.with(|resizer| {
        resize_with(
            &mut resizer.borrow_mut(),
            spec.resample.filter(),
            src,
            width,
            height,
            crop,
            spec,
            out,
        )
    })
}

/// Resizes with an explicit filter and resizer (the pipeline's path uses
/// [`resize_rgb`]; quality references use Lanczos3).
#[allow(clippy::too_many_arguments)]
pub fn resize_with(
    resizer: &mut fir::Resizer,
    filter: fir::FilterType,
    src: &[u8],
    width: u32,
    height: u32,
    crop: &CropBox,
    spec: &OutputSpec,
    out: &mut [u8],
) -> Result<(), DecodeError> {
    let resize_error = |e: &dyn std::fmt::Display| DecodeError::Resize(e.to_string());
    let source = fir::images::ImageRef::new(width, height, src, fir::PixelType::U8x3)
        .map_err(|e| resize_error(&e))?;
    let mut target = fir::images::Image::from_slice_u8(
        spec.width,
        spec.height,
        &mut out[..spec.bytes()],
        fir::PixelType::U8x3,
    )
    .map_err(|e| resize_error(&e))?;
    let options = fir::ResizeOptions::new()
        .resize_alg(fir::ResizeAlg::Convolution(filter))
        .crop(crop.left, crop.top, crop.width, crop.height);
    resizer
        .resize(&source, &mut target, &options)
        .map_err(|e| resize_error(&e))
}
