//! Training augmentation end to end: each sample's crop box, flip and pixels
//! are a function of (seed, epoch, shard, key) alone, whatever the world
//! size, decode threads or resume point; the next epoch draws new ones.

mod common;

use std::collections::BTreeMap;

use common::*;
use shardfeed::server::pb;

/// 4 shards of 16 photos of a few sizes: 64 samples, 8 batches of 8.
fn photos() -> Vec<Vec<Sample>> {
    photo_shards(&[])
}

fn train(dataset: &str) -> pb::StreamBatchesRequest {
    train_request(dataset, 11)
}

/// What a sample received: its box (as bits, to compare exactly), flip,
/// label and pixels.
type Received = BTreeMap<String, ([u32; 4], bool, i64, Vec<u8>)>;

fn per_sample(batches: &[pb::Batch]) -> Received {
    let mut samples = Received::new();
    for batch in batches {
        let shape = batch.shape.as_ref().unwrap();
        let slot = (shape.height * shape.width * shape.channels) as usize;
        for (i, key) in batch.keys.iter().enumerate() {
            let crop = &batch.crops[i];
            let bits = [crop.left, crop.top, crop.width, crop.height].map(f32::to_bits);
            let pixels = batch.images[i * slot..(i + 1) * slot].to_vec();
            let previous =
                samples.insert(key.clone(), (bits, crop.flipped, batch.labels[i], pixels));
            assert!(previous.is_none(), "{key} delivered twice");
        }
    }
    samples
}

async fn ranks(
    client: &mut shardfeed::server::pb::shardfeed_client::ShardfeedClient<
        tonic::transport::Channel,
    >,
    request: pb::StreamBatchesRequest,
    world_size: u32,
) -> Vec<pb::Batch> {
    let mut all = Vec::new();
    for rank in 0..world_size {
        all.extend(
            collect(
                client,
                pb::StreamBatchesRequest {
                    rank,
                    world_size,
                    ..request.clone()
                },
            )
            .await
            .unwrap(),
        );
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sample_gets_the_same_crop_whatever_the_world_threads_or_resume() {
    let shards = photos();
    let one_thread = Harness::start(Options {
        decode_threads: 1,
        ..Options::default()
    })
    .await;
    let three_threads = Harness::start(Options {
        decode_threads: 3,
        ..Options::default()
    })
    .await;
    let uri = upload(&one_thread.s3, "data", "train/", &shards).await;
    let other_uri = upload(&three_threads.s3, "data", "train/", &shards).await;
    let mut client = one_thread.client().await;
    let mut other = three_threads.client().await;

    let reference = per_sample(&ranks(&mut client, train(&uri), 1).await);
    assert_eq!(reference.len(), 64);
    let flipped = reference.values().filter(|s| s.1).count();
    assert!((16..=48).contains(&flipped), "{flipped} of 64 flipped");
    let whole_image = reference
        .values()
        .filter(|s| s.0 == reference.values().next().unwrap().0)
        .count();
    assert!(whole_image < 8, "boxes should vary from sample to sample");

    let world_four = per_sample(&ranks(&mut client, train(&uri), 4).await);
    assert!(world_four == reference, "world size 4 changed a sample");
    let threads = per_sample(&ranks(&mut other, train(&other_uri), 1).await);
    assert!(threads == reference, "3 decode threads changed a sample");

    // Two batches at world size 1, then the rest of the epoch at world size
    // 2 (the same global batch of 8).
    let first = collect(&mut client, train(&uri)).await.unwrap();
    let mut resumed: Vec<pb::Batch> = first[..2].to_vec();
    let resume = pb::StreamBatchesRequest {
        resume_from: first[1].position.clone(),
        batch_size: Some(4),
        ..train(&uri)
    };
    resumed.extend(ranks(&mut client, resume, 2).await);
    assert!(
        per_sample(&resumed) == reference,
        "a resume changed a sample"
    );

    // The next epoch: new boxes for (nearly) every sample, same labels.
    let next = per_sample(
        &ranks(
            &mut client,
            pb::StreamBatchesRequest {
                epoch: 1,
                ..train(&uri)
            },
            1,
        )
        .await,
    );
    let changed = reference
        .iter()
        .filter(|(key, sample)| next[*key].0 != sample.0)
        .count();
    assert!(
        changed >= 60,
        "only {changed} of 64 boxes changed with the epoch"
    );
    assert!(reference.iter().all(|(key, s)| next[key].2 == s.2));
    one_thread.shutdown().await;
    three_threads.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flips_mirror_exactly_and_bad_ranges_name_their_field() {
    let harness = Harness::start(Options::default()).await;
    let uri = upload(&harness.s3, "data", "", &photos()[..1]).await;
    let mut client = harness.client().await;
    let with_flip = |p: f64| {
        let mut request = train(&uri);
        request.augmentation.as_mut().unwrap().horizontal_flip = p;
        request
    };
    let never = per_sample(&collect(&mut client, with_flip(0.0)).await.unwrap());
    let always = per_sample(&collect(&mut client, with_flip(1.0)).await.unwrap());
    let (height, width) = (24usize, 32usize);
    for (key, (bits, flipped, _, pixels)) in &never {
        let (mirror_bits, mirror_flipped, _, mirrored) = &always[key];
        assert!(!flipped && *mirror_flipped);
        assert_eq!(
            bits, mirror_bits,
            "{key}: the flip draw must not move the box"
        );
        for row in 0..height {
            for col in 0..width {
                let at = |x: usize| (row * width + x) * 3;
                assert_eq!(
                    pixels[at(col)..at(col) + 3],
                    mirrored[at(width - 1 - col)..at(width - 1 - col) + 3],
                    "{key} row {row} col {col}"
                );
            }
        }
    }

    let rrc = |scale_min, ratio_max| pb::Augmentation {
        crop: Some(pb::augmentation::Crop::RandomResizedCrop(
            pb::RandomResizedCrop {
                scale_min,
                ratio_max,
                ..Default::default()
            },
        )),
        horizontal_flip: 0.0,
        ..Default::default()
    };
    let recipe = common::trivial_augment_recipe;
    let cases = [
        (
            rrc(Some(0.0), None),
            "augmentation.random_resized_crop.scale",
        ),
        (
            rrc(None, Some(0.5)),
            "augmentation.random_resized_crop.ratio",
        ),
        (
            pb::Augmentation {
                horizontal_flip: 2.0,
                ..rrc(None, None)
            },
            "augmentation.horizontal_flip",
        ),
        (
            pb::Augmentation {
                crop: Some(pb::augmentation::Crop::CenterCrop(pb::CenterCrop {
                    resize: 10,
                })),
                horizontal_flip: 0.0,
                ..Default::default()
            },
            "augmentation.center_crop.resize",
        ),
        (
            pb::Augmentation {
                auto_augment: Some(pb::AutoAugment {
                    policy: Some(pb::auto_augment::Policy::RandAugment(pb::RandAugment {
                        magnitude: Some(40),
                        ..Default::default()
                    })),
                    ..Default::default()
                }),
                ..recipe()
            },
            "augmentation.auto_augment.rand_augment.magnitude",
        ),
        (
            pb::Augmentation {
                auto_augment: Some(pb::AutoAugment {
                    policy: Some(pb::auto_augment::Policy::TrivialAugmentWide(
                        pb::TrivialAugmentWide {
                            num_magnitude_bins: Some(0),
                        },
                    )),
                    ..Default::default()
                }),
                ..recipe()
            },
            "augmentation.auto_augment.trivial_augment_wide.num_magnitude_bins",
        ),
        (
            pb::Augmentation {
                auto_augment: Some(pb::AutoAugment {
                    policy: Some(pb::auto_augment::Policy::Imagenet(
                        pb::AutoAugmentImageNet {},
                    )),
                    interpolation: 7,
                    fill: vec![],
                }),
                ..recipe()
            },
            "augmentation.auto_augment.interpolation",
        ),
        (
            pb::Augmentation {
                grayscale: -0.5,
                ..recipe()
            },
            "augmentation.grayscale",
        ),
        (
            pb::Augmentation {
                color_jitter: Some(pb::ColorJitter {
                    hue: Some(pb::Range {
                        min: -0.7,
                        max: 0.2,
                    }),
                    ..Default::default()
                }),
                ..recipe()
            },
            "augmentation.color_jitter.hue",
        ),
        (
            pb::Augmentation {
                random_erasing: Some(pb::RandomErasing {
                    normalize_std: vec![0.229, 0.0, 0.225],
                    ..recipe().random_erasing.unwrap()
                }),
                ..recipe()
            },
            "augmentation.random_erasing.normalize_std",
        ),
        (
            pb::Augmentation {
                random_erasing: Some(pb::RandomErasing {
                    scale: Some(pb::Range { min: 0.5, max: 1.5 }),
                    ..recipe().random_erasing.unwrap()
                }),
                ..recipe()
            },
            "augmentation.random_erasing.scale",
        ),
        (
            pb::Augmentation {
                random_erasing: Some(pb::RandomErasing {
                    p: 1.5,
                    ..recipe().random_erasing.unwrap()
                }),
                ..recipe()
            },
            "augmentation.random_erasing.p",
        ),
    ];
    for (augmentation, field) in cases {
        let status = collect(
            &mut client,
            pb::StreamBatchesRequest {
                augmentation: Some(augmentation),
                ..request(&uri)
            },
        )
        .await
        .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert_eq!(bad_field(&status), field, "{}", status.message());
    }
    let status = collect(
        &mut client,
        pb::StreamBatchesRequest {
            resize: pb::ResizeMode::Stretch as i32,
            ..train(&uri)
        },
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert_eq!(bad_field(&status), "resize");
    harness.shutdown().await;
}
