//! Stored source forms for the decoded-source tier (issue 25): an image
//! brought once to a reduced size and kept in a cheap-to-read form, and the
//! output derived from that form.
//!
//! The crop box is still drawn from (seed, epoch, sample) in the *original*
//! image's coordinates (so the augmentation is the same whatever is
//! stored), then scaled into the stored source, cropped, resized and
//! flipped. With the tier on, the output is defined from the stored source:
//! a miss derives the source and crops from it exactly as a hit does, so a
//! batch is the same bytes whatever the cache holds.

use fast_image_resize as fir;

use super::augment::flip_rows;
use super::{decode_rgb, resize_rgb, resize_with, CropBox, DecodeError, OutputSpec, CHANNELS};
use crate::shard::ImageFormat;

/// How a stored source keeps its pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// Packed RGB8: no decode at all on a hit.
    Raw,
    /// A baseline JPEG of this quality (4:2:0): smaller, decoded on a hit.
    Jpeg { quality: u8 },
}

/// A stored source form: the image's shorter side brought to at most
/// `shorter_side` (never upscaled), kept as `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceForm {
    pub shorter_side: u32,
    pub kind: SourceKind,
}

impl std::fmt::Display for SourceForm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            SourceKind::Raw => write!(f, "raw@{}", self.shorter_side),
            SourceKind::Jpeg { quality } => write!(f, "jpeg{quality}@{}", self.shorter_side),
        }
    }
}

/// One image in its stored form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSource {
    pub kind: SourceKind,
    /// The stored pixels' size.
    pub width: u32,
    pub height: u32,
    /// The original image's size: crop boxes are drawn in it.
    pub original_width: u32,
    pub original_height: u32,
    pub bytes: Vec<u8>,
}

/// The size an image of `width x height` is stored at under `form`.
pub fn stored_size(width: u32, height: u32, form: &SourceForm) -> (u32, u32) {
    let shorter = width.min(height);
    if shorter <= form.shorter_side {
        return (width, height);
    }
    let scale = |side: u32| -> u32 {
        ((u64::from(side) * u64::from(form.shorter_side) + u64::from(shorter) / 2)
            / u64::from(shorter))
        .max(1) as u32
    };
    (scale(width), scale(height))
}

/// Decodes `data` at full size and brings it to `form`. The reduction uses
/// Lanczos3 (once per image, so the better filter is affordable).
pub fn derive_source(
    format: ImageFormat,
    data: &[u8],
    form: &SourceForm,
) -> Result<StoredSource, DecodeError> {
    let rgb = decode_rgb(format, data)?;
    let (original_width, original_height) = rgb.dimensions();
    let (width, height) = stored_size(original_width, original_height, form);
    let pixels = if (width, height) == (original_width, original_height) {
        rgb.into_raw()
    } else {
        let spec = OutputSpec {
            crop: super::Crop::Stretch,
            ..OutputSpec::center(height, width)
        };
        let whole = CropBox {
            left: 0.0,
            top: 0.0,
            width: f64::from(original_width),
            height: f64::from(original_height),
            flipped: false,
        };
        let mut out = vec![0u8; spec.bytes()];
        resize_with(
            &mut fir::Resizer::new(),
            fir::FilterType::Lanczos3,
            rgb.as_raw(),
            original_width,
            original_height,
            &whole,
            &spec,
            &mut out,
        )?;
        out
    };
    let bytes = match form.kind {
        SourceKind::Raw => pixels,
        SourceKind::Jpeg { quality } => {
            let mut jpeg = Vec::new();
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, quality)
                .encode(&pixels, width, height, image::ExtendedColorType::Rgb8)
                .map_err(|e| DecodeError::Resize(format!("encoding the stored source: {e}")))?;
            jpeg
        }
    };
    Ok(StoredSource {
        kind: form.kind,
        width,
        height,
        original_width,
        original_height,
        bytes,
    })
}

/// `crop` (in the original image's pixels) scaled into the stored source.
pub fn scaled_box(source: &StoredSource, crop: &CropBox) -> CropBox {
    let sx = f64::from(source.width) / f64::from(source.original_width);
    let sy = f64::from(source.height) / f64::from(source.original_height);
    CropBox {
        left: crop.left * sx,
        top: crop.top * sy,
        width: (crop.width * sx).min(f64::from(source.width) - crop.left * sx),
        height: (crop.height * sy).min(f64::from(source.height) - crop.top * sy),
        flipped: crop.flipped,
    }
}

/// The output of one sample from its stored source: `crop` is the sample's
/// box in the original image ([`OutputSpec::crop_box`] of the original
/// size), scaled into the source, resized to `spec` and flipped.
pub fn output_from_source(
    source: &StoredSource,
    spec: &OutputSpec,
    crop: &CropBox,
    out: &mut [u8],
) -> Result<(), DecodeError> {
    let decoded;
    let pixels: &[u8] = match source.kind {
        SourceKind::Raw => &source.bytes,
        SourceKind::Jpeg { .. } => {
            decoded = decode_rgb(ImageFormat::Jpeg, &source.bytes)?;
            decoded.as_raw()
        }
    };
    let expected = source.width as usize * source.height as usize * CHANNELS;
    if pixels.len() != expected {
        return Err(DecodeError::Resize(format!(
            "stored source holds {} bytes, not {expected} for {}x{}",
            pixels.len(),
            source.width,
            source.height
        )));
    }
    resize_rgb(
        pixels,
        source.width,
        source.height,
        &scaled_box(source, crop),
        spec,
        out,
    )?;
    if crop.flipped {
        flip_rows(&mut out[..spec.bytes()], spec.width);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{Crop, Decoder, RandomResizedCrop, SampleKey};

    fn photo(width: u32, height: u32) -> Vec<u8> {
        let pixels: Vec<u8> = (0..width * height)
            .flat_map(|i| {
                let (x, y) = (i % width, i / width);
                [
                    (x * 255 / width) as u8,
                    (y * 255 / height) as u8,
                    ((x + y) % 256) as u8,
                ]
            })
            .collect();
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90)
            .encode(&pixels, width, height, image::ExtendedColorType::Rgb8)
            .unwrap();
        jpeg
    }

    #[test]
    fn stored_sizes_keep_the_aspect_and_never_upscale() {
        let form = SourceForm {
            shorter_side: 256,
            kind: SourceKind::Raw,
        };
        assert_eq!(stored_size(500, 375, &form), (341, 256));
        assert_eq!(stored_size(375, 500, &form), (256, 341));
        assert_eq!(stored_size(200, 300, &form), (200, 300));
    }

    #[test]
    fn a_box_in_the_original_lands_on_the_same_part_of_the_source() {
        let source = derive_source(
            ImageFormat::Jpeg,
            &photo(500, 375),
            &SourceForm {
                shorter_side: 256,
                kind: SourceKind::Raw,
            },
        )
        .unwrap();
        assert_eq!((source.width, source.height), (341, 256));
        assert_eq!(source.bytes.len(), 341 * 256 * 3);
        let whole = CropBox {
            left: 0.0,
            top: 0.0,
            width: 500.0,
            height: 375.0,
            flipped: false,
        };
        let scaled = scaled_box(&source, &whole);
        assert_eq!((scaled.width, scaled.height), (341.0, 256.0));
    }

    #[test]
    fn outputs_from_a_stored_source_are_close_to_full_resolution() {
        let jpeg = photo(500, 375);
        let spec = OutputSpec {
            crop: Crop::RandomResized(RandomResizedCrop::default()),
            flip: 0.5,
            ..OutputSpec::center(224, 224)
        };
        let key = SampleKey {
            seed: 1,
            epoch: 2,
            sample: 3,
        };
        let crop = spec.crop_box(500, 375, &key);
        let mut today = vec![0u8; spec.bytes()];
        crate::decode::ImageCrateDecoder
            .decode_into(ImageFormat::Jpeg, &jpeg, &spec, &crop, &mut today)
            .unwrap();
        if crop.flipped {
            flip_rows(&mut today, spec.width);
        }
        for kind in [SourceKind::Raw, SourceKind::Jpeg { quality: 95 }] {
            let form = SourceForm {
                shorter_side: 320,
                kind,
            };
            let source = derive_source(ImageFormat::Jpeg, &jpeg, &form).unwrap();
            let mut out = vec![0u8; spec.bytes()];
            output_from_source(&source, &spec, &crop, &mut out).unwrap();
            let psnr = crate::decode::psnr(&out, &today);
            assert!(psnr > 30.0, "{form}: {psnr:.1} dB");
            // The same bytes every time: a hit equals a miss.
            let mut again = vec![0u8; spec.bytes()];
            output_from_source(&source, &spec, &crop, &mut again).unwrap();
            assert_eq!(out, again);
        }
    }
}
