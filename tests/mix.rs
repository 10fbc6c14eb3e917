//! Mixed streams end to end: a tar dataset and a TFRecord dataset on the
//! loopback S3 server, weighted in one stream through gRPC.

mod common;

use std::collections::{BTreeMap, HashSet};

use common::*;
use shardfeed::server::pb;
use shardfeed::shard::tfrecord::{example_bytes, write_record};

const TAR_SAMPLES: usize = 100;
const RECORDS: usize = 60;

/// A tar dataset of 100 samples and a TFRecord dataset of 60, uploaded.
async fn two_sources(harness: &Harness) -> (String, String) {
    let tar = upload(
        &harness.s3,
        "mix",
        "tar/",
        &simple_dataset(4, TAR_SAMPLES / 4),
    )
    .await;
    let shards: Vec<(String, Vec<u8>)> = (0..3)
        .map(|s| {
            let mut out = Vec::new();
            for i in 0..RECORDS / 3 {
                let n = (s * (RECORDS / 3) + i) as u64;
                write_record(
                    &mut out,
                    &example_bytes(&jpeg(36, 28, 500 + n), Some(7), &[]),
                );
            }
            (format!("records/part-{s:05}.tfrecord"), out)
        })
        .collect();
    put_objects(&harness.s3, "mix", shards).await;
    (tar, "s3://mix/records/".to_string())
}

fn mixed(tar: &str, records: &str, weights: [f64; 2]) -> pb::StreamBatchesRequest {
    pb::StreamBatchesRequest {
        dataset: String::new(),
        sources: vec![
            pb::MixSource {
                dataset: tar.into(),
                weight: weights[0],
                layout: None,
            },
            pb::MixSource {
                dataset: records.into(),
                weight: weights[1],
                // This source's own labels: 1000 + the stored 7.
                layout: Some(pb::SampleLayout {
                    label_offset: 1000,
                    ..Default::default()
                }),
            },
        ],
        seed: 11,
        augmentation: Some(pb::Augmentation {
            crop: Some(pb::augmentation::Crop::RandomResizedCrop(
                pb::RandomResizedCrop::default(),
            )),
            horizontal_flip: 0.5,
            ..Default::default()
        }),
        ..request("")
    }
}

fn at(
    request: &pb::StreamBatchesRequest,
    rank: u32,
    world: u32,
    batch: u32,
) -> pb::StreamBatchesRequest {
    pb::StreamBatchesRequest {
        rank,
        world_size: world,
        batch_size: Some(batch),
        ..request.clone()
    }
}

/// A sample's identity in a mixed stream: (source, source-epoch, shard, key).
type Id = (u32, u64, String, String);

fn ids(batch: &pb::Batch) -> Vec<Id> {
    (0..batch.keys.len())
        .map(|i| {
            (
                batch.sample_sources[i],
                batch.sample_source_epochs[i],
                batch.shards[i].clone(),
                batch.keys[i].clone(),
            )
        })
        .collect()
}

/// Every rank's stream, as global steps: step t holds each rank's batch t.
async fn global_steps(
    harness: &Harness,
    request: &pb::StreamBatchesRequest,
    world: u32,
    batch: u32,
) -> Vec<Vec<pb::Batch>> {
    let mut client = harness.client().await;
    let mut ranks = Vec::new();
    for rank in 0..world {
        ranks.push(
            collect(&mut client, at(request, rank, world, batch))
                .await
                .unwrap(),
        );
    }
    let steps = ranks[0].len();
    assert!(
        ranks.iter().all(|r| r.len() == steps),
        "equal batch counts per rank"
    );
    (0..steps)
        .map(|t| ranks.iter().map(|r| r[t].clone()).collect())
        .collect()
}

fn source_counts(step: &[pb::Batch]) -> [u64; 2] {
    let mut counts = [0; 2];
    for batch in step {
        for &k in &batch.sample_sources {
            counts[k as usize] += 1;
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_global_batch_holds_each_sources_share_at_any_world_size() {
    let harness = Harness::start(Options::default()).await;
    let (tar, records) = two_sources(&harness).await;
    let request = mixed(&tar, &records, [0.7, 0.3]);
    let two = global_steps(&harness, &request, 2, 8).await;
    // 160 samples, global batch 16: 10 steps.
    assert_eq!(two.len(), 10);
    let mut taken = [0u64; 2];
    for (t, step) in two.iter().enumerate() {
        let counts = source_counts(step);
        assert_eq!(counts[0] + counts[1], 16);
        assert!(counts[0] == 11 || counts[0] == 12, "step {t}: {counts:?}");
        taken[0] += counts[0];
        taken[1] += counts[1];
        // Every prefix within one sample of 70%.
        let share = 0.7 * 16.0 * (t + 1) as f64;
        assert!((taken[0] as f64 - share).abs() < 1.0, "step {t}: {taken:?}");
        for batch in step {
            assert_eq!(batch.keys.len(), 8);
            assert_eq!(batch.epoch_steps, 10);
            for (i, &k) in batch.sample_sources.iter().enumerate() {
                // The TFRecord source's own label offset.
                assert_eq!(batch.labels[i] >= 1000, k == 1);
            }
        }
    }
    // Ranks disjoint; within a source-epoch no sample twice. The tar
    // source (112 of 100 taken) runs out and starts its epoch 1.
    let all: Vec<Id> = two.iter().flatten().flat_map(ids).collect();
    let distinct: HashSet<&Id> = all.iter().collect();
    assert_eq!(distinct.len(), all.len());
    let tar_epoch0 = all.iter().filter(|(k, e, _, _)| *k == 0 && *e == 0).count();
    let tar_epoch1 = all.iter().filter(|(k, e, _, _)| *k == 0 && *e == 1).count();
    assert_eq!(
        (tar_epoch0, tar_epoch1),
        (TAR_SAMPLES, taken[0] as usize - TAR_SAMPLES)
    );

    // One rank of 16: the same samples in every global batch, the same pixels.
    let one = global_steps(&harness, &request, 1, 16).await;
    assert_eq!(one.len(), 10);
    let pixels = |steps: &[Vec<pb::Batch>]| {
        let mut by_id: BTreeMap<Id, Vec<u8>> = BTreeMap::new();
        for batch in steps.iter().flatten() {
            let slot = batch.images.len() / batch.keys.len();
            for (i, id) in ids(batch).into_iter().enumerate() {
                by_id.insert(id, batch.images[i * slot..(i + 1) * slot].to_vec());
            }
        }
        by_id
    };
    for (t, (a, b)) in one.iter().zip(&two).enumerate() {
        assert_eq!(source_counts(a), source_counts(b), "step {t}");
    }
    let (one_pixels, two_pixels) = (pixels(&one), pixels(&two));
    let common: Vec<&Id> = one_pixels
        .keys()
        .filter(|id| two_pixels.contains_key(*id))
        .collect();
    assert!(
        common.len() > 100,
        "most samples are read at both world sizes"
    );
    for id in common {
        assert_eq!(
            one_pixels[id], two_pixels[id],
            "{id:?}: pixels depend on the world size"
        );
    }
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_at_another_world_size_with_new_weights_continues_every_source() {
    let harness = Harness::start(Options::default()).await;
    let (tar, records) = two_sources(&harness).await;
    let request = mixed(&tar, &records, [0.7, 0.3]);
    let whole = global_steps(&harness, &request, 2, 8).await;
    let done: Vec<Id> = whole[..4].iter().flatten().flat_map(ids).collect();
    let position = whole[3][0].position.clone().expect("a position");

    // Resumed at the same world size: exactly the tail, pixels and all.
    let resumed = pb::StreamBatchesRequest {
        resume_from: Some(position.clone()),
        ..request.clone()
    };
    let tail = global_steps(&harness, &resumed, 2, 8).await;
    assert_eq!(tail.len(), 6);
    for (a, b) in tail.iter().zip(&whole[4..]) {
        for (got, want) in a.iter().zip(b) {
            assert_eq!(ids(got), ids(want));
            assert_eq!(got.images, want.images);
        }
    }

    // At one rank of 16: the unread rest of every source-epoch is regrouped
    // over the new ranks, so the steps' samples differ, but each step holds
    // the same counts and nothing of a source-epoch is read twice or skipped.
    let tail = global_steps(&harness, &resumed, 1, 16).await;
    assert_eq!(tail.len(), 6);
    for (t, (a, b)) in tail.iter().zip(&whole[4..]).enumerate() {
        assert_eq!(source_counts(a), source_counts(b), "step {}", t + 4);
    }
    let after: Vec<Id> = tail.iter().flatten().flat_map(ids).collect();
    let all: HashSet<&Id> = done.iter().chain(&after).collect();
    assert_eq!(all.len(), done.len() + after.len());
    let tar_epoch0 = all.iter().filter(|(k, e, _, _)| *k == 0 && *e == 0).count();
    assert_eq!(
        tar_epoch0, TAR_SAMPLES,
        "the tar source's epoch 0, every sample once"
    );

    // Reweighted at the resume: 50/50 exactly from there, nothing repeated.
    let reweighted = pb::StreamBatchesRequest {
        resume_from: Some(position),
        weight_changes: vec![pb::WeightChange {
            from_step: 0,
            weights: vec![0.7, 0.3],
        }],
        ..mixed(&tar, &records, [1.0, 1.0])
    };
    let tail = global_steps(&harness, &reweighted, 2, 8).await;
    assert_eq!(tail.len(), 6);
    for step in &tail {
        assert_eq!(source_counts(step), [8, 8]);
    }
    let after: Vec<Id> = tail.iter().flatten().flat_map(ids).collect();
    let all: HashSet<&Id> = done.iter().chain(&after).collect();
    assert_eq!(
        all.len(),
        done.len() + after.len(),
        "no sample twice in a source-epoch"
    );
    // The TFRecord source (60) runs out at 50%: its epoch 1 begins.
    assert!(after.iter().any(|(k, e, _, _)| *k == 1 && *e == 1));
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_weights_and_sources_are_invalid_arguments_naming_the_field() {
    let harness = Harness::start(Options::default()).await;
    let (tar, records) = two_sources(&harness).await;
    let mut client = harness.client().await;
    let cases: Vec<(pb::StreamBatchesRequest, &str)> = vec![
        (mixed(&tar, &records, [0.7, -0.3]), "sources[1].weight"),
        (mixed(&tar, &records, [0.0, 0.0]), "every weight is 0"),
        (mixed(&tar, &records, [f64::NAN, 1.0]), "sources[0].weight"),
        (
            pb::StreamBatchesRequest {
                sources: (0..17)
                    .map(|_| mixed(&tar, &records, [1.0, 1.0]).sources[0].clone())
                    .collect(),
                ..mixed(&tar, &records, [1.0, 1.0])
            },
            "2 to 16",
        ),
        (
            pb::StreamBatchesRequest {
                partition: pb::Partition::Pad as i32,
                ..mixed(&tar, &records, [1.0, 1.0])
            },
            "PARTITION_PAD",
        ),
        (
            pb::StreamBatchesRequest {
                dataset: tar.clone(),
                ..mixed(&tar, &records, [1.0, 1.0])
            },
            "sources only",
        ),
        (
            pb::StreamBatchesRequest {
                weight_changes: vec![pb::WeightChange {
                    from_step: 0,
                    weights: vec![1.0],
                }],
                ..mixed(&tar, &records, [1.0, 1.0])
            },
            "weight_changes[0]",
        ),
    ];
    for (request, field) in cases {
        let status = collect(&mut client, request).await.unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{field}: {status:?}"
        );
        assert!(
            status.message().contains(field),
            "{field}: {}",
            status.message()
        );
        let named = match field {
            "every weight is 0" | "2 to 16" => "sources",
            "PARTITION_PAD" => "partition",
            "sources only" => "dataset",
            "weight_changes[0]" => "weight_changes[0].weights",
            field => field,
        };
        assert_eq!(bad_field(&status), named, "{field}");
    }
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_keeps_where_the_weights_began_and_streams_the_same_tail() {
    let harness = Harness::start(Options::default()).await;
    let (tar, records) = two_sources(&harness).await;
    // Weights changed at step 0 of this epoch's request: [1, 1] before it.
    let request = pb::StreamBatchesRequest {
        epoch: 1,
        weight_changes: vec![pb::WeightChange {
            from_step: 0,
            weights: vec![1.0, 1.0],
        }],
        ..mixed(&tar, &records, [3.0, 1.0])
    };
    let whole = global_steps(&harness, &request, 1, 16).await;
    assert_eq!(whole.len(), 10);
    // A reconnect after 4 batches says where the current weights began
    // (epoch 1's first step, 10): the tail is the uninterrupted one's.
    let resumed = pb::StreamBatchesRequest {
        resume_from: Some(pb::EpochPosition {
            segments: vec![pb::PositionSegment {
                world_size: 1,
                batches: 4,
            }],
            ..Default::default()
        }),
        weights_from_step: Some(10),
        ..request.clone()
    };
    let tail = global_steps(&harness, &resumed, 1, 16).await;
    let keys =
        |steps: &[Vec<pb::Batch>]| -> Vec<Id> { steps.iter().flatten().flat_map(ids).collect() };
    assert_eq!(keys(&tail), keys(&whole[4..]));

    // Where the weights began is checked against the request.
    for (weights_from_step, field) in [(Some(15), "after this request's first step")] {
        let status = collect(
            &mut harness.client().await,
            at(
                &pb::StreamBatchesRequest {
                    weights_from_step,
                    ..resumed.clone()
                },
                0,
                1,
                16,
            ),
        )
        .await
        .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(field), "{}", status.message());
        assert_eq!(bad_field(&status), "weights_from_step");
    }
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_spelled_without_its_slash_is_the_same_source() {
    let harness = Harness::start(Options::default()).await;
    let (tar, records) = two_sources(&harness).await;
    let request = mixed(&tar, &records, [0.7, 0.3]);
    let slashless = mixed(tar.trim_end_matches('/'), &records, [0.7, 0.3]);
    assert_ne!(request.sources[0].dataset, slashless.sources[0].dataset);
    let keys =
        |steps: &[Vec<pb::Batch>]| -> Vec<Id> { steps.iter().flatten().flat_map(ids).collect() };
    assert_eq!(
        keys(&global_steps(&harness, &request, 2, 8).await),
        keys(&global_steps(&harness, &slashless, 2, 8).await),
        "one source, one shuffle, however it is spelled"
    );
    harness.shutdown().await;
}
