//! The decoder seam and its portable implementation: the `image` crate's
//! decoders with fast_image_resize's convolution, which every other decoder
//! falls back to (and is measured against).

use std::cell::RefCell;

use fast_image_resize as fir;

use super::augment::{Crop, CropBox, Ops, OutputSpec, Resample};
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

    /// Decodes `data` once and writes each view's box, resized to its
    /// spec, to its output (the views' ops are the caller's to run). The
    /// default decodes the whole image; a decoder that can decode a region
    /// decodes one covering every box ([`covering`]).
    fn decode_views_into(
        &self,
        format: ImageFormat,
        data: &[u8],
        views: &mut [ViewOut<'_>],
    ) -> Result<(), DecodeError> {
        decode_views_whole(format, data, views)
    }

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

/// One view to make: its spec, its decided box, and where its pixels go
/// (`spec.bytes()` long).
pub struct ViewOut<'a> {
    pub spec: &'a OutputSpec,
    pub crop: &'a CropBox,
    pub out: &'a mut [u8],
}

impl<'a> ViewOut<'a> {
    /// Views' specs, boxes and outputs paired in order.
    pub fn paired(
        specs: impl IntoIterator<Item = &'a OutputSpec>,
        boxes: &'a [CropBox],
        outs: impl IntoIterator<Item = &'a mut [u8]>,
    ) -> Vec<Self> {
        specs
            .into_iter()
            .zip(boxes)
            .zip(outs)
            .map(|((spec, crop), out)| ViewOut { spec, crop, out })
            .collect()
    }
}

/// Every view resized from one full-size decode: the portable path, and
/// the fallback of decoders that can decode a region.
pub fn decode_views_whole(
    format: ImageFormat,
    data: &[u8],
    views: &mut [ViewOut<'_>],
) -> Result<(), DecodeError> {
    let rgb = decode_rgb(format, data)?;
    let (width, height) = rgb.dimensions();
    for view in views.iter_mut() {
        resize_rgb(rgb.as_raw(), width, height, view.crop, view.spec, view.out)?;
    }
    Ok(())
}

/// The one box a region decode covers for `views`, and a spec whose size
/// asks of it what the most demanding view asks of its own box: the union
/// of the boxes, widened by the largest resize filter's reach (a view
/// downscaled `r` times reads `r × support` source pixels past its edges;
/// a scaled pixel's rounding adds at most 8), so each view's resize sees
/// the pixels it would in a decode of the whole image at that scale.
pub fn covering(views: &[ViewOut<'_>]) -> (CropBox, OutputSpec) {
    let (mut left, mut top) = (f64::INFINITY, f64::INFINITY);
    let (mut right, mut bottom) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    let (mut need, mut reach) = (0.0f64, 0.0f64);
    let mut resample = Resample::Bilinear;
    for view in views {
        let crop = view.crop;
        left = left.min(crop.left);
        top = top.min(crop.top);
        right = right.max(crop.left + crop.width);
        bottom = bottom.max(crop.top + crop.height);
        let ratio = (crop.width / f64::from(view.spec.width))
            .max(crop.height / f64::from(view.spec.height));
        need = need.max(
            (f64::from(view.spec.width) / crop.width)
                .max(f64::from(view.spec.height) / crop.height),
        );
        reach = reach.max(ratio.max(1.0) * view.spec.resample.support());
        if view.spec.resample.support() > resample.support() {
            resample = view.spec.resample;
        }
    }
    let margin = reach.ceil() + 9.0;
    let cover = CropBox {
        left: left - margin,
        top: top - margin,
        width: right - left + 2.0 * margin,
        height: bottom - top + 2.0 * margin,
        drawn: Default::default(),
    };
    let side = |length: f64| ((length * need).ceil() as u32).max(1);
    let spec = OutputSpec {
        height: side(cover.height),
        width: side(cover.width),
        crop: Crop::Stretch,
        resample,
        ops: Ops::NONE,
    };
    (cover, spec)
}
