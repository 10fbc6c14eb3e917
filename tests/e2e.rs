//! End to end: shards written through aws-sdk-s3 into a real S3-compatible
//! server on loopback, read by shardfeed, streamed over real gRPC.

mod common;

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use common::*;
use shardfeed::server::pb;
use shardfeed::server::ListenAddr;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_counts_labels_and_keys_match_what_was_written() {
    let harness = Harness::start(Options::default()).await;
    let shards = simple_dataset(3, 13); // 39 samples: not a multiple of 8
    let uri = upload(&harness.s3, "data", "train/", &shards).await;
    let mut client = harness.client().await;

    let info = describe(&mut client, &uri, 1, 8).await;
    assert_eq!(
        (info.shards, info.samples, info.batches_per_rank),
        (3, 39, 4)
    );
    assert_eq!(info.dropped_per_epoch, 7);

    // Stored order: shuffle off, one rank.
    let batches = collect(&mut client, unshuffled(&uri)).await.unwrap();
    assert_eq!(batches.len() as u64, info.batches_per_rank);
    assert!(batches
        .iter()
        .all(|b| b.epoch_steps == info.batches_per_rank));
    let written: Vec<_> = shards.iter().flatten().collect();
    for (i, (key, label)) in batches
        .iter()
        .flat_map(|b| b.keys.iter().zip(&b.labels))
        .enumerate()
    {
        assert_eq!(key, &written[i].key);
        assert_eq!(label.to_string(), *written[i].label.as_ref().unwrap());
    }
    for (i, batch) in batches.iter().enumerate() {
        let shape = batch.shape.unwrap();
        assert_eq!(
            (shape.n, shape.height, shape.width, shape.channels),
            (8, 24, 32, 3)
        );
        assert_eq!(batch.images.len(), 8 * 24 * 32 * 3);
        assert_eq!(batch.index, i as u64);
        assert!(batch.substituted.is_empty());
        assert!(batch.images.iter().any(|&p| p != 0));
    }

    // Shuffled: the same samples, once each, in another order.
    let shuffled = collect(&mut client, request(&uri)).await.unwrap();
    let keys = keys(&shuffled);
    assert_eq!(keys.len(), 32);
    assert_eq!(keys.iter().collect::<HashSet<_>>().len(), 32);
    assert_ne!(keys, common::keys(&batches));
    harness.shutdown().await;
}

/// Mean absolute difference between two images, and the share of values
/// that differ by more than 8.
fn difference(a: &[u8], b: &[u8]) -> (f64, f64) {
    assert_eq!(a.len(), b.len());
    let sum: u64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| u64::from(x.abs_diff(*y)))
        .sum();
    let far = a.iter().zip(b).filter(|(x, y)| x.abs_diff(**y) > 8).count();
    (sum as f64 / a.len() as f64, far as f64 / a.len() as f64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pixels_match_a_reference_resize() {
    // A lossless PNG source, so the only difference is the resize itself.
    let source = image::RgbImage::from_fn(64, 48, |x, y| {
        image::Rgb([(x * 4) as u8, (y * 5) as u8, ((x * y) % 256) as u8])
    });
    let mut png = Vec::new();
    source
        .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    let samples = vec![Sample {
        key: "only".into(),
        image: Some(("png", png)),
        label: Some("3".into()),
    }];
    let harness = Harness::start(Options::default()).await;
    let uri = upload(&harness.s3, "pixels", "", &[samples]).await;
    let mut client = harness.client().await;

    // Center crop of 64x48 to 24x24: the middle 48x48, scaled by 1/2.
    let cropped = collect(
        &mut client,
        pb::StreamBatchesRequest {
            batch_size: Some(1),
            height: 24,
            width: 24,
            ..request(&uri)
        },
    )
    .await
    .unwrap();
    let reference = image::imageops::resize(
        &image::imageops::crop_imm(&source, 8, 0, 48, 48).to_image(),
        24,
        24,
        image::imageops::FilterType::Triangle,
    );
    let (mean, far) = difference(&cropped[0].images, reference.as_raw());
    // Stated tolerance: both are bilinear (triangle) convolutions that differ
    // only in rounding and edge handling; the blue channel's wrap-around
    // edges make a few values differ more.
    assert!(
        mean <= 1.0 && far <= 0.01,
        "center crop differs: mean {mean}, share over 8 {far}"
    );
    assert_eq!(cropped[0].labels, vec![3]);

    // Stretch to 16x40 ignores the aspect ratio.
    let stretched = collect(
        &mut client,
        pb::StreamBatchesRequest {
            batch_size: Some(1),
            height: 16,
            width: 40,
            resize: pb::ResizeMode::Stretch as i32,
            ..request(&uri)
        },
    )
    .await
    .unwrap();
    let reference = image::imageops::resize(&source, 40, 16, image::imageops::FilterType::Triangle);
    let (mean, far) = difference(&stretched[0].images, reference.as_raw());
    assert!(
        mean <= 1.0 && far <= 0.01,
        "stretch differs: mean {mean}, share over 8 {far}"
    );
    // The augmentation's stretch is the legacy mode's, pixel for pixel.
    let named = collect(
        &mut client,
        pb::StreamBatchesRequest {
            batch_size: Some(1),
            height: 16,
            width: 40,
            augmentation: Some(pb::Augmentation {
                crop: Some(pb::augmentation::Crop::Stretch(pb::Stretch {})),
                horizontal_flip: 0.0,
                ..Default::default()
            }),
            ..request(&uri)
        },
    )
    .await
    .unwrap();
    assert_eq!(named[0].images, stretched[0].images);
    assert_eq!(named[0].crops, stretched[0].crops);
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_statuses() {
    let harness = Harness::start(Options::default()).await;
    let uri = upload(&harness.s3, "data", "", &simple_dataset(1, 4)).await;
    let mut client = harness.client().await;

    let status = collect(&mut client, request("s3://no-such-bucket/x/"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    assert!(
        status.message().contains("no-such-bucket"),
        "{}",
        status.message()
    );

    let status = collect(
        &mut client,
        pb::StreamBatchesRequest {
            batch_size: Some(0),
            ..request(&uri)
        },
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(bad_field(&status), "batch_size", "{}", status.message());

    let status = collect(
        &mut client,
        pb::StreamBatchesRequest {
            batch_size: Some(5),
            ..request(&uri)
        },
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(bad_field(&status), "batch_size");
    assert!(
        status.message().contains("fewer than one global batch"),
        "{}",
        status.message()
    );

    for (bad, what) in [
        (
            pb::StreamBatchesRequest {
                rank: 2,
                world_size: 2,
                // Small enough for two ranks: the rank is what is wrong.
                batch_size: Some(1),
                ..request(&uri)
            },
            "rank",
        ),
        (
            pb::StreamBatchesRequest {
                height: 100_000,
                ..request(&uri)
            },
            "output size",
        ),
        (
            pb::StreamBatchesRequest {
                dataset: "gs://x/".into(),
                ..request(&uri)
            },
            "expected s3://",
        ),
        (
            pb::StreamBatchesRequest {
                start_batch: 99,
                batch_size: Some(2),
                ..request(&uri)
            },
            "start_batch",
        ),
    ] {
        let status = collect(&mut client, bad).await.unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{what}: {status:?}"
        );
        assert!(
            status.message().contains(what),
            "{what}: {}",
            status.message()
        );
        let field = match what {
            "output size" => "height",
            "expected s3://" => "dataset",
            field => field,
        };
        assert_eq!(bad_field(&status), field, "{what}");
    }
    harness.shutdown().await;
}

/// Checks that every substituted slot holds an exact copy of the image,
/// label and crop box of the good slot it names, chosen as documented.
fn assert_substitutes_copy_their_source(batch: &pb::Batch, slot_bytes: usize) {
    let good: Vec<u32> = (0..batch.labels.len() as u32)
        .filter(|slot| !batch.substituted.contains(slot))
        .collect();
    assert_eq!(batch.substitute_sources.len(), batch.substituted.len());
    for (&slot, &source) in batch.substituted.iter().zip(&batch.substitute_sources) {
        let slot = slot as usize;
        let pixels = &batch.images[slot * slot_bytes..(slot + 1) * slot_bytes];
        let expected = shardfeed::pipeline::substitute_source(&batch.keys[slot], &good);
        match expected {
            Some(from) => {
                assert_eq!(source, from as i32, "slot {slot}");
                let from = from as usize;
                assert_eq!(
                    pixels,
                    &batch.images[from * slot_bytes..(from + 1) * slot_bytes]
                );
                assert_eq!(batch.labels[slot], batch.labels[from]);
                assert_eq!(batch.crops[slot], batch.crops[from]);
            }
            None => {
                assert_eq!(source, -1);
                assert!(pixels.iter().all(|&v| v == 0));
                assert_eq!(batch.labels[slot], -1);
                assert_eq!(batch.crops[slot], pb::CropBox::default());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn substitutes_in_reused_buffers_are_whole_copies_of_a_good_sample() {
    // Batch buffers are reused once sent (at most decode_ahead + ready + 1
    // alive), so by batch 6 of 10 every buffer has held an earlier batch: a
    // substitute must overwrite its whole slot. Batch 9 fails entirely: no
    // sample to copy, so zeros and label -1.
    let mut shards = simple_dataset(1, 80);
    let mut corrupt: Vec<usize> = (6..9).map(|batch| batch * 8 + 3).collect();
    corrupt.extend(72..80);
    for &index in &corrupt {
        shards[0][index].image = Some(("jpg", b"not a jpeg".to_vec()));
    }
    let harness = Harness::start(Options::default()).await;
    let uri = upload(&harness.s3, "data", "", &shards).await;
    let mut client = harness.client().await;
    let batches = collect(&mut client, unshuffled(&uri)).await.unwrap();
    assert_eq!(batches.len(), 10);
    let slot = 24 * 32 * 3;
    for (index, batch) in batches.iter().enumerate() {
        let expected: Vec<u32> = (0..8)
            .filter(|position| corrupt.contains(&(index * 8 + *position as usize)))
            .collect();
        assert_eq!(batch.substituted, expected, "batch {index}");
        assert_substitutes_copy_their_source(batch, slot);
        for (position, pixels) in batch.images.chunks(slot).enumerate() {
            assert_eq!(
                pixels.iter().all(|&v| v == 0),
                index == 9,
                "batch {index} slot {position}"
            );
        }
    }
    assert!(batches[9].labels.iter().all(|&label| label == -1));
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_images_are_substituted_and_counted_in_place() {
    let mut shards = simple_dataset(1, 8);
    shards[0][2].image = Some(("jpg", b"not a jpeg at all".to_vec()));
    shards[0][5].image = None;
    let harness = Harness::start(Options::default()).await;
    let uri = upload(&harness.s3, "data", "", &shards).await;
    let mut client = harness.client().await;
    let batches = collect(&mut client, unshuffled(&uri)).await.unwrap();
    assert_eq!(batches.len(), 1);
    let batch = &batches[0];
    assert_eq!(batch.substituted, vec![2, 5]);
    assert_eq!(batch.substitution_reasons.len(), 2);
    assert!(batch.substitution_reasons[1].contains("no .jpg"));
    assert_eq!(
        batch.keys[2], "s000/k000002",
        "keys name the planned sample"
    );
    assert_substitutes_copy_their_source(batch, 24 * 32 * 3);
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_and_resumed_reads_yield_identical_batches() {
    let harness = Harness::start(Options::default()).await;
    let uri = upload(&harness.s3, "data", "", &simple_dataset(4, 10)).await;
    let mut client = harness.client().await;
    let clean = collect(&mut client, request(&uri)).await.unwrap();

    let faults = &harness.s3.state.faults;
    faults.slow_down.store(3, Ordering::SeqCst);
    faults.cut_after.store(1000, Ordering::SeqCst);
    faults.cut_bodies.store(3, Ordering::SeqCst);
    let gets_before = harness.s3.state.counts.get.load(Ordering::SeqCst);
    let faulty = collect(&mut client, request(&uri)).await.unwrap();
    assert_eq!(digest(&clean), digest(&faulty));
    assert_eq!(
        faults.slow_down.load(Ordering::SeqCst),
        0,
        "the faults were hit"
    );
    assert_eq!(faults.cut_bodies.load(Ordering::SeqCst), 0);
    assert!(harness.s3.state.counts.get.load(Ordering::SeqCst) - gets_before >= 6);

    // A fault that outlasts the retries ends the stream with UNAVAILABLE.
    faults.internal_errors.store(1_000, Ordering::SeqCst);
    let status = collect(
        &mut client,
        pb::StreamBatchesRequest {
            epoch: 1,
            ..request(&uri)
        },
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("retries exhausted"),
        "{}",
        status.message()
    );
    assert!(
        status
            .message()
            .contains("resume this stream with start_batch="),
        "{}",
        status.message()
    );
    faults.internal_errors.store(0, Ordering::SeqCst);
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_are_disjoint_and_equal_through_grpc() {
    let harness = Harness::start(Options::default()).await;
    let uri = upload(&harness.s3, "data", "", &simple_dataset(5, 11)).await; // 55 samples
    let mut client = harness.client().await;
    let world = 3u32;
    let mut all = HashSet::new();
    let mut counts = Vec::new();
    for rank in 0..world {
        let batches = collect(
            &mut client,
            pb::StreamBatchesRequest {
                rank,
                world_size: world,
                batch_size: Some(4),
                ..request(&uri)
            },
        )
        .await
        .unwrap();
        counts.push(batches.len());
        for key in keys(&batches) {
            assert!(all.insert(key), "a sample reached two ranks");
        }
    }
    // floor(55 / 12) = 4 batches per rank; 7 samples dropped.
    assert_eq!(counts, vec![4, 4, 4]);
    assert_eq!(all.len(), 48);
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_deterministic_across_thread_counts_and_resumable() {
    let shards = simple_dataset(4, 12);
    let mut digests = Vec::new();
    let mut full = Vec::new();
    for threads in [1, 3] {
        let harness = Harness::start(Options {
            decode_threads: threads,
            ..Options::default()
        })
        .await;
        let uri = upload(&harness.s3, "data", "p/", &shards).await;
        let mut client = harness.client().await;
        let batches = collect(
            &mut client,
            pb::StreamBatchesRequest {
                seed: 11,
                epoch: 3,
                ..request(&uri)
            },
        )
        .await
        .unwrap();
        digests.push(digest(&batches));
        if threads == 3 {
            // Resume at batch 2: exactly the tail of the full stream.
            let tail = collect(
                &mut client,
                pb::StreamBatchesRequest {
                    seed: 11,
                    epoch: 3,
                    start_batch: 2,
                    ..request(&uri)
                },
            )
            .await
            .unwrap();
            assert_eq!(tail.first().map(|b| b.index), Some(2));
            assert_eq!(digest(&tail), digest(&batches[2..]));
            full = batches;
        }
        harness.shutdown().await;
    }
    assert_eq!(digests[0], digests[1]);
    assert_eq!(full.len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_over_a_unix_socket_and_builds_the_index_on_first_use() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("shardfeed.sock");
    let harness = Harness::start(Options {
        listen: ListenAddr::Unix(socket.clone()),
        ..Options::default()
    })
    .await;
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "the pod's group may connect, others not");
    let uri = upload(&harness.s3, "data", "", &simple_dataset(2, 8)).await;
    let mut client = harness.client().await;
    let batches = collect(&mut client, request(&uri)).await.unwrap();
    assert_eq!(batches.len(), 2);
    // No index was written: the server built one in memory and wrote nothing.
    assert!(harness
        .s3
        .state
        .object("data", "_shardfeed/index.json")
        .is_none());
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_file_uris_with_a_written_index() {
    let (dir, uri) = indexed_local_dataset(&simple_dataset(2, 6));
    assert!(dir.path().join("_shardfeed/index.json").exists());

    let harness = Harness::start(Options::default()).await;
    let mut client = harness.client().await;
    let batches = collect(&mut client, unshuffled(&uri)).await.unwrap();
    assert_eq!(keys(&batches)[0], "s000/k000000");
    assert_eq!(batches.len(), 1);
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pad_mode_covers_every_sample_and_matches_describe() {
    let harness = Harness::start(Options::default()).await;
    let uri = upload(&harness.s3, "data", "", &simple_dataset(5, 11)).await; // 55 samples
    let mut client = harness.client().await;
    let (world, batch) = (3u32, 4u32);
    let described = client
        .describe(pb::DescribeRequest {
            dataset: uri.clone(),
            world_size: world,
            batch_size: Some(batch),
            partition: pb::Partition::Pad as i32,
            repeats: 0,
        })
        .await
        .unwrap()
        .into_inner();
    // ceil(55 / 12) = 5 batches per rank; 60 - 55 = 5 samples repeated.
    assert_eq!(
        (described.batches_per_rank, described.padded_per_epoch),
        (5, 5)
    );
    let (mut seen, mut unpadded, mut padded) = (Vec::new(), Vec::new(), 0);
    for rank in 0..world {
        let batches = collect(
            &mut client,
            pb::StreamBatchesRequest {
                rank,
                world_size: world,
                batch_size: Some(batch),
                partition: pb::Partition::Pad as i32,
                ..request(&uri)
            },
        )
        .await
        .unwrap();
        assert_eq!(batches.len() as u64, described.batches_per_rank);
        assert!(batches
            .iter()
            .all(|b| b.epoch_steps == described.batches_per_rank));
        seen.extend(keys(&batches));
        for batch in &batches {
            unpadded.extend(
                (0..batch.keys.len() as u32)
                    .filter(|slot| !batch.padded.contains(slot))
                    .map(|slot| batch.keys[slot as usize].clone()),
            );
            padded += batch.padded.len();
        }
    }
    assert_eq!(seen.len(), 60);
    assert_eq!(
        seen.iter().collect::<HashSet<_>>().len(),
        55,
        "every sample at least once"
    );
    // The repeats are marked: leaving them out counts each sample once.
    assert_eq!(padded, 5);
    assert_eq!(unpadded.len(), 55);
    assert_eq!(unpadded.iter().collect::<HashSet<_>>().len(), 55);
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_cannot_name_shards_outside_the_dataset() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(
        outside.path().join("secret.tar"),
        tar_of(&simple_dataset(1, 8)[0]),
    )
    .unwrap();
    let root = tempfile::tempdir().unwrap();
    let dataset = root.path().join("train");
    std::fs::create_dir_all(dataset.join("_shardfeed")).unwrap();
    let uri = format!("file://{}/", dataset.display());
    let harness = Harness::start(Options {
        allow: vec![uri.clone()],
        ..Options::default()
    })
    .await;
    let mut client = harness.client().await;

    // An index naming a path with `..` is refused as corrupt.
    let escape = format!("../../{}", outside.path().join("secret.tar").display());
    let summary = serde_json::json!({
        "version": 1,
        "shards": [{"name": escape, "size": 10240, "etag": null, "samples": 8}],
    });
    std::fs::write(dataset.join("_shardfeed/index.json"), summary.to_string()).unwrap();
    let refused = collect(&mut client, unshuffled(&uri)).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("does not stay inside"),
        "{refused:?}"
    );

    // An index naming a shard that is a symlink out of the dataset: the
    // read is refused.
    let secret = tar_of(&simple_dataset(1, 8)[0]);
    std::os::unix::fs::symlink(outside.path().join("secret.tar"), dataset.join("link.tar"))
        .unwrap();
    let shard_index = shardfeed::dataset::index_shard_bytes(&secret, None).unwrap();
    std::fs::create_dir_all(dataset.join("_shardfeed/shards")).unwrap();
    std::fs::write(
        dataset.join("_shardfeed/shards/link.tar.json"),
        serde_json::to_vec(&shard_index).unwrap(),
    )
    .unwrap();
    let summary = serde_json::json!({
        "version": 1,
        "shards": [{"name": "link.tar", "size": secret.len(), "etag": null, "samples": 8}],
    });
    std::fs::write(dataset.join("_shardfeed/index.json"), summary.to_string()).unwrap();
    let refused = collect(&mut client, unshuffled(&uri)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("outside the dataset"),
        "{refused:?}"
    );
    harness.shutdown().await;
}
