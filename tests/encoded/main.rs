//! Encoded delivery end to end: baseline JPEGs arrive compressed with the
//! box and flip a decoded delivery would have used, everything else as the
//! same pixels, every sample in its slot, at any world size and after a
//! resume; batches never outgrow a decoded one.

#[path = "../common/mod.rs"]
mod common;
// Several views of each sample, delivered encoded.
mod views;

use std::collections::HashMap;

use common::*;
use shardfeed::server::pb;

fn png(width: u32, height: u32, seed: u64) -> Vec<u8> {
    let pixels =
        shardfeed::dev::synthetic::synthetic_image(seed, seed, (seed % 10) as u32, width, height);
    let mut out = Vec::new();
    pixels
        .write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png)
        .unwrap();
    out
}

/// 3 shards of 12: baseline JPEGs, with a PNG and an undecodable image in
/// the first shard.
fn photos() -> Vec<Vec<Sample>> {
    (0..3)
        .map(|s| {
            (0..12)
                .map(|i| {
                    let n = (s * 12 + i) as u64;
                    let image = match n {
                        4 => ("png", png(90, 70, n)),
                        7 => ("jpg", b"not an image at all".to_vec()),
                        _ => (
                            "jpg",
                            jpeg(96 + (n % 4) as u32 * 8, 80 + (n % 3) as u32 * 8, n),
                        ),
                    };
                    Sample {
                        key: format!("s{s}/k{n:03}"),
                        image: Some(image),
                        label: Some((n % 5).to_string()),
                    }
                })
                .collect()
        })
        .collect()
}

fn train(dataset: &str) -> pb::StreamBatchesRequest {
    pb::StreamBatchesRequest {
        batch_size: Some(6),
        // Large enough that the JPEGs here fit as compressed.
        height: 64,
        width: 64,
        ..train_request(dataset, 5)
    }
}

fn encoded(
    request: pb::StreamBatchesRequest,
    server_fraction: Option<f64>,
) -> pb::StreamBatchesRequest {
    pb::StreamBatchesRequest {
        delivery: pb::Delivery::Encoded as i32,
        server_decode_fraction: server_fraction,
        ..request
    }
}

/// What one slot of a batch holds, whichever way it was delivered.
#[derive(Debug, Clone, PartialEq)]
struct Slot {
    key: String,
    label: i64,
    crop: (f32, f32, f32, f32, bool),
    /// Pixels, or the compressed bytes with their size.
    pixels: Option<Vec<u8>>,
    compressed: Option<(Vec<u8>, u32, u32)>,
}

fn slots(batch: &pb::Batch) -> Vec<Slot> {
    let pixels = batch.images.len() / batch.keys.len().max(1);
    (0..batch.keys.len())
        .map(|i| {
            let c = &batch.crops[i];
            let (pixels, compressed) = match batch.encoded.get(i) {
                None => (
                    Some(batch.images[i * pixels..(i + 1) * pixels].to_vec()),
                    None,
                ),
                Some(e) => {
                    let bytes =
                        batch.images[e.offset as usize..(e.offset + e.length) as usize].to_vec();
                    // Every form is named; DELIVERY_ENCODED's client form is a JPEG.
                    let form = if e.decoded {
                        pb::SampleForm::Pixels
                    } else {
                        pb::SampleForm::Jpeg
                    };
                    assert_eq!(e.form(), form, "{}", batch.keys[i]);
                    if e.decoded {
                        (Some(bytes), None)
                    } else {
                        (None, Some((bytes, e.source_width, e.source_height)))
                    }
                }
            };
            Slot {
                key: batch.keys[i].clone(),
                label: batch.labels[i],
                crop: (c.left, c.top, c.width, c.height, c.flipped),
                pixels,
                compressed,
            }
        })
        .collect()
}

fn originals(shards: &[Vec<Sample>]) -> HashMap<String, Vec<u8>> {
    shards
        .iter()
        .flatten()
        .map(|s| (s.key.clone(), s.image.clone().unwrap().1))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoded_batches_carry_the_decoded_batches_boxes_and_the_originals_bytes() {
    let harness = Harness::start(Options::default()).await;
    let shards = photos();
    let uri = upload(&harness.s3, "encoded", "photos/", &shards).await;
    let originals = originals(&shards);
    let mut client = harness.client().await;
    let slot_bytes = 64 * 64 * 3;

    let decoded = collect(&mut client, train(&uri)).await.unwrap();
    let plain = collect(&mut client, encoded(train(&uri), None))
        .await
        .unwrap();
    assert_eq!(decoded.len(), plain.len());
    let (mut compressed, mut substituted) = (0, 0);
    for (reference, batch) in decoded.iter().zip(&plain) {
        assert!(
            reference.encoded.is_empty(),
            "a decoded delivery has no table"
        );
        assert_eq!(batch.encoded.len(), batch.keys.len());
        assert!(batch.images.len() <= batch.keys.len() * slot_bytes);
        assert_eq!(batch.substituted, reference.substituted);
        assert_eq!(batch.substitute_sources, reference.substitute_sources);
        let sources: Vec<Option<usize>> = (0..batch.keys.len())
            .map(|slot| {
                batch
                    .substituted
                    .iter()
                    .position(|&s| s as usize == slot)
                    .and_then(|at| usize::try_from(batch.substitute_sources[at]).ok())
            })
            .collect();
        for (slot, (want, got)) in slots(reference).into_iter().zip(slots(batch)).enumerate() {
            assert_eq!(
                (&got.key, got.label, got.crop),
                (&want.key, want.label, want.crop)
            );
            match (&got.pixels, &got.compressed) {
                (Some(pixels), None) => {
                    assert_eq!(Some(pixels), want.pixels.as_ref(), "{}", got.key)
                }
                (None, Some((bytes, width, height))) => {
                    compressed += 1;
                    // A substitute carries its source's image.
                    let named = sources[slot].map_or(&got.key, |from| &batch.keys[from]);
                    assert_eq!(bytes, &originals[named], "{}", got.key);
                    assert!(*width >= 96 && *height >= 80);
                }
                _ => unreachable!(),
            }
        }
        substituted += batch.substituted.len();
    }
    assert!(
        compressed >= 28,
        "baseline JPEGs go compressed: {compressed}"
    );
    assert_eq!(
        substituted, 1,
        "the undecodable image is substituted as when decoded"
    );
    let png = plain
        .iter()
        .flat_map(slots)
        .find(|s| s.key == "s0/k004")
        .unwrap();
    assert!(png.pixels.is_some(), "a PNG arrives as pixels");

    // About half of the samples the client could decode decoded by the
    // server, drawn per sample; a larger share keeps a smaller one's.
    let server_side = |batches: &[pb::Batch]| -> Vec<String> {
        batches
            .iter()
            .flat_map(|batch| {
                // A substituted slot was the server's, whatever it points at now.
                (0..batch.keys.len() as u32)
                    .filter(|&s| {
                        batch.encoded[s as usize].decoded || batch.substituted.contains(&s)
                    })
                    .map(|s| batch.keys[s as usize].clone())
            })
            .collect()
    };
    let quarter = collect(&mut client, encoded(train(&uri), Some(0.25)))
        .await
        .unwrap();
    let half = collect(&mut client, encoded(train(&uri), Some(0.5)))
        .await
        .unwrap();
    let (quarter, half_keys) = (server_side(&quarter), server_side(&half));
    // 34 samples the client could take (of 36: a PNG, one undecodable).
    assert!((10..=26).contains(&half_keys.len()), "{half_keys:?}");
    assert!(quarter.len() < half_keys.len());
    assert!(quarter.iter().all(|key| half_keys.contains(key)));
    for (reference, batch) in decoded.iter().zip(&half) {
        for (want, got) in slots(reference).into_iter().zip(slots(batch)) {
            assert_eq!(got.crop, want.crop);
            if got.pixels.is_some() {
                assert_eq!(got.pixels, want.pixels);
            }
        }
    }
    let everything = collect(&mut client, encoded(train(&uri), Some(1.0)))
        .await
        .unwrap();
    for (reference, batch) in decoded.iter().zip(&everything) {
        assert!(batch.encoded.iter().all(|e| e.decoded));
        assert_eq!(slots(batch), slots(reference));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sample_keeps_its_box_and_bytes_at_any_world_size_and_after_a_resume() {
    let harness = Harness::start(Options::default()).await;
    let shards = photos();
    let uri = upload(&harness.s3, "encoded", "photos/", &shards).await;
    let mut client = harness.client().await;
    let by_key = |batches: &[pb::Batch]| -> HashMap<String, Slot> {
        batches
            .iter()
            .flat_map(slots)
            .map(|slot| (slot.key.clone(), slot))
            .collect()
    };
    // At a fixed share the side that decodes a sample is the sample's own:
    // the same bytes (compressed, or the server's pixels) at any world size.
    for share in [None, Some(0.5)] {
        let one = collect(&mut client, encoded(train(&uri), share))
            .await
            .unwrap();
        let mut four = Vec::new();
        for rank in 0..4 {
            let request = pb::StreamBatchesRequest {
                rank,
                world_size: 4,
                batch_size: Some(3),
                ..encoded(train(&uri), share)
            };
            four.extend(collect(&mut client, request).await.unwrap());
        }
        let (one, four) = (by_key(&one), by_key(&four));
        assert_eq!(one.len(), four.len());
        for (key, slot) in &one {
            // A substitute depends on its batch; every other sample on itself.
            if slot.key != "s0/k007" {
                assert_eq!(slot.crop, four[key].crop, "{key} at {share:?}");
                assert_eq!(slot.compressed, four[key].compressed, "{key} at {share:?}");
                assert_eq!(slot.pixels, four[key].pixels, "{key} at {share:?}");
            }
        }

        let all = collect(&mut client, encoded(train(&uri), share))
            .await
            .unwrap();
        let tail = collect(
            &mut client,
            pb::StreamBatchesRequest {
                start_batch: 2,
                ..encoded(train(&uri), share)
            },
        )
        .await
        .unwrap();
        assert_eq!(digest(&all[2..]), digest(&tail));
        let tables = |batches: &[pb::Batch]| -> Vec<Vec<pb::EncodedSample>> {
            batches.iter().map(|b| b.encoded.clone()).collect()
        };
        assert_eq!(tables(&all[2..]), tables(&tail));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jpeg_with_a_corrupt_scan_is_substituted_as_in_a_decoded_delivery() {
    let harness = Harness::start(Options::default()).await;
    let mut shards = photos();
    // Headers and end marker intact, stray markers in the scan: a decoder
    // that does not check (nvJPEG) would decode garbage without an error.
    for n in [13, 26] {
        let sample = &mut shards[n / 12][n % 12];
        let (_, bytes) = sample.image.as_mut().unwrap();
        *bytes = shardfeed::dev::synthetic::scan_corrupted(bytes, 4000, n as u64);
        assert!(
            shardfeed::decode::jpeg_frame(bytes).unwrap().is_baseline(),
            "its headers still pass"
        );
    }
    let uri = upload(&harness.s3, "encoded", "photos/", &shards).await;
    let mut client = harness.client().await;
    let substituted = |batches: &[pb::Batch]| -> Vec<String> {
        batches
            .iter()
            .flat_map(|b| b.substituted.iter().map(|&s| b.keys[s as usize].clone()))
            .collect()
    };
    let decoded = collect(&mut client, train(&uri)).await.unwrap();
    let expected = substituted(&decoded);
    assert_eq!(expected.len(), 3, "the two corrupt scans and the bad image");
    for share in [None, Some(0.5)] {
        let batches = collect(&mut client, encoded(train(&uri), share))
            .await
            .unwrap();
        assert_eq!(substituted(&batches), expected, "share {share:?}");
        for (reference, batch) in decoded.iter().zip(&batches) {
            assert_eq!(batch.substituted, reference.substituted);
            assert_eq!(batch.substitute_sources, reference.substitute_sources);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encoded_batch_never_outgrows_a_decoded_one() {
    let harness = Harness::start(Options::default()).await;
    let uri = upload(&harness.s3, "encoded", "photos/", &photos()).await;
    let mut client = harness.client().await;
    // 8x8 outputs are 192 bytes: no JPEG here is that small.
    let tiny = pb::StreamBatchesRequest {
        height: 8,
        width: 8,
        ..encoded(train(&uri), None)
    };
    for batch in collect(&mut client, tiny).await.unwrap() {
        assert!(batch.encoded.iter().all(|e| e.decoded && e.length == 192));
        assert_eq!(batch.images.len(), batch.keys.len() * 192);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_with_ops_the_client_does_not_name_is_decoded_by_the_server() {
    let harness = Harness::start(Options::default()).await;
    let uri = upload(&harness.s3, "encoded", "photos/", &photos()).await;
    let mut client = harness.client().await;
    let trivial_augment = pb::StreamBatchesRequest {
        augmentation: Some(pb::Augmentation {
            horizontal_flip: 0.5,
            auto_augment: Some(pb::AutoAugment {
                policy: Some(pb::auto_augment::Policy::TrivialAugmentWide(
                    pb::TrivialAugmentWide::default(),
                )),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..encoded(train(&uri), Some(0.0))
    };
    let compressed = |batches: &[pb::Batch]| -> usize {
        batches
            .iter()
            .flat_map(|b| &b.encoded)
            .filter(|e| !e.decoded)
            .count()
    };
    // An older client names no ops: it replays the flip alone.
    let unnamed = collect(&mut client, trivial_augment.clone()).await.unwrap();
    assert_eq!(compressed(&unnamed), 0);
    let flip_only = pb::StreamBatchesRequest {
        client_ops: vec!["horizontal_flip".into(), "a_future_op".into()],
        ..trivial_augment.clone()
    };
    assert_eq!(
        compressed(&collect(&mut client, flip_only).await.unwrap()),
        0
    );
    let named = pb::StreamBatchesRequest {
        client_ops: vec!["auto_augment".into()],
        ..trivial_augment
    };
    let named = collect(&mut client, named).await.unwrap();
    // As many go compressed as in a stream without ops: every sample the
    // client can decode.
    let plain = collect(&mut client, encoded(train(&uri), Some(0.0)))
        .await
        .unwrap();
    assert!(compressed(&plain) >= 30);
    // Every sample the client can decode goes compressed, but those whose
    // policy drew a threshold op (Solarize, Posterize, Equalize): the
    // sidecar's, so the client's one-level differences are not amplified.
    let threshold = |crop: &pb::CropBox| {
        crop.policy.iter().any(|step| {
            matches!(
                pb::PolicyOp::try_from(step.op),
                Ok(pb::PolicyOp::Posterize | pb::PolicyOp::Solarize | pb::PolicyOp::Equalize)
            )
        })
    };
    let mut left_to_server = 0;
    for (with_ops, without) in named.iter().zip(&plain) {
        assert_eq!(with_ops.keys, without.keys);
        let slots = with_ops
            .encoded
            .iter()
            .zip(&without.encoded)
            .zip(&with_ops.crops);
        for ((with_ops, without), crop) in slots {
            if threshold(crop) {
                assert!(with_ops.decoded, "a threshold op's sample went compressed");
                left_to_server += usize::from(!without.decoded);
            } else {
                assert_eq!(with_ops.decoded, without.decoded);
            }
        }
    }
    assert!(left_to_server > 0, "no sample drew a threshold op");
    assert_eq!(compressed(&named) + left_to_server, compressed(&plain));
    for (server, client) in unnamed.iter().zip(&named) {
        assert_eq!(server.keys, client.keys);
        assert_eq!(server.crops, client.crops, "the same decisions either way");
    }
}

/// A search state at `center` with `hold` batches left, fine steps.
fn search(center: f64, hold: u32) -> pb::ShareSearch {
    pb::ShareSearch {
        center,
        step: 1.0 / 16.0,
        hold,
        next_hold: 64,
        loop_id: 0,
        noise: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_delivery_requests_and_reports_name_their_field() {
    let harness = Harness::start(Options::default()).await;
    let uri = upload(&harness.s3, "encoded", "photos/", &photos()).await;
    let mut client = harness.client().await;
    let cases = [
        (
            encoded(train(&uri), Some(1.5)),
            "server_decode_fraction 1.5",
        ),
        (
            encoded(train(&uri), Some(f64::NAN)),
            "server_decode_fraction NaN",
        ),
        (
            pb::StreamBatchesRequest {
                server_decode_fraction: Some(0.5),
                ..train(&uri)
            },
            "server_decode_fraction and tune_server_decode are for",
        ),
        (
            pb::StreamBatchesRequest {
                decoded_source: Some(pb::DecodedSource {
                    shorter_side: 64,
                    stored_from_epoch: None,
                }),
                ..encoded(train(&uri), None)
            },
            "decoded_source and delivery",
        ),
        (
            pb::StreamBatchesRequest {
                delivery: 7,
                ..train(&uri)
            },
            "unknown delivery 7",
        ),
        (
            pb::StreamBatchesRequest {
                server_decode_search: Some(search(0.5, 0)),
                ..encoded(train(&uri), None)
            },
            "server_decode_search goes on with a tuned share's search",
        ),
        (
            pb::StreamBatchesRequest {
                tune_server_decode: true,
                server_decode_search: Some(pb::ShareSearch {
                    step: 0.9,
                    ..search(0.5, 0)
                }),
                ..encoded(train(&uri), None)
            },
            "server_decode_search: step 0.9 is outside",
        ),
        (
            pb::StreamBatchesRequest {
                tune_server_decode: true,
                server_decode_search: Some(search(f64::NAN, 0)),
                ..encoded(train(&uri), None)
            },
            "server_decode_search: center NaN is outside",
        ),
        (
            pb::StreamBatchesRequest {
                tune_server_decode: true,
                server_decode_search: Some(pb::ShareSearch {
                    noise: Some(2.0),
                    ..search(0.5, 0)
                }),
                ..encoded(train(&uri), None)
            },
            "server_decode_search: noise 2 is outside",
        ),
    ];
    for (request, message) in cases {
        let status = collect(&mut client, request).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(message), "{status:?}");
        let field = message.split([' ', '.', ':']).next().unwrap();
        let field = match field {
            "unknown" => "delivery",
            field => field,
        };
        assert_eq!(bad_field(&status), field, "{message}");
    }

    // Reports count against the samples sent compressed: one epoch's.
    let sent: usize = collect(&mut client, encoded(train(&uri), None))
        .await
        .unwrap()
        .iter()
        .map(|b| b.encoded.iter().filter(|e| !e.decoded).count())
        .sum();
    assert!(sent >= 12, "{sent} sent compressed");
    let inflated = client
        .report_client_decodes(pb::ClientDecodeReport {
            rank: 0,
            decoded: 1 << 40,
            failures: Vec::new(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(inflated.code(), tonic::Code::InvalidArgument);
    assert_eq!(bad_field(&inflated), "decoded");
    assert!(
        inflated.message().contains("sent compressed"),
        "{inflated:?}"
    );
    let failure = pb::ClientDecodeFailure {
        shard: "photos/shard-000000.tar".into(),
        key: "s0/k001".into(),
        reason: "x".repeat(10_000),
    };
    client
        .report_client_decodes(pb::ClientDecodeReport {
            rank: 0,
            decoded: 11,
            failures: vec![failure.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    let status = client
        .report_client_decodes(pb::ClientDecodeReport {
            rank: 0,
            decoded: 0,
            failures: vec![
                pb::ClientDecodeFailure {
                    reason: "short".into(),
                    ..failure
                };
                5000
            ],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("5000 failures"), "{status:?}");
    // A loop's totals that cannot be one's are named; a stream that ended
    // hears nothing, which is no error.
    let loop_report = |waited_seconds, stepped_seconds| pb::ClientDecodeReport {
        loop_waits: Some(pb::LoopWaits {
            loop_id: 12345,
            waited_seconds,
            stepped_seconds,
            steps: 10,
        }),
        ..Default::default()
    };
    let backwards = client
        .report_client_decodes(loop_report(5.0, 1.0))
        .await
        .unwrap_err();
    assert_eq!(backwards.code(), tonic::Code::InvalidArgument);
    assert_eq!(bad_field(&backwards), "loop_waits");
    assert!(backwards.message().contains("exceeds"), "{backwards:?}");
    client
        .report_client_decodes(loop_report(0.5, 10.0))
        .await
        .unwrap();
    assert_eq!(bad_field(&status), "failures");
}

/// How many samples of each batch the server decoded (substituted slots
/// were its own).
fn server_counts(batches: &[pb::Batch]) -> Vec<usize> {
    batches
        .iter()
        .map(|b| {
            (0..b.keys.len() as u32)
                .filter(|&s| b.encoded[s as usize].decoded || b.substituted.contains(&s))
                .count()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tuned_share_seeks_the_rate_the_trainer_takes_batches_at() {
    let harness = Harness::start(Options::default()).await;
    // 250 batches of 8: each batch's compressed count is drawn per sample,
    // so the trainer's times are noisy and the search times longer windows.
    let shards: Vec<Vec<Sample>> = (0..100)
        .map(|s| {
            (0..20)
                .map(|i| {
                    let n = (s * 20 + i) as u64;
                    Sample {
                        key: format!("s{s}/k{n:03}"),
                        image: Some(("jpg", jpeg(320, 240, n))),
                        label: Some("1".into()),
                    }
                })
                .collect()
        })
        .collect();
    let uri = upload(&harness.s3, "tuned", "photos/", &shards).await;
    let mut client = harness.client().await;
    // Outputs large enough for these JPEGs to go compressed, and batches
    // large enough that few fit the transport's window: the search lets
    // those through before it times a share.
    let sized = |request: pb::StreamBatchesRequest| pb::StreamBatchesRequest {
        batch_size: Some(8),
        height: 224,
        width: 224,
        ..request
    };
    // No start: the search begins in the middle.
    let tuned = pb::StreamBatchesRequest {
        tune_server_decode: true,
        ..sized(encoded(train(&uri), None))
    };

    // A trainer that decodes on its own time, far dearer than the server:
    // each image it gets compressed costs it 40 ms. The best share is
    // c / (c + d) for the trainer's cost c and the server's d per image, so
    // the top is best only while c is many times d; a debug build on a slow
    // machine decodes in several ms (4 ms here left 0.75 as good as 1).
    // Its rate rises with the server's share, so the search climbs to the top.
    let mut stream = client.stream_batches(tuned).await.unwrap().into_inner();
    let mut fast = Vec::new();
    while let Some(batch) = stream.message().await.unwrap() {
        let compressed = batch.encoded.iter().filter(|e| !e.decoded).count();
        tokio::time::sleep(std::time::Duration::from_millis(40 * compressed as u64)).await;
        fast.push(batch);
    }
    let counts = server_counts(&fast);
    // Starts in the middle: its first batch is split as at a fixed 0.5
    // (which samples, drawn per sample, not half of every batch).
    let mut half = client
        .stream_batches(sized(encoded(train(&uri), Some(0.5))))
        .await
        .unwrap()
        .into_inner();
    let first_at_half = half.message().await.unwrap().unwrap();
    drop(half);
    assert_eq!(
        counts[0],
        server_counts(&[first_at_half])[0],
        "starts in the middle: {counts:?}"
    );
    let last = &counts[counts.len() - 10..];
    assert!(
        last.iter().sum::<usize>() >= 70,
        "settles at the top, probing a step below now and then: {counts:?}"
    );
    let settled: Vec<f64> = fast
        .iter()
        .map(|b| b.server_decode_settled.unwrap())
        .collect();
    assert!(
        settled.iter().all(|s| (0.0..=1.0).contains(s)) && settled[settled.len() - 1] >= 0.875,
        "{settled:?}"
    );
    // Every batch carries the search's state; a stream given it goes on
    // from there (a hold it had left holds that share) instead of from its
    // start, which it would hold otherwise.
    let state = fast.last().unwrap().server_decode_search.unwrap();
    assert_eq!(state.center, *settled.last().unwrap());
    // Where the stream heard its loop's waits: one place for its batches.
    assert_ne!(state.loop_id, 0);
    assert!(fast
        .iter()
        .all(|b| b.server_decode_search.unwrap().loop_id == state.loop_id));
    let going_on = pb::StreamBatchesRequest {
        tune_server_decode: true,
        server_decode_search: Some(search(0.25, 20)),
        ..sized(encoded(train(&uri), Some(0.75)))
    };
    let mut stream = client.stream_batches(going_on).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    drop(stream);
    let carried = first.server_decode_search.unwrap();
    assert_eq!((carried.center, carried.hold), (0.25, 20), "{carried:?}");
    // Tuning decides who decodes, never which box.
    let fixed = collect(&mut client, sized(encoded(train(&uri), None)))
        .await
        .unwrap();
    assert_eq!(fixed.len(), fast.len());
    for (a, b) in fixed.iter().zip(&fast) {
        assert_eq!(a.keys, b.keys);
        assert_eq!(a.crops, b.crops);
        assert_eq!(
            a.server_decode_settled, None,
            "a fixed share settles nowhere"
        );
    }
}
