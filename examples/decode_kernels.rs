//! The single-thread decode kernels on synthetic ~110 KB photos, each as a
//! fraction of the JPEG entropy-decoding floor measured in the same run:
//! `cargo run --release --features turbojpeg --example decode_kernels [-- REPEATS [ONLY]]`
//! (ONLY: run just the kernels whose `transform/name` contains it, and the
//! floor; for a profiler).
//!
//! The floor is a whole-image decode at DCT scale 1/8 with nothing to
//! resize: about the Huffman decoding every kept row must pay. Center crop
//! keeps every row, so it cannot pass the floor; a training crop keeps fewer
//! rows and can. Every kernel runs once per repeat, interleaved with the
//! others, and its best repeat is reported: the machine is shared, and the
//! best repeat is the one least disturbed.
//!
//! Two kinds of rows bound what a kernel can reach (no pixels, no PSNR):
//! "region decode only" decodes exactly what the shipped kernel decodes and
//! skips the resize, so no resize can lift a kernel past it; "every
//! coefficient stored" decodes a one-block-wide column of every row at full
//! size, so the entropy decoder keeps each block's coefficients (at DCT
//! 1/8 it only skips past the AC ones) while the inverse DCT and colour
//! work is negligible: the floor of any kernel that decodes at full size.
use shardfeed::decode::{
    Crop, Decoder, HorizontalFlip, ImageCrateDecoder, Ops, OutputSpec, RandomResizedCrop,
};
use shardfeed::dev::kernel::decode_kernel;

struct Kernel {
    transform: &'static str,
    name: &'static str,
    decoder: Box<dyn Decoder>,
    spec: OutputSpec,
    best: f64,
    /// None for the bounding rows, which write no pixels.
    psnr: Option<f64>,
}

/// The shipped JPEG decoder's region decode without the resize.
#[cfg(feature = "turbojpeg")]
#[derive(Debug)]
struct RegionOnly {
    decoder: shardfeed::decode::turbo::TurboJpegDecoder,
    /// Narrow the box to one block column (the "every coefficient stored" row).
    one_column: bool,
}

#[cfg(feature = "turbojpeg")]
impl Decoder for RegionOnly {
    fn decode_into(
        &self,
        _format: shardfeed::shard::ImageFormat,
        data: &[u8],
        spec: &OutputSpec,
        crop: &shardfeed::decode::CropBox,
        _out: &mut [u8],
    ) -> Result<(), shardfeed::decode::DecodeError> {
        let crop = if self.one_column {
            shardfeed::decode::CropBox {
                width: crop.width.min(8.0),
                ..*crop
            }
        } else {
            *crop
        };
        self.decoder.decode_region_only(data, spec, &crop)
    }
}

fn main() {
    let repeats: usize = std::env::args()
        .nth(1)
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(5);
    let samples: Vec<Vec<u8>> = (0..96u64)
        .map(|i| {
            let pixels =
                shardfeed::dev::synthetic::synthetic_image(7, i, (i % 10) as u32, 500, 375);
            let mut jpeg = Vec::new();
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90)
                .encode_image(&pixels)
                .unwrap();
            jpeg
        })
        .collect();
    let mean_kb = samples.iter().map(Vec::len).sum::<usize>() as f64 / samples.len() as f64 / 1e3;
    println!(
        "{} synthetic 500x375 photos, {mean_kb:.0} KB mean; one thread; best of {repeats} interleaved repeats",
        samples.len()
    );

    let center = OutputSpec::center(224, 224);
    let train = OutputSpec {
        crop: Crop::RandomResized(RandomResizedCrop::default()),
        ops: Ops::default().with(HorizontalFlip(0.5)),
        ..center
    };
    let kernel = |transform, name, decoder: Box<dyn Decoder>, spec| Kernel {
        transform,
        name,
        decoder,
        spec,
        best: 0.0,
        psnr: Some(0.0),
    };
    let mut kernels = Vec::new();
    for (transform, spec) in [("center crop", center), ("random-resized-crop+flip", train)] {
        kernels.push(kernel(
            transform,
            "image crate (zune-jpeg), full decode",
            Box::new(ImageCrateDecoder),
            spec,
        ));
        #[cfg(feature = "turbojpeg")]
        {
            use shardfeed::decode::turbo::{ScaleFactors, TurboJpegDecoder};
            let turbo = TurboJpegDecoder::default();
            let variants = [
                (
                    "turbo whole image, DCT 1/2^k (before)",
                    TurboJpegDecoder {
                        region: false,
                        ..turbo
                    },
                ),
                ("turbo region, DCT 1/2^k", turbo),
                (
                    "turbo region, DCT n/8",
                    TurboJpegDecoder {
                        factors: ScaleFactors::AnyEighth,
                        ..turbo
                    },
                ),
                (
                    "turbo region, fast upsampling",
                    TurboJpegDecoder {
                        fast_upsample: true,
                        ..turbo
                    },
                ),
                (
                    "turbo region, fast IDCT",
                    TurboJpegDecoder {
                        fast_dct: true,
                        ..turbo
                    },
                ),
                (
                    "turbo region, fast upsampling + IDCT",
                    TurboJpegDecoder {
                        fast_upsample: true,
                        fast_dct: true,
                        ..turbo
                    },
                ),
            ];
            for (name, decoder) in variants {
                kernels.push(kernel(transform, name, Box::new(decoder), spec));
            }
            let bounds = [
                ("bound: shipped region decode only", turbo),
                (
                    "bound: region decode only, DCT n/8",
                    TurboJpegDecoder {
                        factors: ScaleFactors::AnyEighth,
                        ..turbo
                    },
                ),
            ];
            for (name, decoder) in bounds {
                kernels.push(Kernel {
                    psnr: None,
                    ..kernel(
                        transform,
                        name,
                        Box::new(RegionOnly {
                            decoder,
                            one_column: false,
                        }),
                        spec,
                    )
                });
            }
        }
    }
    #[cfg(feature = "turbojpeg")]
    kernels.push(kernel(
        "floor",
        "turbo whole image at DCT 1/8, no resize",
        Box::<shardfeed::decode::turbo::TurboJpegDecoder>::default(),
        // Resized to 8x8 by stretching: the resize is negligible.
        OutputSpec {
            crop: Crop::Stretch,
            ..OutputSpec::center(8, 8)
        },
    ));
    #[cfg(feature = "turbojpeg")]
    kernels.push(Kernel {
        psnr: None,
        ..kernel(
            "floor",
            "bound: every coefficient stored",
            Box::new(RegionOnly {
                decoder: Default::default(),
                one_column: true,
            }),
            // Stretched to 8x8 from a box one block wide: DCT scale 8/8.
            OutputSpec {
                crop: Crop::Stretch,
                ..OutputSpec::center(8, 8)
            },
        )
    });
    if let Some(only) = std::env::args().nth(2) {
        kernels.retain(|k| {
            k.transform == "floor" || format!("{}/{}", k.transform, k.name).contains(&only)
        });
    }
    for _ in 0..repeats {
        for kernel in &mut kernels {
            let figures = decode_kernel(kernel.decoder.as_ref(), &samples, &kernel.spec, 1);
            kernel.best = kernel.best.max(figures.rate);
            kernel.psnr = kernel.psnr.map(|_| figures.psnr);
        }
    }
    let floor = kernels
        .iter()
        .find(|k| k.transform == "floor" && k.psnr.is_some())
        .map_or(f64::NAN, |k| k.best);
    println!(
        "{:<26} {:<40} {:>7} {:>9} {:>8}",
        "transform", "kernel", "img/s", "of floor", "PSNR dB"
    );
    for k in &kernels {
        let psnr = k.psnr.map_or("-".into(), |db| format!("{db:.1}"));
        println!(
            "{:<26} {:<40} {:>7.0} {:>8.0}% {:>8}",
            k.transform,
            k.name,
            k.best,
            100.0 * k.best / floor,
            psnr
        );
    }
    let rate_of = |transform: &str, name: &str| {
        kernels
            .iter()
            .find(|k| k.transform == transform && k.name == name)
            .map_or(f64::NAN, |k| k.best)
    };
    let shipped = if cfg!(feature = "turbojpeg") {
        "turbo region, DCT 1/2^k"
    } else {
        "image crate (zune-jpeg), full decode"
    };
    println!(
        "shipped kernel ({shipped}): random-resized-crop+flip / center crop = {:.2}x",
        rate_of("random-resized-crop+flip", shipped) / rate_of("center crop", shipped)
    );
}
