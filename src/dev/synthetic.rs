//! Synthetic photo-like JPEGs (gradients, shapes, texture, noise: their
//! decode cost is realistic, unlike flat colors) packed as WebDataset shards,
//! and published through aws-sdk-s3 into the in-memory S3 server: the data of
//! the demo and the benchmarks.

use std::sync::Arc;

use bytes::Bytes;
use rayon::prelude::*;

use super::s3mem;
use crate::dataset::{build_index, write_index, DatasetLocation};
use crate::plan::rng::Rng;
use crate::shard::tar::TarWriter;
use crate::shard::BadShardPolicy;
use crate::store::read::ReadConfig;
use crate::store::s3::S3Store;
use crate::store::ObjectStore;

pub const DEMO_BUCKET: &str = "demo";
pub const DEMO_PREFIX: &str = "photos/";
/// Where [`publish_loose`] puts the same photos as loose objects.
pub const LOOSE_PREFIX: &str = "loose/";

/// Classes of the synthetic dataset; each has its own palette.
pub const CLASSES: u32 = 10;

#[derive(Debug, Clone)]
pub struct SyntheticSpec {
    pub shards: usize,
    pub samples_per_shard: usize,
    /// Source images are about this size (each varies by up to 25%).
    pub width: u32,
    pub height: u32,
    pub quality: u8,
    pub seed: u64,
    /// Shard `i` holds only classes `i % CLASSES` and `(i + 1) % CLASSES`
    /// (a folder-by-folder pack), instead of random classes.
    pub class_sorted: bool,
}

impl Default for SyntheticSpec {
    fn default() -> Self {
        // About ImageNet's mean photo: 500x375, ~110 KB as JPEG q90.
        Self {
            shards: 8,
            samples_per_shard: 192,
            width: 500,
            height: 375,
            quality: 90,
            seed: 7,
            class_sorted: false,
        }
    }
}

/// One synthetic photo as RGB pixels.
pub fn synthetic_image(
    seed: u64,
    index: u64,
    class: u32,
    width: u32,
    height: u32,
) -> image::RgbImage {
    let mut rng = Rng::derive(&[seed, index, 0xD3]);
    let mut unit = move || (rng.next_u64() >> 11) as f32 / (1u64 << 53) as f32;
    // The class sets the hue family; everything else is random per image.
    let hue = class as f32 / CLASSES as f32;
    let palette = |shift: f32, light: f32| hsv(hue + shift, 0.35 + 0.5 * light, 0.35 + 0.6 * light);
    let top = palette(unit() * 0.1, unit());
    let bottom = palette(unit() * 0.1 - 0.05, unit());
    let angle = unit() * std::f32::consts::TAU;
    let (ca, sa) = (angle.cos(), angle.sin());
    struct Shape {
        cx: f32,
        cy: f32,
        r: f32,
        color: [f32; 3],
        square: bool,
    }
    let shapes: Vec<Shape> = (0..3 + (unit() * 5.0) as usize)
        .map(|_| Shape {
            cx: unit() * width as f32,
            cy: unit() * height as f32,
            r: (0.08 + unit() * 0.25) * width.min(height) as f32,
            color: palette(unit() * 0.3 - 0.15, unit()),
            square: unit() < 0.4,
        })
        .collect();
    let freq = 0.02 + unit() * 0.15;
    let mut noise = Rng::derive(&[seed, index, 0x4E]);
    image::RgbImage::from_fn(width, height, |x, y| {
        let (fx, fy) = (x as f32, y as f32);
        let t = ((fx / width as f32 - 0.5) * ca + (fy / height as f32 - 0.5) * sa + 0.5)
            .clamp(0.0, 1.0);
        let mut rgb: [f32; 3] = std::array::from_fn(|c| top[c] * (1.0 - t) + bottom[c] * t);
        for shape in &shapes {
            let (dx, dy) = (fx - shape.cx, fy - shape.cy);
            let inside = if shape.square {
                dx.abs().max(dy.abs()) < shape.r
            } else {
                dx * dx + dy * dy < shape.r * shape.r
            };
            if inside {
                // Shading across the shape, like light on an object.
                let shade = 0.75 + 0.25 * (dx / shape.r);
                rgb = shape.color.map(|v| v * shade);
            }
        }
        let texture = 0.06 * ((fx * freq).sin() * (fy * freq * 1.3).cos());
        let grain = (noise.next_u64() >> 56) as f32 / 255.0 - 0.5;
        // Grain sized so the mean file is ~110 KB at q90, as ImageNet's are:
        // entropy decoding cost follows the compressed size.
        let pixel = |v: f32| ((v + texture + grain * 0.3).clamp(0.0, 1.0) * 255.0) as u8;
        image::Rgb([pixel(rgb[0]), pixel(rgb[1]), pixel(rgb[2])])
    })
}

fn hsv(h: f32, s: f32, v: f32) -> [f32; 3] {
    let h = h.rem_euclid(1.0) * 6.0;
    let i = h.floor();
    let f = h - i;
    let (p, q, t) = (v * (1.0 - s), v * (1.0 - s * f), v * (1.0 - s * (1.0 - f)));
    match i as u32 {
        0 => [v, t, p],
        1 => [q, v, p],
        2 => [p, v, t],
        3 => [p, q, v],
        4 => [t, p, v],
        _ => [v, p, q],
    }
}

/// `jpeg` with `count` pseudo-random bytes (from `seed`) written over the
/// middle of its entropy-coded data, headers and end marker intact: a
/// flipped disk block or a bad copy, which libjpeg refuses and a GPU
/// decoder such as nvJPEG decodes into garbage without an error.
pub fn scan_corrupted(jpeg: &[u8], count: usize, seed: u64) -> Vec<u8> {
    let scan = jpeg
        .windows(2)
        .position(|pair| pair == [0xFF, 0xDA])
        .expect("a start of scan");
    let header = usize::from(u16::from_be_bytes([jpeg[scan + 2], jpeg[scan + 3]]));
    let data_start = scan + 2 + header;
    let data_len = jpeg.len() - 2 - data_start;
    let count = count.min(data_len / 2);
    let from = data_start + (data_len - count) / 2;
    let mut rng = Rng::derive(&[seed]);
    let mut out = jpeg.to_vec();
    for byte in &mut out[from..from + count] {
        *byte = rng.next_u64() as u8;
    }
    out
}

/// The class of sample `index` under `spec`.
pub fn synthetic_class(spec: &SyntheticSpec, shard: usize, index: u64) -> u32 {
    if spec.class_sorted {
        let base = shard as u32 % CLASSES;
        let second = index % 2 == 1 && spec.samples_per_shard > 1;
        (base + u32::from(second) * (index as u32 % 3 / 2)) % CLASSES
    } else {
        (Rng::derive(&[spec.seed, index, 0xC1]).next_u64() % u64::from(CLASSES)) as u32
    }
}

/// One synthetic sample: key, JPEG bytes, class.
type SyntheticSample = (String, Vec<u8>, u32);

/// Builds the shards in parallel: `(name, tar bytes)`.
pub fn synthesize_shards(spec: &SyntheticSpec) -> Vec<(String, Vec<u8>)> {
    synthesize_samples(spec)
        .into_par_iter()
        .enumerate()
        .map(|(shard, samples)| {
            let mut tar = TarWriter::new();
            for (key, jpeg, class) in &samples {
                tar.append(&format!("{key}.jpg"), jpeg);
                tar.append(&format!("{key}.cls"), class.to_string().as_bytes());
            }
            (format!("shard-{shard:06}.tar"), tar.finish())
        })
        .collect()
}

/// The first `count` photos of `spec`'s kind, as JPEG bytes.
pub fn photos(spec: &SyntheticSpec, count: usize) -> Vec<bytes::Bytes> {
    let one_shard = SyntheticSpec {
        shards: 1,
        samples_per_shard: count,
        ..spec.clone()
    };
    synthesize_samples(&one_shard)
        .into_iter()
        .flatten()
        .map(|(_, jpeg, _)| jpeg.into())
        .collect()
}

/// The samples of each shard, built in parallel.
fn synthesize_samples(spec: &SyntheticSpec) -> Vec<Vec<SyntheticSample>> {
    (0..spec.shards)
        .into_par_iter()
        .map(|shard| {
            (0..spec.samples_per_shard)
                .into_par_iter()
                .map(|i| {
                    let index = (shard * spec.samples_per_shard + i) as u64;
                    let class = synthetic_class(spec, shard, index);
                    let mut size = Rng::derive(&[spec.seed, index, 0x51]);
                    let jitter = |base: u32, r: u64| base * (75 + (r % 51) as u32) / 100;
                    let (w, h) = (
                        jitter(spec.width, size.next_u64()),
                        jitter(spec.height, size.next_u64()),
                    );
                    let pixels = synthetic_image(spec.seed, index, class, w.max(8), h.max(8));
                    let mut jpeg = Vec::new();
                    let encoded =
                        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, spec.quality)
                            .encode_image(&pixels);
                    debug_assert!(encoded.is_ok());
                    (format!("sample-{index:08}"), jpeg, class)
                })
                .collect()
        })
        .collect()
}

/// Uploads `spec`'s samples as loose objects, `<class>/<key>.jpg` under
/// `loose/` of the demo bucket (class folders numbered so that their sorted
/// order is their class), and writes their index; returns the dataset URI.
/// The same images as [`publish`]'s shards, for comparing the layouts.
pub async fn publish_loose(
    s3: &s3mem::RunningS3,
    spec: &SyntheticSpec,
) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let owned = spec.clone();
    let samples = tokio::task::spawn_blocking(move || synthesize_samples(&owned)).await?;
    let objects = samples
        .into_iter()
        .flatten()
        .map(|(key, jpeg, class)| (format!("{class:04}/{key}.jpg"), jpeg));
    upload_indexed(s3, LOOSE_PREFIX, objects).await
}

/// Synthesizes `spec`'s shards, uploads them through aws-sdk-s3 into `s3`
/// and writes their index; returns the dataset URI.
pub async fn publish(
    s3: &s3mem::RunningS3,
    spec: &SyntheticSpec,
) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let owned = spec.clone();
    let shards = tokio::task::spawn_blocking(move || synthesize_shards(&owned)).await?;
    upload_indexed(s3, DEMO_PREFIX, shards).await
}

/// Uploads `objects` (keys relative to `prefix`) into the demo bucket and
/// writes the index of the dataset they make; returns its URI.
pub(crate) async fn upload_indexed(
    s3: &s3mem::RunningS3,
    prefix: &str,
    objects: impl IntoIterator<Item = (String, Vec<u8>)>,
) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let client = crate::store::s3::client(&s3.s3_config()).await;
    // Already there when a second layout is published beside the first;
    // any other failure shows at the first upload.
    let _ = client.create_bucket().bucket(DEMO_BUCKET).send().await;
    let store: Arc<dyn ObjectStore> = Arc::new(S3Store::new(client, DEMO_BUCKET));
    for (key, data) in objects {
        store
            .put(&format!("{prefix}{key}"), Bytes::from(data))
            .await?;
    }
    let location = DatasetLocation::prefix(prefix);
    let (index, shard_indexes) = build_index(
        store.clone(),
        &location,
        &ReadConfig::default(),
        BadShardPolicy::Fail,
    )
    .await?;
    write_index(store.as_ref(), &location, &index, &shard_indexes).await?;
    Ok(format!("s3://{DEMO_BUCKET}/{prefix}"))
}
