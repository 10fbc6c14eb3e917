//! Compares decode strategies on synthetic photos: `cargo run --release --features turbojpeg --example decode_kernels`.
use shardfeed::decode::{ImageCrateDecoder, OutputSpec, ResizeMode};

fn main() {
    for (w, h) in [(500, 375), (1000, 750)] {
        run(w, h);
    }
}

fn run(w: u32, h: u32) {
    let spec = OutputSpec {
        height: 224,
        width: 224,
        mode: ResizeMode::CenterCrop,
    };
    let data = shardfeed::dev::synthetic::SyntheticSpec {
        shards: 1,
        samples_per_shard: 96,
        ..Default::default()
    };
    let samples: Vec<Vec<u8>> = (0..data.samples_per_shard as u64)
        .map(|i| {
            let pixels = shardfeed::dev::synthetic::synthetic_image(7, i, (i % 10) as u32, w, h);
            let mut jpeg = Vec::new();
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90)
                .encode_image(&pixels)
                .unwrap();
            jpeg
        })
        .collect();
    let mean_kb = samples.iter().map(Vec::len).sum::<usize>() as f64 / samples.len() as f64 / 1e3;
    let (rate, psnr) =
        shardfeed::dev::kernel::decode_kernel(&ImageCrateDecoder, &samples, &spec, 3);
    println!(
        "{w}x{h} image crate: {rate:.0} img/s/thread, PSNR {psnr:.1} dB ({mean_kb:.0} KB JPEGs)"
    );
    #[cfg(feature = "turbojpeg")]
    for factors in [
        shardfeed::decode::turbo::ScaleFactors::None,
        shardfeed::decode::turbo::ScaleFactors::PowersOfTwo,
        shardfeed::decode::turbo::ScaleFactors::AnyEighth,
    ] {
        let decoder = shardfeed::decode::turbo::TurboJpegDecoder { factors };
        let (rate, psnr) = shardfeed::dev::kernel::decode_kernel(&decoder, &samples, &spec, 3);
        println!("{w}x{h} turbo {factors:?}: {rate:.0} img/s/thread, PSNR {psnr:.1} dB");
    }
}
