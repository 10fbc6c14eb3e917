//! Image decode and resize: compressed bytes in, `H x W x 3` uint8 out.
//!
//! Pure CPU work: nothing here awaits or does I/O. The pipeline calls
//! [`Decoder::decode_into`] from its decode pool with the sample's slot of the
//! batch buffer as the destination, so the resized pixels are written once,
//! where they will be sent from. Decoders sit behind one small trait so a
//! faster JPEG path can replace the default without touching the pipeline.

pub mod augment;
mod decoder;
mod error;
mod jpeg;
pub mod source;
#[cfg(feature = "turbojpeg")]
pub mod turbo;
#[cfg(test)]
mod views_tests;

pub use augment::{
    set_augment_simd, AffineDrawn, AugmentError, AutoAugment, Autocontrast, Coin, ColorJitter,
    Crop, CropBox, Drawn, Equalize, EraseValue, ErasedBox, Fill, GaussianBlur, Grayscale,
    HorizontalFlip, Interpolation, Invert, JitterDrawn, JitterOp, Kernel, Ops, OutputSpec,
    PhotometricDrawn, Policy, PolicyDrawn, PolicyOp, PolicyStep, Posterize, RandomAffine,
    RandomErasing, RandomPhotometricDistort, RandomResizedCrop, RandomRotation, Resample,
    SampleKey, Sharpness, Solarize, VerticalFlip, CHANNELS, DEFAULT_SIZE, MAX_SIZE,
};
pub use augment::{view_key, ViewGroup, Views, ViewsPlan, MAX_VIEWS_PER_GROUP, MAX_VIEW_GROUPS};
pub use augment::{PilResample, TimmDrawn, TimmOp, TimmRandAugment, TimmStep};
pub use decoder::{
    covering, decode_rgb, decode_views_whole, resize_rgb, resize_with, Decoder, ImageCrateDecoder,
    ViewOut, IMAGE_CRATE_DECODER,
};
pub use error::{DecodeError, MAX_SOURCE_PIXELS};

use decoder::image_format;
pub use jpeg::{
    check_jpeg_complete, check_jpeg_tables, jpeg_dimensions, jpeg_frame, JpegFrame, JpegTables,
};

use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::shard::ImageFormat;

/// Peak signal-to-noise ratio of `a` against `b`, in dB (how the stated
/// fidelity of decoders and stored source forms is measured).
pub fn psnr(a: &[u8], b: &[u8]) -> f64 {
    let mse: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum::<f64>()
        / a.len().max(1) as f64;
    if mse == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (255.0f64 * 255.0 / mse).log10()
    }
}

/// Working memory a full-size JPEG decode holds per source pixel: the RGB
/// output plus the decoder's own planes (progressive JPEGs keep
/// coefficients for the whole image). Other formats hold more where their
/// pixels are deeper (`source_header`).
pub const SCRATCH_BYTES_PER_PIXEL: u64 = 6;
/// Decodes below this much scratch skip the budget: with `threads` decode
/// threads at most `threads` of them are alive at once.
pub const SMALL_DECODE_BYTES: u64 = 8 << 20;

/// Bytes of full-size decode buffers that all decode threads together may
/// hold. A large image waits for others to finish rather than multiplying
/// peak memory by the thread count; one larger than the whole budget is
/// refused. Holders never wait on anything but their own decode, so every
/// wait ends.
#[derive(Debug)]
pub struct ScratchBudget {
    limit: u64,
    used: Mutex<u64>,
    freed: Condvar,
}

/// Scratch memory held by one decode; returned when dropped.
pub struct ScratchPermit<'a> {
    budget: &'a ScratchBudget,
    bytes: u64,
}

impl ScratchBudget {
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            used: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        self.used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits until `bytes` fit beside the decodes in progress.
    fn acquire(&self, bytes: u64) -> ScratchPermit<'_> {
        let mut used = self.lock();
        let started = std::time::Instant::now();
        let mut warned = false;
        while *used + bytes > self.limit {
            let (guard, timeout) = self
                .freed
                .wait_timeout(used, Duration::from_secs(10))
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            used = guard;
            if timeout.timed_out() && !warned {
                warned = true;
                tracing::warn!(
                    waited_s = started.elapsed().as_secs(),
                    bytes,
                    "a large decode is waiting for decode memory"
                );
            }
        }
        *used += bytes;
        ScratchPermit {
            budget: self,
            bytes,
        }
    }
}

impl Drop for ScratchPermit<'_> {
    fn drop(&mut self) {
        *self.budget.lock() -= self.bytes;
        self.budget.freed.notify_all();
    }
}

/// The pixel size of an image from its headers, without decoding it.
pub fn source_dimensions(format: ImageFormat, data: &[u8]) -> Result<(u32, u32), DecodeError> {
    source_header(format, data).map(|(width, height, _)| (width, height))
}

/// The image's size and the working memory a full-size decode of it holds
/// per pixel, from its headers: for JPEG [`SCRATCH_BYTES_PER_PIXEL`]; for
/// the `image` crate's formats the decoder's own pixels at their native
/// depth and channels (a 16-bit RGBA PNG: 8 bytes) plus the RGB8 copy made
/// of them, never less than the JPEG figure.
fn source_header(format: ImageFormat, data: &[u8]) -> Result<(u32, u32, u64), DecodeError> {
    use image::ImageDecoder;
    if format == ImageFormat::Jpeg {
        if let Some((width, height)) = jpeg_dimensions(data) {
            return Ok((width, height, SCRATCH_BYTES_PER_PIXEL));
        }
    }
    let decoder = image::ImageReader::with_format(std::io::Cursor::new(data), image_format(format))
        .into_decoder()
        .map_err(|e| DecodeError::Corrupt(e.to_string()))?;
    let (width, height) = decoder.dimensions();
    let native = u64::from(decoder.color_type().bytes_per_pixel());
    Ok((
        width,
        height,
        (native + CHANNELS as u64).max(SCRATCH_BYTES_PER_PIXEL),
    ))
}

/// Decodes one sample within the budgets and returns the box it came from.
///
/// The image's size is read from its headers first: the pixel limit and the
/// decode memory budget are checked before anything is allocated, and the
/// sample's crop and flip are decided ([`OutputSpec::crop_box`]) before the
/// decoder runs, so a decoder that can decode just the region does. A panic
/// inside the decoder becomes an error for this image instead of taking the
/// decode thread (and the process) down.
pub fn decode_bounded(
    decoder: &dyn Decoder,
    budget: &ScratchBudget,
    format: ImageFormat,
    data: &[u8],
    spec: &OutputSpec,
    key: &SampleKey,
    out: &mut [u8],
) -> Result<CropBox, DecodeError> {
    full_size_bounded(budget, format, data, |width, height| {
        let crop = spec.crop_box(width, height, key);
        decoder.decode_into(format, data, spec, &crop, out)?;
        spec.finish(&crop, out);
        Ok(crop)
    })
}

/// Decodes one sample once within the budgets and writes each of its views
/// (`outs[i]` is view `i`, group by group, each `spec.bytes()` long), each
/// view's ops run; returns the plan (the boxes and decisions to send).
pub fn decode_views_bounded(
    decoder: &dyn Decoder,
    budget: &ScratchBudget,
    format: ImageFormat,
    data: &[u8],
    views: &Views,
    key: &SampleKey,
    outs: &mut [&mut [u8]],
) -> Result<ViewsPlan, DecodeError> {
    full_size_bounded(budget, format, data, |width, height| {
        let plan = views.plan(width, height, key);
        let mut made = ViewOut::paired(
            views.specs(),
            &plan.boxes,
            outs.iter_mut().map(|out| &mut **out),
        );
        if made.len() != plan.boxes.len() {
            return Err(DecodeError::Resize(format!(
                "{} outputs for {} views",
                made.len(),
                plan.boxes.len()
            )));
        }
        decoder.decode_views_into(format, data, &mut made)?;
        for view in made {
            view.spec.finish(view.crop, view.out);
        }
        Ok(plan)
    })
}

/// Runs `work` (given the image's size) on an image whose size and
/// full-size decode memory are within bounds, holding its share of the
/// scratch budget; a panic inside becomes [`DecodeError::Panicked`].
pub fn full_size_bounded<T>(
    budget: &ScratchBudget,
    format: ImageFormat,
    data: &[u8],
    work: impl FnOnce(u32, u32) -> Result<T, DecodeError>,
) -> Result<T, DecodeError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let (width, height, per_pixel) = source_header(format, data)?;
        let pixels = u64::from(width) * u64::from(height);
        if pixels > MAX_SOURCE_PIXELS {
            return Err(DecodeError::TooLarge { width, height });
        }
        let bytes = pixels * per_pixel;
        if bytes > budget.limit {
            return Err(DecodeError::OverBudget {
                width,
                height,
                bytes,
                budget: budget.limit,
            });
        }
        let _permit = (bytes > SMALL_DECODE_BYTES).then(|| budget.acquire(bytes));
        work(width, height)
    }))
    .unwrap_or_else(|panic| Err(panicked(panic)))
}

fn panicked(panic: Box<dyn std::any::Any + Send>) -> DecodeError {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-text panic payload".into());
    DecodeError::Panicked(message)
}

/// A pool of `threads` decode threads named `name-N`. A panic in a task
/// (outside a sample's decode, whose panics substitute the sample) is
/// logged and ends that task, not the process: whoever waits for the task
/// sees its channel dropped and fails that one stream (or unit) with
/// INTERNAL, and the threads go on serving every other. Without a handler,
/// rayon aborts the process, taking every rank's stream with it.
pub fn decode_thread_pool(
    threads: usize,
    name: &'static str,
) -> Result<rayon::ThreadPool, rayon::ThreadPoolBuildError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(move |i| format!("{name}-{i}"))
        .panic_handler(move |payload| {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-text panic".into());
            tracing::error!(pool = name, %message, "a decode task panicked; its stream fails");
        })
        .build()
}

/// The fastest decoder this build has: libjpeg-turbo with DCT scaling for
/// JPEG when built with the `turbojpeg` feature, else the `image` crate.
pub fn default_decoder() -> std::sync::Arc<dyn Decoder> {
    #[cfg(feature = "turbojpeg")]
    return std::sync::Arc::new(turbo::TurboJpegDecoder::default());
    #[cfg(not(feature = "turbojpeg"))]
    return std::sync::Arc::new(ImageCrateDecoder);
}

/// Name of [`default_decoder`]'s JPEG path, for logs and benchmarks.
pub fn default_decoder_name() -> &'static str {
    default_decoder().name()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode_jpeg(width: u32, height: u32, pixel: impl Fn(u32, u32) -> [u8; 3]) -> Vec<u8> {
        let image = image::RgbImage::from_fn(width, height, |x, y| image::Rgb(pixel(x, y)));
        let mut out = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 95)
            .encode_image(&image)
            .unwrap();
        out
    }

    const KEY: SampleKey = SampleKey {
        seed: 0,
        epoch: 0,
        sample: 0,
        copy: 0,
    };

    fn decode_whole(
        decoder: &dyn Decoder,
        format: ImageFormat,
        data: &[u8],
        spec: &OutputSpec,
        out: &mut [u8],
    ) -> Result<CropBox, DecodeError> {
        decode_bounded(
            decoder,
            &ScratchBudget::new(1 << 30),
            format,
            data,
            spec,
            &KEY,
            out,
        )
    }

    #[test]
    fn center_crop_keeps_the_middle_stripe() {
        // Left third red, middle third green, right third blue: the crop of a
        // 3:1 image to a square keeps only green.
        let jpeg = encode_jpeg(300, 100, |x, _| match x / 100 {
            0 => [255, 0, 0],
            1 => [0, 255, 0],
            _ => [0, 0, 255],
        });
        let spec = OutputSpec::center(32, 32);
        let mut out = vec![0u8; spec.bytes()];
        decode_whole(
            &ImageCrateDecoder,
            ImageFormat::Jpeg,
            &jpeg,
            &spec,
            &mut out,
        )
        .unwrap();
        let center = &out[(16 * 32 + 16) * 3..][..3];
        assert!(
            center[1] > 200 && center[0] < 40 && center[2] < 40,
            "{center:?}"
        );
        let edge = &out[(16 * 32 + 2) * 3..][..3];
        assert!(edge[1] > 150, "edge pixel {edge:?} should still be green");
    }

    #[test]
    fn jpeg_sizes_come_from_the_frame_header() {
        for (width, height) in [(64, 48), (1, 1), (333, 17)] {
            let jpeg = encode_jpeg(width, height, |x, y| [x as u8, y as u8, 0]);
            assert_eq!(jpeg_dimensions(&jpeg), Some((width, height)));
            assert_eq!(
                source_dimensions(ImageFormat::Jpeg, &jpeg).unwrap(),
                (width, height)
            );
            for cut in [0, 1, 2, 5, 20] {
                assert_eq!(jpeg_dimensions(&jpeg[..cut]), None, "cut at {cut}");
            }
        }
        assert_eq!(jpeg_dimensions(b"\xFF\xD8\xFF\xDA\x00\x02"), None);
        assert_eq!(jpeg_dimensions(b"\xFF\xD8\xFF\xE0\x00\x00"), None);
    }

    #[test]
    fn a_jpeg_cut_short_is_corrupt_and_a_whole_one_is_not() {
        let jpeg = encode_jpeg(64, 48, |x, y| [x as u8 * 3, y as u8 * 5, 90]);
        assert_eq!(check_jpeg_complete(&jpeg), Ok(()));
        // Bytes some writers append after the end-of-image marker are fine.
        let mut trailing = jpeg.clone();
        trailing.extend_from_slice(&[0u8; 100]);
        assert_eq!(check_jpeg_complete(&trailing), Ok(()));
        for cut in [jpeg.len() / 3, jpeg.len() - 2, jpeg.len() - 1] {
            let error = decode_rgb(ImageFormat::Jpeg, &jpeg[..cut]).unwrap_err();
            assert!(
                matches!(&error, DecodeError::Corrupt(m) if m.contains("premature end")),
                "cut at {cut}: {error:?}"
            );
        }
    }

    #[test]
    fn corrupt_bytes_are_an_error_not_a_panic() {
        let spec = OutputSpec::center(8, 8);
        let mut out = vec![0u8; spec.bytes()];
        let mut jpeg = encode_jpeg(64, 64, |x, y| [x as u8, y as u8, 0]);
        jpeg.truncate(20);
        for format in [ImageFormat::Jpeg, ImageFormat::Png, ImageFormat::Webp] {
            assert!(decode_whole(&ImageCrateDecoder, format, &jpeg, &spec, &mut out).is_err());
            assert!(decode_whole(&ImageCrateDecoder, format, b"", &spec, &mut out).is_err());
        }
    }

    /// A PNG's signature, header and an empty data chunk: enough for
    /// `source_dimensions`.
    fn png_header(width: u32, height: u32) -> Vec<u8> {
        png_header_of(width, height, 8, 2)
    }

    /// A PNG header of `depth` bits and colour type `colour` (2: RGB, 6:
    /// RGBA) and nothing after it.
    fn png_header_of(width: u32, height: u32, depth: u8, colour: u8) -> Vec<u8> {
        let mut chunk = b"IHDR".to_vec();
        chunk.extend(width.to_be_bytes());
        chunk.extend(height.to_be_bytes());
        chunk.extend([depth, colour, 0, 0, 0]);
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        png.extend(13u32.to_be_bytes());
        png.extend(&chunk);
        png.extend(crc32fast::hash(&chunk).to_be_bytes());
        // An empty IDAT: the decoder reads up to the first data chunk.
        png.extend(0u32.to_be_bytes());
        png.extend(b"IDAT");
        png.extend(crc32fast::hash(b"IDAT").to_be_bytes());
        png
    }

    #[test]
    fn scratch_follows_the_formats_depth_and_channels() {
        // D9: a 16-bit RGBA PNG decodes to 8 bytes a pixel, then 3 of RGB.
        let deep = png_header_of(6500, 6500, 16, 6);
        assert_eq!(
            source_header(ImageFormat::Png, &deep).unwrap(),
            (6500, 6500, 11)
        );
        let plain = png_header_of(64, 64, 8, 2);
        assert_eq!(source_header(ImageFormat::Png, &plain).unwrap().2, 6);
        // Refused on its header against a budget the 6-byte figure fits.
        let budget = ScratchBudget::new(6500 * 6500 * 8);
        let refused = full_size_bounded(&budget, ImageFormat::Png, &deep, |_, _| Ok(()));
        assert!(
            matches!(refused, Err(DecodeError::OverBudget { bytes, .. }) if bytes == 6500 * 6500 * 11),
            "{refused:?}"
        );
    }

    /// Counts decodes in progress at once; takes 30 ms per image.
    #[derive(Debug, Default)]
    struct Counting {
        now: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
    }

    impl Decoder for Counting {
        fn decode_into(
            &self,
            _: ImageFormat,
            _: &[u8],
            _: &OutputSpec,
            _: &CropBox,
            _: &mut [u8],
        ) -> Result<(), DecodeError> {
            use std::sync::atomic::Ordering::SeqCst;
            let now = self.now.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            std::thread::sleep(Duration::from_millis(30));
            self.now.fetch_sub(1, SeqCst);
            Ok(())
        }
    }

    #[test]
    fn large_decodes_share_the_scratch_budget_and_huge_ones_are_refused() {
        let spec = OutputSpec::center(4, 4);
        // 1500² pixels need 13.5 MB of scratch: two do not fit in 20 MB.
        let large = png_header(1500, 1500);
        let budget = ScratchBudget::new(20 << 20);
        let counting = Counting::default();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    let mut out = vec![0u8; spec.bytes()];
                    decode_bounded(
                        &counting,
                        &budget,
                        ImageFormat::Png,
                        &large,
                        &spec,
                        &KEY,
                        &mut out,
                    )
                    .unwrap();
                });
            }
        });
        assert_eq!(counting.most.load(std::sync::atomic::Ordering::SeqCst), 1);

        let mut out = vec![0u8; spec.bytes()];
        let huge = png_header(3000, 3000);
        assert!(matches!(
            decode_bounded(
                &counting,
                &budget,
                ImageFormat::Png,
                &huge,
                &spec,
                &KEY,
                &mut out
            ),
            Err(DecodeError::OverBudget { .. })
        ));
        let bomb = png_header(20_000, 20_000);
        assert!(matches!(
            decode_bounded(
                &counting,
                &budget,
                ImageFormat::Png,
                &bomb,
                &spec,
                &KEY,
                &mut out
            ),
            Err(DecodeError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_panicking_task_leaves_the_decode_threads_serving() {
        let pool = decode_thread_pool(2, "test-decode").unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<u32>();
        let dropped = tx.clone();
        pool.spawn(move || {
            let _kept_until_the_panic = dropped;
            panic!("a bug in a decode task");
        });
        for n in 0..4 {
            let tx = tx.clone();
            pool.spawn(move || tx.send(n).unwrap());
        }
        drop(tx);
        let mut got: Vec<u32> = rx.iter().collect();
        got.sort_unstable();
        assert_eq!(got, [0, 1, 2, 3], "the threads went on after the panic");
    }
}
