//! CPU per sample of the self-supervised recipes' views against one crop,
//! on one thread, on synthetic ~110 KB photos (about ImageNet's mean):
//! `cargo run --release --features turbojpeg --example views_cost [-- ROUNDS [FOLDER]]`
//! (FOLDER: measure its JPEGs, or write the synthetic photos there first;
//! `python -m shardfeed_benchmarks.views` runs DINOv2's and SimCLR's own
//! PIL pipelines on them against these rows).
//!
//! Rows, each a whole sample made (decode, resizes, ops):
//! - `one global crop`: one 224² RandomResizedCrop(0.32, 1), bicubic, with
//!   DINOv2's first global pipeline (flip, ColorJitter p 0.8, grayscale
//!   p 0.2, blur p 1.0): the baseline of issue 70's 2.0× bar;
//! - `dinov2 2 global + 8 local`: DINOv2's views (the second global with
//!   blur p 0.1 and solarize p 0.2; 8 local 96² crops of scale 0.05–0.32
//!   with blur p 0.5), decoded once;
//! - `dinov2, each view decoded alone`: the same views, one decode each
//!   (what zipping streams, or a loader cropping per view from a fresh
//!   decode, pays);
//! - `dinov2, whole-image decode`: the views from a full-size decode (the
//!   region policy's alternative);
//! - `simclr 1 view` and `simclr 2 views`: SimCLR's 224² pipeline
//!   (scale 0.08–1, flip, jitter 0.8 of 0.8 strength, grayscale 0.2, blur
//!   p 0.5 with a 23-pixel kernel), one view and two (the 1.3× bar).
//!
//! - the same rows with every op off (`no ops`): the decode and resizes
//!   alone, to tell the ops' share; and SimCLR's view with only its
//!   ColorJitter, or only its blur.
//!
//! Rows run interleaved, one pass over the photos per round; the median
//! round is reported, and the ratios are of medians of the same rounds.

use std::time::Instant;

use shardfeed::decode::{
    decode_bounded, decode_views_bounded, default_decoder, Coin, ColorJitter, Crop, Decoder,
    GaussianBlur, Grayscale, HorizontalFlip, Ops, OutputSpec, RandomResizedCrop, Resample,
    SampleKey, ScratchBudget, Solarize, ViewGroup, Views,
};
use shardfeed::shard::ImageFormat;

fn crop(side: u32, scale: (f64, f64), ops: Ops) -> OutputSpec {
    OutputSpec {
        height: side,
        width: side,
        crop: Crop::RandomResized(RandomResizedCrop {
            scale,
            ..RandomResizedCrop::default()
        }),
        resample: Resample::Bicubic,
        ops,
    }
}

fn jitter(brightness: f64, contrast: f64, saturation: f64, hue: f64) -> ColorJitter {
    let around_one = |x: f64| Some((1.0 - x, 1.0 + x));
    ColorJitter {
        brightness: around_one(brightness),
        contrast: around_one(contrast),
        saturation: around_one(saturation),
        hue: Some((-hue, hue)),
        p: 0.8,
    }
}

fn blur(kernel: u32, p: f64) -> GaussianBlur {
    GaussianBlur {
        kernel: (kernel, kernel),
        sigma: (0.1, 2.0),
        p,
    }
}

/// DINOv2's `DataAugmentationDINO` ops (dinov2/data/augmentations.py).
fn dino_ops(blur_p: f64, solarize_p: f64) -> Ops {
    Ops {
        horizontal_flip: HorizontalFlip(0.5),
        color_jitter: jitter(0.4, 0.4, 0.2, 0.1),
        grayscale: Coin {
            kernel: Grayscale,
            p: 0.2,
        },
        gaussian_blur: blur(9, blur_p),
        solarize: Coin {
            kernel: Solarize { threshold: 128.0 },
            p: solarize_p,
        },
        ..Ops::NONE
    }
}

fn dino() -> Views {
    Views {
        groups: vec![
            ViewGroup {
                views: vec![
                    crop(224, (0.32, 1.0), dino_ops(1.0, 0.0)),
                    crop(224, (0.32, 1.0), dino_ops(0.1, 0.2)),
                ],
            },
            ViewGroup::repeated(8, crop(96, (0.05, 0.32), dino_ops(0.5, 0.0))),
        ],
    }
}

fn simclr(count: u32) -> Views {
    let ops = Ops {
        horizontal_flip: HorizontalFlip(0.5),
        color_jitter: jitter(0.8, 0.8, 0.8, 0.2),
        grayscale: Coin {
            kernel: Grayscale,
            p: 0.2,
        },
        gaussian_blur: blur(23, 0.5),
        ..Ops::NONE
    };
    Views {
        groups: vec![ViewGroup::repeated(count, crop(224, (0.08, 1.0), ops))],
    }
}

/// How a row makes a sample.
enum Make {
    /// One decode per view (one view: the one-crop baseline).
    EachAlone(Views),
    /// One decode for all views.
    Together(Views),
    /// One whole-image decode for all views.
    Whole(Views),
}

struct Row {
    name: &'static str,
    make: Make,
    rounds: Vec<f64>,
}

fn key(sample: u64) -> SampleKey {
    SampleKey {
        seed: 1,
        epoch: 0,
        sample,
        copy: 0,
    }
}

/// Seconds to make every photo's sample once.
fn pass(make: &Make, decoder: &dyn Decoder, photos: &[bytes::Bytes]) -> f64 {
    let budget = ScratchBudget::new(1 << 30);
    let views = match make {
        Make::EachAlone(v) | Make::Together(v) | Make::Whole(v) => v,
    };
    let mut outs: Vec<Vec<u8>> = views.specs().map(|s| vec![0u8; s.bytes()]).collect();
    let whole = WholeImage;
    let started = Instant::now();
    for (i, jpeg) in photos.iter().enumerate() {
        let key = key(i as u64);
        match make {
            Make::EachAlone(_) => {
                let mut at = 0;
                for (g, group) in views.groups.iter().enumerate() {
                    for (v, spec) in group.views.iter().enumerate() {
                        let own = shardfeed::decode::view_key(&key, g as u32, v as u32);
                        decode_bounded(
                            decoder,
                            &budget,
                            ImageFormat::Jpeg,
                            jpeg,
                            spec,
                            &own,
                            &mut outs[at],
                        )
                        .expect("decodes");
                        at += 1;
                    }
                }
            }
            Make::Together(_) | Make::Whole(_) => {
                let used: &dyn Decoder = match make {
                    Make::Whole(_) => &whole,
                    _ => decoder,
                };
                let mut slices: Vec<&mut [u8]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
                decode_views_bounded(
                    used,
                    &budget,
                    ImageFormat::Jpeg,
                    jpeg,
                    views,
                    &key,
                    &mut slices,
                )
                .expect("decodes");
            }
        }
        std::hint::black_box(&outs);
    }
    started.elapsed().as_secs_f64()
}

/// The shipped decoder's single-crop path, and the views' whole-image
/// path (`Decoder::decode_views_into`'s default).
#[derive(Debug)]
struct WholeImage;

impl Decoder for WholeImage {
    fn decode_into(
        &self,
        format: ImageFormat,
        data: &[u8],
        spec: &OutputSpec,
        crop: &shardfeed::decode::CropBox,
        out: &mut [u8],
    ) -> Result<(), shardfeed::decode::DecodeError> {
        default_decoder().decode_into(format, data, spec, crop, out)
    }
}

/// The same views with every op off: what the decode and resizes cost.
fn without_ops(views: Views) -> Views {
    only(views, |_| Ops::NONE)
}

/// The same views with only the ops `keep` leaves.
fn only(views: Views, keep: impl Fn(&Ops) -> Ops) -> Views {
    Views {
        groups: views
            .groups
            .into_iter()
            .map(|g| ViewGroup {
                views: g
                    .views
                    .into_iter()
                    .map(|v| OutputSpec {
                        ops: keep(&v.ops),
                        ..v
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// Photos measured on (about ImageNet's mean: 500x375, ~110 KB).
const PHOTOS: usize = 48;

/// The JPEGs of `folder`, in name order; a missing or empty folder gets
/// the synthetic photos written first (so another process, the Python
/// baseline, measures the same bytes).
fn photos_in(folder: &std::path::Path) -> Vec<bytes::Bytes> {
    let listed = |folder: &std::path::Path| -> Vec<std::path::PathBuf> {
        let mut names: Vec<_> = std::fs::read_dir(folder)
            .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        names.retain(|p| p.extension().is_some_and(|e| e == "jpg"));
        names.sort();
        names
    };
    if listed(folder).is_empty() {
        std::fs::create_dir_all(folder).expect("makes the photos' folder");
        let photos = shardfeed::dev::synthetic::photos(&Default::default(), PHOTOS);
        for (i, jpeg) in photos.iter().enumerate() {
            std::fs::write(folder.join(format!("photo-{i:04}.jpg")), jpeg).expect("writes");
        }
    }
    listed(folder)
        .iter()
        .map(|path| std::fs::read(path).expect("reads a photo").into())
        .collect()
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(7);
    let photos = match std::env::args().nth(2) {
        Some(folder) => photos_in(std::path::Path::new(&folder)),
        None => shardfeed::dev::synthetic::photos(&Default::default(), PHOTOS),
    };
    let decoder = default_decoder();
    let one = Views {
        groups: vec![ViewGroup::repeated(
            1,
            crop(224, (0.32, 1.0), dino_ops(1.0, 0.0)),
        )],
    };
    let mut rows = vec![
        Row {
            name: "one global crop",
            make: Make::EachAlone(one.clone()),
            rounds: Vec::new(),
        },
        Row {
            name: "dinov2 2 global + 8 local",
            make: Make::Together(dino()),
            rounds: Vec::new(),
        },
        Row {
            name: "dinov2, each view decoded alone",
            make: Make::EachAlone(dino()),
            rounds: Vec::new(),
        },
        Row {
            name: "dinov2, whole-image decode",
            make: Make::Whole(dino()),
            rounds: Vec::new(),
        },
        Row {
            name: "simclr 1 view",
            make: Make::Together(simclr(1)),
            rounds: Vec::new(),
        },
        Row {
            name: "simclr 2 views",
            make: Make::Together(simclr(2)),
            rounds: Vec::new(),
        },
        Row {
            name: "one global crop, no ops",
            make: Make::EachAlone(without_ops(one)),
            rounds: Vec::new(),
        },
        Row {
            name: "dinov2 views, no ops",
            make: Make::Together(without_ops(dino())),
            rounds: Vec::new(),
        },
        Row {
            name: "simclr 1 view, no ops",
            make: Make::Together(without_ops(simclr(1))),
            rounds: Vec::new(),
        },
        Row {
            name: "simclr 2 views, no ops",
            make: Make::Together(without_ops(simclr(2))),
            rounds: Vec::new(),
        },
        Row {
            name: "simclr 1 view, ColorJitter alone",
            make: Make::Together(only(simclr(1), |ops| Ops {
                color_jitter: ops.color_jitter,
                ..Ops::NONE
            })),
            rounds: Vec::new(),
        },
        Row {
            name: "simclr 1 view, blur alone",
            make: Make::Together(only(simclr(1), |ops| Ops {
                gaussian_blur: ops.gaussian_blur,
                ..Ops::NONE
            })),
            rounds: Vec::new(),
        },
    ];
    // One pass each to warm caches and thread-local scratch.
    for row in &rows {
        pass(&row.make, decoder.as_ref(), &photos[..4]);
    }
    for _ in 0..rounds {
        for row in &mut rows {
            let seconds = pass(&row.make, decoder.as_ref(), &photos);
            row.rounds.push(seconds / photos.len() as f64);
        }
    }
    println!(
        "decoder: {}; {} photos, {rounds} rounds, one thread",
        decoder.name(),
        photos.len()
    );
    let base = median(&rows[0].rounds);
    let simclr_one = median(&rows[4].rounds);
    for row in &rows {
        let ms = median(&row.rounds) * 1e3;
        let per_round: Vec<String> = rows[0]
            .rounds
            .iter()
            .zip(&row.rounds)
            .map(|(b, r)| format!("{:.2}", r / b))
            .collect();
        println!(
            "{:34} {ms:7.3} ms/sample  {:5.2}x one crop  (per round: {})",
            row.name,
            ms / (base * 1e3),
            per_round.join(" ")
        );
    }
    println!(
        "simclr 2 views / 1 view: {:.2}x",
        median(&rows[5].rounds) / simclr_one
    );
}
