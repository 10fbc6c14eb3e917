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

use std::borrow::Cow;

use super::{decode_rgb, resize_rgb, CropBox, DecodeError, OutputSpec, Views, CHANNELS};
use crate::shard::ImageFormat;

/// How a stored source keeps its pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// Packed RGB8: no decode at all on a hit.
    Raw,
    /// Y, then U and V at half resolution each way (JPEG's full-range
    /// BT.601): half of raw's bytes, a colour conversion on a hit. (Here the
    /// whole source is converted, in scalar code: measured slower than a
    /// hit needs; resizing the planes first and converting only the output
    /// is the form's real cost, still to build.)
    Yuv420,
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
            SourceKind::Yuv420 => write!(f, "yuv420@{}", self.shorter_side),
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

/// Brings `data` to `form` through `decoder`'s own path (for libjpeg-turbo:
/// DCT scaling when the image is at least twice the stored size, then its
/// resize): as fast as today's evaluation decode, so a cold epoch costs
/// little more than today's. The tier's sources are made this way.
pub fn derive_source_with(
    decoder: &dyn super::Decoder,
    format: ImageFormat,
    data: &[u8],
    form: &SourceForm,
) -> Result<StoredSource, DecodeError> {
    let (original_width, original_height) = super::source_dimensions(format, data)?;
    let (width, height) = stored_size(original_width, original_height, form);
    let spec = OutputSpec {
        crop: super::Crop::Stretch,
        ..OutputSpec::center(height, width)
    };
    let whole = CropBox::whole(original_width, original_height);
    let mut pixels = vec![0u8; spec.bytes()];
    decoder.decode_into(format, data, &spec, &whole, &mut pixels)?;
    let bytes = match form.kind {
        SourceKind::Raw => pixels,
        SourceKind::Yuv420 => rgb_to_yuv420(&pixels, width, height),
        SourceKind::Jpeg { quality } => encode_jpeg(&pixels, width, height, quality)?,
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

fn encode_jpeg(
    pixels: &[u8],
    width: u32,
    height: u32,
    quality: u8,
) -> Result<Vec<u8>, DecodeError> {
    let mut jpeg = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, quality)
        .encode(pixels, width, height, image::ExtendedColorType::Rgb8)
        .map_err(|e| DecodeError::Resize(format!("encoding the stored source: {e}")))?;
    Ok(jpeg)
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
        drawn: crop.drawn,
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
    let pixels = source_rgb(source)?;
    output_from_pixels(source, &pixels, spec, crop, out)
}

/// Each view of a sample from its stored source, the source brought to
/// RGB once for all of them: view `i` is `views`' `i`-th spec cropped at
/// `crops[i]` (boxes in the original's coordinates, as for one output).
pub fn views_from_source(
    source: &StoredSource,
    views: &Views,
    crops: &[CropBox],
    outs: &mut [&mut [u8]],
) -> Result<(), DecodeError> {
    if crops.len() != outs.len() || crops.len() != views.count() {
        return Err(DecodeError::Resize(format!(
            "{} boxes and {} outputs for {} views",
            crops.len(),
            outs.len(),
            views.count()
        )));
    }
    let pixels = source_rgb(source)?;
    for ((spec, crop), out) in views.specs().zip(crops).zip(outs.iter_mut()) {
        output_from_pixels(source, &pixels, spec, crop, out)?;
    }
    Ok(())
}

/// A stored source's packed RGB: borrowed when kept raw, else converted.
fn source_rgb(source: &StoredSource) -> Result<Cow<'_, [u8]>, DecodeError> {
    let pixels = match source.kind {
        SourceKind::Raw => Cow::Borrowed(&source.bytes[..]),
        SourceKind::Yuv420 => {
            Cow::Owned(yuv420_to_rgb(&source.bytes, source.width, source.height)?)
        }
        SourceKind::Jpeg { .. } => {
            Cow::Owned(decode_rgb(ImageFormat::Jpeg, &source.bytes)?.into_raw())
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
    Ok(pixels)
}

fn output_from_pixels(
    source: &StoredSource,
    pixels: &[u8],
    spec: &OutputSpec,
    crop: &CropBox,
    out: &mut [u8],
) -> Result<(), DecodeError> {
    resize_rgb(
        pixels,
        source.width,
        source.height,
        &scaled_box(source, crop),
        spec,
        out,
    )?;
    spec.finish(crop, out);
    Ok(())
}

/// Planes of `width x height` in 4:2:0: Y, then U and V of
/// `ceil(width/2) x ceil(height/2)` (each the mean of its 2x2 block).
fn rgb_to_yuv420(rgb: &[u8], width: u32, height: u32) -> Vec<u8> {
    let (w, h) = (width as usize, height as usize);
    let (cw, ch) = (w.div_ceil(2), h.div_ceil(2));
    let mut out = vec![0u8; w * h + 2 * cw * ch];
    let (luma, chroma) = out.split_at_mut(w * h);
    let (u_plane, v_plane) = chroma.split_at_mut(cw * ch);
    let mut u_sum = vec![0f32; cw * ch];
    let mut v_sum = vec![0f32; cw * ch];
    let mut count = vec![0f32; cw * ch];
    for y in 0..h {
        for x in 0..w {
            let i = (y * w + x) * 3;
            let (r, g, b) = (
                f32::from(rgb[i]),
                f32::from(rgb[i + 1]),
                f32::from(rgb[i + 2]),
            );
            luma[y * w + x] = (0.299 * r + 0.587 * g + 0.114 * b)
                .round()
                .clamp(0.0, 255.0) as u8;
            let c = (y / 2) * cw + x / 2;
            u_sum[c] += -0.168_736 * r - 0.331_264 * g + 0.5 * b + 128.0;
            v_sum[c] += 0.5 * r - 0.418_688 * g - 0.081_312 * b + 128.0;
            count[c] += 1.0;
        }
    }
    for c in 0..cw * ch {
        u_plane[c] = (u_sum[c] / count[c]).round().clamp(0.0, 255.0) as u8;
        v_plane[c] = (v_sum[c] / count[c]).round().clamp(0.0, 255.0) as u8;
    }
    out
}

/// RGB8 of `width x height` from [`rgb_to_yuv420`]'s planes (chroma
/// repeated over its 2x2 block).
fn yuv420_to_rgb(planes: &[u8], width: u32, height: u32) -> Result<Vec<u8>, DecodeError> {
    let (w, h) = (width as usize, height as usize);
    let (cw, ch) = (w.div_ceil(2), h.div_ceil(2));
    if planes.len() != w * h + 2 * cw * ch {
        return Err(DecodeError::Resize(format!(
            "stored 4:2:0 source holds {} bytes, not {} for {width}x{height}",
            planes.len(),
            w * h + 2 * cw * ch
        )));
    }
    let (luma, chroma) = planes.split_at(w * h);
    let (u_plane, v_plane) = chroma.split_at(cw * ch);
    let mut rgb = vec![0u8; w * h * 3];
    for y in 0..h {
        for x in 0..w {
            let c = (y / 2) * cw + x / 2;
            let l = f32::from(luma[y * w + x]);
            let (u, v) = (f32::from(u_plane[c]) - 128.0, f32::from(v_plane[c]) - 128.0);
            let i = (y * w + x) * 3;
            rgb[i] = (l + 1.402 * v).round().clamp(0.0, 255.0) as u8;
            rgb[i + 1] = (l - 0.344_136 * u - 0.714_136 * v)
                .round()
                .clamp(0.0, 255.0) as u8;
            rgb[i + 2] = (l + 1.772 * u).round().clamp(0.0, 255.0) as u8;
        }
    }
    Ok(rgb)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{Crop, Decoder, HorizontalFlip, Ops, RandomResizedCrop, SampleKey};

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
        let source = derive_source_with(
            &crate::decode::ImageCrateDecoder,
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
        let scaled = scaled_box(&source, &CropBox::whole(500, 375));
        assert_eq!((scaled.width, scaled.height), (341.0, 256.0));
    }

    #[test]
    fn outputs_from_a_stored_source_are_close_to_full_resolution() {
        let jpeg = photo(500, 375);
        let spec = OutputSpec {
            crop: Crop::RandomResized(RandomResizedCrop::default()),
            ops: Ops::default().with(HorizontalFlip(0.5)),
            ..OutputSpec::center(224, 224)
        };
        let key = SampleKey {
            seed: 1,
            epoch: 2,
            sample: 3,
            copy: 0,
        };
        let crop = spec.crop_box(500, 375, &key);
        let mut today = vec![0u8; spec.bytes()];
        crate::decode::ImageCrateDecoder
            .decode_into(ImageFormat::Jpeg, &jpeg, &spec, &crop, &mut today)
            .unwrap();
        spec.finish(&crop, &mut today);
        for kind in [
            SourceKind::Raw,
            SourceKind::Yuv420,
            SourceKind::Jpeg { quality: 95 },
        ] {
            let form = SourceForm {
                shorter_side: 320,
                kind,
            };
            let source = derive_source_with(
                &crate::decode::ImageCrateDecoder,
                ImageFormat::Jpeg,
                &jpeg,
                &form,
            )
            .unwrap();
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

    /// Each view from the source is the output one spec of it would be:
    /// the source is brought to RGB once, in every stored form.
    #[test]
    fn each_view_from_a_source_is_its_own_output() {
        let jpeg = photo(300, 200);
        let train = |side| OutputSpec {
            crop: Crop::RandomResized(RandomResizedCrop::default()),
            ops: Ops::default().with(HorizontalFlip(0.5)),
            ..OutputSpec::center(side, side)
        };
        let views = Views {
            groups: vec![
                crate::decode::ViewGroup {
                    views: vec![train(32), OutputSpec::center(32, 32)],
                },
                crate::decode::ViewGroup::repeated(3, train(16)),
            ],
        };
        let key = SampleKey {
            seed: 3,
            epoch: 1,
            sample: 9,
            copy: 0,
        };
        for kind in [
            SourceKind::Raw,
            SourceKind::Yuv420,
            SourceKind::Jpeg { quality: 90 },
        ] {
            let form = SourceForm {
                shorter_side: 100,
                kind,
            };
            let decoder = crate::decode::ImageCrateDecoder;
            let source = derive_source_with(&decoder, ImageFormat::Jpeg, &jpeg, &form).unwrap();
            let boxes = views.plan(300, 200, &key).boxes;
            let mut bytes: Vec<Vec<u8>> = views.specs().map(|s| vec![0; s.bytes()]).collect();
            let mut outs: Vec<&mut [u8]> = bytes.iter_mut().map(Vec::as_mut_slice).collect();
            assert!(views_from_source(&source, &views, &boxes[1..], &mut outs).is_err());
            views_from_source(&source, &views, &boxes, &mut outs).unwrap();
            for ((spec, crop), got) in views.specs().zip(&boxes).zip(&bytes) {
                let mut one = vec![0; spec.bytes()];
                output_from_source(&source, spec, crop, &mut one).unwrap();
                assert_eq!(&one, got, "{kind:?}");
            }
        }
    }

    #[test]
    fn yuv420_keeps_half_the_bytes_and_round_trips_odd_sizes() {
        let (width, height) = (7u32, 5u32);
        // Saturated colours, constant over each 2x2 block (the last column
        // and row are half blocks): 4:2:0 then loses nothing but rounding.
        let palette = [
            [230u8, 20, 30],
            [20, 200, 40],
            [30, 40, 220],
            [240, 230, 20],
        ];
        let rgb: Vec<u8> = (0..width * height)
            .flat_map(|i| {
                let (x, y) = (i % width, i / width);
                palette[((x / 2 + y / 2) % 4) as usize]
            })
            .collect();
        let planes = rgb_to_yuv420(&rgb, width, height);
        assert_eq!(planes.len(), 7 * 5 + 2 * 4 * 3);
        let back = yuv420_to_rgb(&planes, width, height).unwrap();
        let worst = back.iter().zip(&rgb).map(|(a, b)| a.abs_diff(*b)).max();
        assert!(worst <= Some(2), "{worst:?}");
        assert!(yuv420_to_rgb(&planes[1..], width, height).is_err());
    }
}
