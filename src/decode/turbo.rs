//! The fast JPEG path: libjpeg-turbo 3 decoding only the region the output
//! needs, at the smallest DCT scale that still covers it.
//!
//! A JPEG can be decoded at 1/8, 2/8, ... 8/8 of its size for a fraction of
//! the full cost, and TurboJPEG 3 can decode a region: columns outside it
//! (from the iMCU column that holds its left edge) skip the inverse DCT,
//! chroma upsampling and color conversion, rows above it are only
//! entropy-decoded, and decoding stops after its last row. We decode the
//! sample's crop box plus the few pixels the resize filter reads around it,
//! at the smallest scale whose box still covers the output (the final
//! resize only ever shrinks, so quality is kept), then resize with
//! fast_image_resize. Anything libjpeg-turbo cannot decode to RGB (e.g.
//! CMYK) falls back to the `image` crate.
//!
//! The bindings are turbojpeg-sys's: the safe `turbojpeg` crate has no
//! cropping region.

use std::cell::RefCell;
use std::ffi::CStr;

use turbojpeg_sys as tj;

use super::augment::{CropBox, OutputSpec};
use super::decoder::{covering, decode_views_whole, ViewOut};
use super::decoder::{resize_rgb, Decoder, ImageCrateDecoder};
use super::error::{DecodeError, MAX_SOURCE_PIXELS};
use super::jpeg::JpegTables;
use crate::shard::ImageFormat;

/// Progressive JPEGs with more scans than this are refused: each scan is a
/// pass over the whole image, and crafted files use thousands.
const MAX_SCANS: i32 = 500;

/// iMCU width in pixels per TurboJPEG subsampling (`TJSAMP_444` ... `_441`),
/// as `turbojpeg.h`'s `tjMCUWidth`, which is a header-only table.
const MCU_WIDTH: [u32; 7] = [8, 16, 16, 8, 8, 32, 8];

/// One TurboJPEG decompressor instance.
struct Handle(tj::tjhandle);

impl Handle {
    fn new() -> Result<Self, DecodeError> {
        // SAFETY: plain constructor; a null handle is checked below.
        let handle = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_DECOMPRESS as i32) };
        if handle.is_null() {
            return Err(DecodeError::Corrupt(
                "libjpeg-turbo could not start a decompressor".into(),
            ));
        }
        let this = Self(handle);
        this.set(tj::TJPARAM_TJPARAM_SCANLIMIT, MAX_SCANS)?;
        this.set(tj::TJPARAM_TJPARAM_MAXPIXELS, MAX_SOURCE_PIXELS as i32)?;
        Ok(this)
    }

    fn error(&self) -> DecodeError {
        // SAFETY: the handle is live; the string is owned by it and copied here.
        let message = unsafe { CStr::from_ptr(tj::tj3GetErrorStr(self.0)) };
        DecodeError::Corrupt(message.to_string_lossy().into_owned())
    }

    fn check(&self, status: i32) -> Result<(), DecodeError> {
        if status == 0 {
            Ok(())
        } else {
            Err(self.error())
        }
    }

    fn set(&self, param: tj::TJPARAM, value: i32) -> Result<(), DecodeError> {
        // SAFETY: the handle is live; unknown parameters are reported as errors.
        self.check(unsafe { tj::tj3Set(self.0, param as i32, value) })
    }

    fn get(&self, param: tj::TJPARAM) -> i32 {
        // SAFETY: the handle is live.
        unsafe { tj::tj3Get(self.0, param as i32) }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle is live and dropped once.
        unsafe { tj::tj3Destroy(self.0) }
    }
}

thread_local! {
    // One decompressor and one scratch buffer per decode thread, reused for
    // every image: no per-sample allocation on this path.
    static STATE: RefCell<Option<(Handle, Vec<u8>)>> = const { RefCell::new(None) };
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

/// A DCT scale `num / 8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scale(pub u32);

impl Scale {
    /// TurboJPEG's `TJSCALED`: the scaled size of `dimension`, rounded up.
    pub fn apply(self, dimension: u32) -> u32 {
        (dimension * self.0).div_ceil(8)
    }

    /// A coordinate of the original image in the scaled one. The factor is
    /// exactly `num / 8` (each 8-pixel block becomes `num` pixels), not the
    /// ratio of the sizes: [`Self::apply`] rounds the last partial block
    /// up, and a box mapped by that ratio drifts by up to a pixel across
    /// the image, which on fine texture costs several dB.
    fn map(self, coordinate: f64) -> f64 {
        coordinate * f64::from(self.0) / 8.0
    }

    fn lowest_terms(self) -> tj::tjscalingfactor {
        let common = [8, 4, 2, 1]
            .into_iter()
            .find(|d| self.0.is_multiple_of(*d))
            .unwrap_or(1);
        tj::tjscalingfactor {
            num: (self.0 / common) as i32,
            denom: (8 / common) as i32,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct TurboJpegDecoder {
    pub factors: ScaleFactors,
    /// Decode only the crop box's region (off: the whole image, then crop
    /// while resizing; kept to measure against).
    pub region: bool,
    /// libjpeg-turbo's nearest-neighbour chroma upsampling instead of its
    /// smooth ("fancy") one.
    pub fast_upsample: bool,
    /// libjpeg-turbo's fast integer IDCT instead of the accurate one.
    pub fast_dct: bool,
}

impl Default for TurboJpegDecoder {
    fn default() -> Self {
        Self {
            factors: ScaleFactors::default(),
            region: true,
            fast_upsample: false,
            fast_dct: false,
        }
    }
}

/// The smallest allowed scale at which `crop` still covers the output.
pub fn dct_scale(crop: &CropBox, spec: &OutputSpec, factors: ScaleFactors) -> Scale {
    let need = (f64::from(spec.width) / crop.width).max(f64::from(spec.height) / crop.height);
    let allowed: &[u32] = match factors {
        ScaleFactors::PowersOfTwo => &[1, 2, 4, 8],
        ScaleFactors::AnyEighth => &[1, 2, 3, 4, 5, 6, 7, 8],
        ScaleFactors::None => &[8],
    };
    allowed
        .iter()
        .map(|&num| Scale(num))
        .find(|scale| f64::from(scale.0) / 8.0 >= need)
        .unwrap_or(Scale(8))
}

/// The pixel rectangle of the scaled image to decode for `crop`, and the
/// box within it: the box plus the pixels the resize filter reads around
/// it, its left edge moved back to an iMCU column boundary (`align`).
fn decode_region(
    crop: &CropBox,
    spec: &OutputSpec,
    scale: Scale,
    scaled: (u32, u32),
    align: u32,
) -> (tj::tjregion, CropBox) {
    let (left, top) = (scale.map(crop.left), scale.map(crop.top));
    let (width, height) = (scale.map(crop.width), scale.map(crop.height));
    // The filter's support (1 bilinear, 2 bicubic) grows with the
    // downscale ratio.
    let margin = ((width / f64::from(spec.width))
        .max(height / f64::from(spec.height))
        .max(1.0)
        * spec.resample.support())
    .ceil()
        + 1.0;
    let clamp = |value: f64, end: u32| value.clamp(0.0, f64::from(end)) as u32;
    let mut x0 = clamp((left - margin).floor(), scaled.0);
    x0 -= x0 % align.max(1);
    let x1 = clamp((left + width + margin).ceil(), scaled.0).max(x0 + 1);
    let y0 = clamp((top - margin).floor(), scaled.1);
    let y1 = clamp((top + height + margin).ceil(), scaled.1).max(y0 + 1);
    let region = tj::tjregion {
        x: x0 as i32,
        y: y0 as i32,
        w: (x1 - x0) as i32,
        h: (y1 - y0) as i32,
    };
    let inner_left = left - f64::from(x0);
    let inner_top = top - f64::from(y0);
    let inner = CropBox {
        left: inner_left,
        top: inner_top,
        width: width.min(f64::from(x1 - x0) - inner_left),
        height: height.min(f64::from(y1 - y0) - inner_top),
        drawn: crop.drawn,
    };
    (region, inner)
}

impl TurboJpegDecoder {
    fn decode_jpeg(
        &self,
        data: &[u8],
        spec: &OutputSpec,
        crop: &CropBox,
        out: &mut [u8],
    ) -> Result<(), DecodeError> {
        self.with_region(data, spec, crop, |region, map| {
            resize_rgb(region, map.width, map.height, &map.inner(crop), spec, out)
        })
    }

    /// Decodes the region [`Decoder::decode_into`] would and drops it: the
    /// kernel benchmark's ceiling for any resize (`examples/decode_kernels`).
    #[cfg(feature = "dev")]
    pub fn decode_region_only(
        &self,
        data: &[u8],
        spec: &OutputSpec,
        crop: &CropBox,
    ) -> Result<(), DecodeError> {
        self.with_region(data, spec, crop, |_, _| Ok(()))
    }

    /// Decodes `crop`'s region of the JPEG `data` (plus the resize filter's
    /// margin) at the smallest scale that covers `spec`, into this thread's
    /// scratch, and hands `then` its RGB rows and where they lie.
    fn with_region<T>(
        &self,
        data: &[u8],
        spec: &OutputSpec,
        crop: &CropBox,
        then: impl FnOnce(&[u8], &RegionMap) -> Result<T, DecodeError>,
    ) -> Result<T, DecodeError> {
        STATE.with(|state| {
            let mut state = state.borrow_mut();
            if state.is_none() {
                *state = Some((Handle::new()?, Vec::new()));
            }
            let Some((handle, scratch)) = state.as_mut() else {
                return Err(DecodeError::Corrupt("no decompressor".into()));
            };
            // SAFETY: `data` outlives the call; the handle is live.
            handle.check(unsafe {
                tj::tj3DecompressHeader(handle.0, data.as_ptr(), data.len() as tj::size_t)
            })?;
            let width = handle.get(tj::TJPARAM_TJPARAM_JPEGWIDTH).max(0) as u32;
            let height = handle.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT).max(0) as u32;
            if u64::from(width) * u64::from(height) > MAX_SOURCE_PIXELS {
                return Err(DecodeError::TooLarge { width, height });
            }
            let subsamp = handle.get(tj::TJPARAM_TJPARAM_SUBSAMP);
            handle.set(
                tj::TJPARAM_TJPARAM_FASTUPSAMPLE,
                i32::from(self.fast_upsample),
            )?;
            handle.set(tj::TJPARAM_TJPARAM_FASTDCT, i32::from(self.fast_dct))?;
            let scale = dct_scale(crop, spec, self.factors);
            // SAFETY: the handle is live; the factor is one of TurboJPEG's
            // (which it only recognizes in lowest terms).
            handle.check(unsafe { tj::tj3SetScalingFactor(handle.0, scale.lowest_terms()) })?;
            let scaled = (scale.apply(width), scale.apply(height));
            let region = match usize::try_from(subsamp) {
                Ok(index) if self.region && index < MCU_WIDTH.len() => {
                    let align = scale.apply(MCU_WIDTH[index]);
                    decode_region(crop, spec, scale, scaled, align).0
                }
                // Unknown subsampling cannot be cropped: decode it all.
                _ => tj::tjregion {
                    x: 0,
                    y: 0,
                    w: scaled.0 as i32,
                    h: scaled.1 as i32,
                },
            };
            let whole = region.x == 0
                && region.y == 0
                && region.w as u32 == scaled.0
                && region.h as u32 == scaled.1;
            let requested = if whole {
                tj::tjregion {
                    x: 0,
                    y: 0,
                    w: 0,
                    h: 0,
                }
            } else {
                region
            };
            // SAFETY: the handle is live and has read this image's header.
            handle.check(unsafe { tj::tj3SetCroppingRegion(handle.0, requested) })?;
            let (region_w, region_h) = (region.w as usize, region.h as usize);
            scratch.resize(region_w * region_h * 3, 0);
            // SAFETY: `scratch` holds `region_h` rows of `region_w * 3`
            // bytes, exactly what TurboJPEG writes for this cropping region
            // (or the whole scaled image when uncropped).
            handle.check(unsafe {
                tj::tj3Decompress8(
                    handle.0,
                    data.as_ptr(),
                    data.len() as tj::size_t,
                    scratch.as_mut_ptr(),
                    (region_w * 3) as i32,
                    tj::TJPF_TJPF_RGB,
                )
            })?;
            let map = RegionMap {
                scale,
                x0: f64::from(region.x),
                y0: f64::from(region.y),
                width: region_w as u32,
                height: region_h as u32,
            };
            then(scratch, &map)
        })
    }
}

/// Where a decoded region lies in the source: its scale and its first
/// pixel in the scaled image, and its size.
struct RegionMap {
    scale: Scale,
    x0: f64,
    y0: f64,
    width: u32,
    height: u32,
}

impl RegionMap {
    /// `crop` in the region's pixels, cut at the region's edges.
    fn inner(&self, crop: &CropBox) -> CropBox {
        let left = self.scale.map(crop.left) - self.x0;
        let top = self.scale.map(crop.top) - self.y0;
        CropBox {
            left,
            top,
            width: self.scale.map(crop.width).min(f64::from(self.width) - left),
            height: self
                .scale
                .map(crop.height)
                .min(f64::from(self.height) - top),
            drawn: crop.drawn,
        }
    }
}

impl TurboJpegDecoder {
    /// Every view from one region decode covering all their boxes.
    fn decode_jpeg_views(&self, data: &[u8], views: &mut [ViewOut<'_>]) -> Result<(), DecodeError> {
        let (cover, cover_spec) = covering(views);
        self.with_region(data, &cover_spec, &cover, |region, map| {
            for view in views.iter_mut() {
                let inner = map.inner(view.crop);
                resize_rgb(region, map.width, map.height, &inner, view.spec, view.out)?;
            }
            Ok(())
        })
    }
}

impl Decoder for TurboJpegDecoder {
    fn name(&self) -> &'static str {
        "libjpeg-turbo (crop region, DCT scaling) + fast_image_resize"
    }

    fn decode_into(
        &self,
        format: ImageFormat,
        data: &[u8],
        spec: &OutputSpec,
        crop: &CropBox,
        out: &mut [u8],
    ) -> Result<(), DecodeError> {
        if format != ImageFormat::Jpeg {
            return ImageCrateDecoder.decode_into(format, data, spec, crop, out);
        }
        // A file cut short is corrupt for either decoder: the other one would
        // fill the missing rows in.
        super::jpeg::check_jpeg_complete(data)?;
        if super::jpeg::check_jpeg_tables(data)? == JpegTables::DefaultHuffman {
            // A reused handle would apply the last image's Huffman tables,
            // not the standard ones: the image crate decodes it afresh.
            return ImageCrateDecoder.decode_into(format, data, spec, crop, out);
        }
        match self.decode_jpeg(data, spec, crop, out) {
            Ok(()) => Ok(()),
            Err(error) if error_is_data(&error) => Err(error),
            // CMYK, unusual sampling: a format libjpeg-turbo cannot take; the
            // other decoder decides.
            Err(_) => ImageCrateDecoder.decode_into(format, data, spec, crop, out),
        }
    }

    fn decode_views_into(
        &self,
        format: ImageFormat,
        data: &[u8],
        views: &mut [ViewOut<'_>],
    ) -> Result<(), DecodeError> {
        // As `decode_into`: what libjpeg-turbo cannot take, or must not
        // with a reused handle, the whole-image path decodes.
        if format != ImageFormat::Jpeg {
            return decode_views_whole(format, data, views);
        }
        super::jpeg::check_jpeg_complete(data)?;
        if super::jpeg::check_jpeg_tables(data)? == JpegTables::DefaultHuffman {
            return decode_views_whole(format, data, views);
        }
        match self.decode_jpeg_views(data, views) {
            Ok(()) => Ok(()),
            Err(error) if error_is_data(&error) => Err(error),
            Err(_) => decode_views_whole(format, data, views),
        }
    }
}

/// Whether libjpeg-turbo's error is about the data (a pixel limit, or a
/// warning such as corrupt entropy data or extraneous bytes), not about a
/// format it cannot take: those are corrupt samples, not for the lenient
/// fallback.
fn error_is_data(error: &DecodeError) -> bool {
    match error {
        DecodeError::TooLarge { .. } => true,
        DecodeError::Corrupt(message) => DATA_ERRORS.iter().any(|m| message.contains(m)),
        _ => false,
    }
}

/// libjpeg's messages (jerror.h) for damaged data, as TurboJPEG reports them.
const DATA_ERRORS: &[&str] = &[
    "Premature end",
    "Corrupt JPEG data",
    "Huffman table",
    "Bogus",
    "Invalid JPEG file structure",
    "extraneous bytes",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{Crop, Drawn, RandomResizedCrop, SampleKey};

    fn center_box(width: u32, height: u32, spec: &OutputSpec) -> CropBox {
        spec.crop_box(
            width,
            height,
            &SampleKey {
                seed: 0,
                epoch: 0,
                sample: 0,
                copy: 0,
            },
        )
    }

    #[test]
    fn picks_the_smallest_scale_that_covers_the_output() {
        let spec = OutputSpec::center(224, 224);
        let any = ScaleFactors::AnyEighth;
        let pow2 = ScaleFactors::PowersOfTwo;
        // 500x375: crop 375x375 -> needs 224/375 = 0.597 -> 5/8, or 1 in powers of two.
        let photo = center_box(500, 375, &spec);
        assert_eq!(dct_scale(&photo, &spec, any), Scale(5));
        assert_eq!(dct_scale(&photo, &spec, pow2), Scale(8));
        // 2000x1500: needs 0.149 -> 2/8 = 1/4.
        let large = center_box(2000, 1500, &spec);
        assert_eq!(dct_scale(&large, &spec, any), Scale(2));
        assert_eq!(dct_scale(&large, &spec, pow2), Scale(2));
        // Smaller than the output: full size.
        assert_eq!(
            dct_scale(&center_box(100, 100, &spec), &spec, any),
            Scale(8)
        );
    }

    #[test]
    fn the_region_covers_the_box_and_its_filter_margin() {
        let spec = OutputSpec::center(224, 224);
        let crop = CropBox {
            left: 100.3,
            top: 50.5,
            width: 300.0,
            height: 200.0,
            drawn: Drawn::default(),
        };
        let (region, inner) = decode_region(&crop, &spec, Scale(8), (1000, 800), 16);
        assert_eq!(region.x % 16, 0);
        assert!(region.x as f64 <= 100.3 - 2.0 && region.y as f64 <= 50.5 - 2.0);
        assert!(f64::from(region.x + region.w) >= 400.3 + 2.0);
        assert!(f64::from(region.y + region.h) >= 250.5 + 2.0);
        assert!((inner.left + f64::from(region.x) - 100.3).abs() < 1e-9);
        assert_eq!((inner.width, inner.height), (300.0, 200.0));
        // At the image's edges the region stops there.
        let edge = CropBox {
            left: 0.0,
            top: 0.0,
            width: 1000.0,
            height: 800.0,
            drawn: Drawn::default(),
        };
        let (region, _) = decode_region(&edge, &spec, Scale(4), (500, 400), 8);
        assert_eq!((region.x, region.y, region.w, region.h), (0, 0, 500, 400));
        // Bicubic reads twice as far: 300 source px to 224 is a ratio of
        // 1.34, so the cubic reads 2.68 px past each side.
        let bicubic = OutputSpec {
            resample: crate::decode::Resample::Bicubic,
            ..spec
        };
        let (region, _) = decode_region(&crop, &bicubic, Scale(8), (1000, 800), 1);
        assert!(f64::from(region.x) <= 100.3 - 2.68 && f64::from(region.y) <= 50.5 - 2.68);
        assert!(f64::from(region.x + region.w) >= 400.3 + 2.68);
        assert!(f64::from(region.y + region.h) >= 250.5 + 2.68);
    }

    #[cfg(feature = "dev")]
    #[test]
    fn region_decodes_match_a_full_decode_of_the_same_box() {
        use crate::dev::kernel::psnr;
        let (_, jpeg) = synthetic_photo(3, 3, 640, 480);
        let train = OutputSpec {
            crop: Crop::RandomResized(RandomResizedCrop::default()),
            ..OutputSpec::center(224, 224)
        };
        let resample = |i: u64| {
            if i % 2 == 1 {
                crate::decode::Resample::Bicubic
            } else {
                crate::decode::Resample::Bilinear
            }
        };
        for (sample, spec) in (0..12u64).map(|i| {
            let spec = if i < 2 {
                OutputSpec::center(224, 224)
            } else {
                train
            };
            (
                i,
                OutputSpec {
                    resample: resample(i),
                    ..spec
                },
            )
        }) {
            let crop = spec.crop_box(
                640,
                480,
                &SampleKey {
                    seed: 1,
                    epoch: 0,
                    sample,
                    copy: 0,
                },
            );
            let mut region = vec![0u8; spec.bytes()];
            let mut whole = vec![0u8; spec.bytes()];
            let mut reference = vec![0u8; spec.bytes()];
            let decoder = TurboJpegDecoder::default();
            // `decode_jpeg`: no fallback to the other decoder.
            decoder
                .decode_jpeg(&jpeg, &spec, &crop, &mut region)
                .unwrap();
            TurboJpegDecoder {
                region: false,
                ..decoder
            }
            .decode_jpeg(&jpeg, &spec, &crop, &mut whole)
            .unwrap();
            ImageCrateDecoder
                .decode_into(ImageFormat::Jpeg, &jpeg, &spec, &crop, &mut reference)
                .unwrap();

            let same_scale = psnr(&region, &whole);
            assert!(
                same_scale > 40.0,
                "{crop:?}: region vs whole {same_scale:.1} dB"
            );
            let vs_full = psnr(&region, &reference);
            assert!(
                vs_full > 30.0,
                "{crop:?}: region vs full decode {vs_full:.1} dB"
            );
        }
    }

    #[test]
    fn a_box_maps_by_the_dct_factor_not_by_the_rounded_up_scaled_size() {
        // 375 rows at 1/2 are 188 (the last block's half row rounds up):
        // row 360 of the original is row 180 of the scaled image, not
        // 180.48.
        let spec = OutputSpec::center(64, 64);
        let crop = CropBox {
            left: 250.0,
            top: 360.0,
            width: 240.0,
            height: 15.0,
            drawn: Drawn::default(),
        };
        let (region, inner) = decode_region(&crop, &spec, Scale(4), (250, 188), 8);
        assert_eq!(inner.top + f64::from(region.y), 180.0);
        assert_eq!(inner.left + f64::from(region.x), 125.0);
        assert_eq!(inner.height, 7.5);
    }

    #[cfg(feature = "dev")]
    #[test]
    fn scaled_decodes_of_a_size_off_the_block_grid_match_the_original_pixels() {
        use crate::dev::kernel::psnr;
        // Fine grain, where a box off by a fraction of a pixel shows. The
        // reference is the pixels before JPEG, resized alike: a decoder's
        // own reference would carry its own sub-pixel conventions.
        let (pixels, jpeg) = synthetic_photo(5, 2, 500, 375);
        // Mapped by the rounded-up size instead, these were 32.1 and 36.0.
        for (output, expected, floor) in [(100, Scale(4), 33.2), (50, Scale(2), 36.6)] {
            let spec = OutputSpec {
                crop: Crop::Stretch,
                ..OutputSpec::center(output, output)
            };
            let crop = CropBox {
                left: 180.0,
                top: 170.0,
                width: 200.0,
                height: 200.0,
                drawn: Drawn::default(),
            };
            assert_eq!(dct_scale(&crop, &spec, ScaleFactors::default()), expected);
            let mut scaled = vec![0u8; spec.bytes()];
            let mut reference = vec![0u8; spec.bytes()];
            TurboJpegDecoder::default()
                .decode_jpeg(&jpeg, &spec, &crop, &mut scaled)
                .unwrap();
            crate::decode::resize_with(
                &mut fast_image_resize::Resizer::new(),
                fast_image_resize::FilterType::Lanczos3,
                pixels.as_raw(),
                500,
                375,
                &crop,
                &spec,
                &mut reference,
            )
            .unwrap();
            let quality = psnr(&scaled, &reference);
            assert!(quality > floor, "{expected:?}: {quality:.1} dB");
        }
    }

    /// DINOv2's views from one region decode: each as its own decode at its
    /// own scale would make it (the most demanding at the same scale,
    /// the others from more pixels than they need), and as the whole
    /// image's decode.
    #[cfg(feature = "dev")]
    #[test]
    fn views_from_one_region_are_each_views_own_decode() {
        use crate::decode::augment::{Resample, ViewGroup, Views};
        use crate::dev::kernel::psnr;
        let (_, jpeg) = synthetic_photo(7, 1, 500, 375);
        let view = |side, scale| OutputSpec {
            crop: Crop::RandomResized(RandomResizedCrop {
                scale,
                ..RandomResizedCrop::default()
            }),
            resample: Resample::Bicubic,
            ..OutputSpec::center(side, side)
        };
        let views = Views {
            groups: vec![
                ViewGroup::repeated(2, view(224, (0.32, 1.0))),
                ViewGroup::repeated(8, view(96, (0.05, 0.32))),
            ],
        };
        let specs: Vec<OutputSpec> = views.specs().copied().collect();
        let (mut worst_own, mut worst_whole) = (f64::INFINITY, f64::INFINITY);
        for sample in 0..16 {
            let key = SampleKey {
                seed: 3,
                epoch: 0,
                sample,
                copy: 0,
            };
            let plan = views.plan(500, 375, &key);
            let mut outs: Vec<Vec<u8>> = specs.iter().map(|s| vec![0u8; s.bytes()]).collect();
            let mut made =
                ViewOut::paired(&specs, &plan.boxes, outs.iter_mut().map(Vec::as_mut_slice));
            let decoder = TurboJpegDecoder::default();
            decoder.decode_jpeg_views(&jpeg, &mut made).unwrap();
            for (i, (spec, crop)) in specs.iter().zip(&plan.boxes).enumerate() {
                let mut own = vec![0u8; spec.bytes()];
                let mut whole = vec![0u8; spec.bytes()];
                decoder.decode_jpeg(&jpeg, spec, crop, &mut own).unwrap();
                ImageCrateDecoder
                    .decode_into(ImageFormat::Jpeg, &jpeg, spec, crop, &mut whole)
                    .unwrap();
                worst_own = worst_own.min(psnr(&outs[i], &own));
                worst_whole = worst_whole.min(psnr(&outs[i], &whole));
            }
        }
        assert!(
            worst_own > 30.0,
            "vs each view's own decode: {worst_own:.1} dB"
        );
        assert!(
            worst_whole > 30.0,
            "vs the whole image's decode: {worst_whole:.1} dB"
        );
    }

    /// One of the demo's photos (fine grain) and its JPEG at quality 90.
    #[cfg(feature = "dev")]
    fn synthetic_photo(
        index: u64,
        class: u32,
        width: u32,
        height: u32,
    ) -> (image::RgbImage, Vec<u8>) {
        let pixels = crate::dev::synthetic::synthetic_image(3, index, class, width, height);
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90)
            .encode_image(&pixels)
            .unwrap();
        (pixels, jpeg)
    }

    fn photo(width: u32, height: u32, shade: u8) -> Vec<u8> {
        let image = image::RgbImage::from_fn(width, height, |x, y| {
            image::Rgb([x as u8 * 3, y as u8 * 5, shade])
        });
        let mut out = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 60)
            .encode_image(&image)
            .unwrap();
        out
    }

    /// libjpeg keeps the last image's tables in a reused handle: an image
    /// that lacks its own must not borrow them (the output would depend on
    /// what the thread decoded before).
    #[test]
    fn an_image_never_borrows_the_tables_of_the_one_before() {
        let decoder = TurboJpegDecoder::default();
        let spec = OutputSpec::center(32, 32);
        let mut out = vec![0u8; spec.bytes()];
        let first = photo(64, 48, 200);
        let second = photo(64, 48, 30);
        let crop = center_box(64, 48, &spec);
        decoder
            .decode_into(ImageFormat::Jpeg, &first, &spec, &crop, &mut out)
            .unwrap();
        let no_quantization = super::super::jpeg::tests::without(&second, 0xDB);
        let error = decoder
            .decode_into(ImageFormat::Jpeg, &no_quantization, &spec, &crop, &mut out)
            .unwrap_err();
        assert!(matches!(error, DecodeError::Corrupt(_)), "{error:?}");
        // Without Huffman tables: the standard ones, whatever came before.
        let no_huffman = super::super::jpeg::tests::without(&second, 0xC4);
        let mut expected = vec![0u8; spec.bytes()];
        ImageCrateDecoder
            .decode_into(ImageFormat::Jpeg, &no_huffman, &spec, &crop, &mut expected)
            .ok();
        let got = decoder.decode_into(ImageFormat::Jpeg, &no_huffman, &spec, &crop, &mut out);
        match got {
            Ok(()) => assert_eq!(out, expected),
            Err(error) => assert!(matches!(error, DecodeError::Corrupt(_)), "{error:?}"),
        }
    }
}
