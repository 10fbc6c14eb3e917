//! Hostile requests, damaged data and a misbehaving decoder: each gets its
//! documented status or substitution, and the server keeps serving.

#[path = "../common/mod.rs"]
mod common;
// The fuzz targets' entry points under generated inputs.
mod fuzz_properties;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use shardfeed::decode::{self, CropBox, DecodeError, Decoder, ImageCrateDecoder, OutputSpec};
use shardfeed::engine::budget::MemoryConfig;
use shardfeed::pipeline::PipelineConfig;
use shardfeed::server::{pb, ListenAddr};
use shardfeed::shard::{BadShardPolicy, ImageFormat};
use tonic::Code;

fn big_output(batch_size: u32, side: u32, uri: &str) -> pb::StreamBatchesRequest {
    pb::StreamBatchesRequest {
        batch_size: Some(batch_size),
        height: side,
        width: side,
        ..unshuffled(uri)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_admitted_against_the_memory_budget_and_free_it_when_they_leave() {
    // 1 GiB limit: streams may reserve 640 MiB; one stream of 32 x 512² batches
    // reserves 7 x 24 MiB + readers ≈ 170 MiB, so three fit and a fourth does not.
    let harness = Harness::start(Options {
        // Refused after a short wait: this test is about the refusal.
        memory: MemoryConfig {
            admission_wait: Duration::from_millis(300),
            ..MemoryConfig::from_limit(1 << 30)
        },
        ..Options::default()
    })
    .await;
    // Long enough that no stream can finish ahead of its client.
    let uri = upload(&harness.s3, "data", "", &simple_dataset(6, 40)).await;
    let mut client = harness.client().await;

    let never = client
        .stream_batches(big_output(64, 1024, &uri))
        .await
        .unwrap_err();
    assert_eq!(never.code(), Code::InvalidArgument, "{never:?}");
    assert!(
        never.message().contains("batch_size x height x width")
            && never.message().contains("--memory-limit"),
        "{}",
        never.message()
    );

    let mut open = fill_the_budget(&mut client, &uri).await;
    let busy = client
        .stream_batches(big_output(32, 512, &uri))
        .await
        .unwrap_err();
    assert_eq!(busy.code(), Code::ResourceExhausted, "{busy:?}");
    assert!(
        busy.message().contains("memory budget"),
        "{}",
        busy.message()
    );

    // A client that leaves mid-stream frees its reservation promptly.
    drop(open.pop());
    let left = Instant::now();
    loop {
        match client.stream_batches(big_output(32, 512, &uri)).await {
            Ok(_) => break,
            Err(status) if status.code() == Code::ResourceExhausted => {
                assert!(
                    left.elapsed() < Duration::from_secs(1),
                    "memory still reserved {:?} after the client left",
                    left.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(status) => panic!("{status:?}"),
        }
    }
    println!(
        "reservation freed {:?} after the client left",
        left.elapsed()
    );
    harness.shutdown().await;
}

/// Three streams of 32 x 512^2 that have each sent a batch: all a 1 GiB
/// budget holds.
async fn fill_the_budget(
    client: &mut shardfeed::server::pb::shardfeed_client::ShardfeedClient<
        tonic::transport::Channel,
    >,
    uri: &str,
) -> Vec<tonic::Streaming<pb::Batch>> {
    let mut open = Vec::new();
    for _ in 0..3 {
        let mut stream = client
            .stream_batches(big_output(32, 512, uri))
            .await
            .unwrap()
            .into_inner();
        assert!(stream.message().await.unwrap().is_some());
        open.push(stream);
    }
    open
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_opened_right_after_a_break_waits_for_the_memory_coming_back() {
    // Three streams fill the budget (see above); the trainer breaks out of
    // one and opens the next at once, as `break` + a new epoch does.
    let harness = Harness::start(Options {
        memory: MemoryConfig::from_limit(1 << 30),
        ..Options::default()
    })
    .await;
    let uri = upload(&harness.s3, "data", "", &simple_dataset(6, 40)).await;
    let mut client = harness.client().await;
    let mut open = fill_the_budget(&mut client, &uri).await;
    drop(open.pop());
    let broke = Instant::now();
    let mut next = client
        .stream_batches(big_output(32, 512, &uri))
        .await
        .expect("admitted once the broken stream's memory came back, not refused")
        .into_inner();
    assert!(next.message().await.unwrap().is_some());
    println!(
        "the next stream waited {:?} for its memory",
        broke.elapsed()
    );
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_plans_are_refused_at_once_and_the_server_keeps_serving() {
    let harness = Harness::start(Options::default()).await;
    let uri = upload(&harness.s3, "data", "", &simple_dataset(2, 24)).await;
    let mut client = harness.client().await;
    let segment = |world_size, batches| pb::PositionSegment {
        world_size,
        batches,
    };
    let hostile = [
        (
            "many world sizes",
            pb::StreamBatchesRequest {
                world_size: 2,
                batch_size: Some(2),
                resume_from: Some(pb::EpochPosition {
                    segments: (0..200)
                        .map(|i| segment(1 + i % 4, 0))
                        .chain((0..200).map(|i| segment(1 + i % 2, 1)))
                        .collect(),
                    ..Default::default()
                }),
                ..request(&uri)
            },
            "resizes within one epoch",
        ),
        (
            "a huge world",
            pb::StreamBatchesRequest {
                world_size: u32::MAX,
                batch_size: Some(1),
                partition: pb::Partition::Pad as i32,
                ..request(&uri)
            },
            "world_size",
        ),
        (
            "a huge resume world",
            pb::StreamBatchesRequest {
                resume_from: Some(pb::EpochPosition {
                    segments: vec![segment(u32::MAX, 1)],
                    ..Default::default()
                }),
                ..request(&uri)
            },
            "world_size",
        ),
        (
            "batch counts that overflow",
            pb::StreamBatchesRequest {
                resume_from: Some(pb::EpochPosition {
                    segments: vec![segment(1, u64::MAX), segment(1, u64::MAX)],
                    ..Default::default()
                }),
                ..request(&uri)
            },
            "resume position",
        ),
        (
            "a start past the end",
            pb::StreamBatchesRequest {
                start_batch: u64::MAX,
                ..request(&uri)
            },
            "start_batch",
        ),
        (
            "a huge shuffle buffer",
            pb::StreamBatchesRequest {
                shuffle_buffer: u32::MAX,
                ..request(&uri)
            },
            "shuffle_buffer",
        ),
        (
            "more copies than an epoch may hold",
            pb::StreamBatchesRequest {
                repeats: u32::MAX,
                ..request(&uri)
            },
            "repeats",
        ),
        (
            "more client ops than the table could hold",
            pb::StreamBatchesRequest {
                client_ops: vec!["auto_augment".into(); 17],
                ..request(&uri)
            },
            "client_ops",
        ),
        (
            "a client op name of four kilobytes",
            pb::StreamBatchesRequest {
                client_ops: vec!["x".repeat(4096)],
                ..request(&uri)
            },
            "client_ops",
        ),
        (
            "epoch at the end of time",
            pb::StreamBatchesRequest {
                epoch: u64::MAX,
                world_size: 3,
                ..request(&uri)
            },
            "",
        ),
    ];
    for (what, request, mentions) in hostile {
        let started = Instant::now();
        let result = collect(&mut client, request).await;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{what}: {:?}",
            started.elapsed()
        );
        match result {
            Err(status) => {
                assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
                assert!(
                    status.message().contains(mentions),
                    "{what}: {}",
                    status.message()
                );
            }
            // The last is legal: the epoch number only seeds the shuffle.
            Ok(batches) => assert_eq!(mentions, "", "{what}: served {} batches", batches.len()),
        }
    }
    let batches = collect(&mut client, unshuffled(&uri)).await.unwrap();
    assert_eq!(batches.len(), 6);
    harness.shutdown().await;
}

/// Panics on images of one width, like a decoder bug on one odd file.
#[derive(Debug)]
struct PanicsOnWidth(u32);

impl Decoder for PanicsOnWidth {
    fn decode_into(
        &self,
        format: ImageFormat,
        data: &[u8],
        spec: &OutputSpec,
        crop: &CropBox,
        out: &mut [u8],
    ) -> Result<(), DecodeError> {
        let (width, _) = decode::source_dimensions(format, data)?;
        assert_ne!(width, self.0, "decoder bug on a {width}-pixel-wide image");
        ImageCrateDecoder.decode_into(format, data, spec, crop, out)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_decode_is_substituted_and_the_server_lives_on() {
    let harness = Harness::start(Options {
        decoder: Some(Arc::new(PanicsOnWidth(56))),
        ..Options::default()
    })
    .await;
    // simple_dataset's sample n is 40 + (n % 5) * 8 wide: n % 5 == 2 panics.
    let uri = upload(&harness.s3, "data", "", &simple_dataset(1, 16)).await;
    let mut client = harness.client().await;
    for _ in 0..2 {
        let batches = collect(&mut client, unshuffled(&uri)).await.unwrap();
        assert_eq!(batches.len(), 2);
        for (b, batch) in batches.iter().enumerate() {
            let expected: Vec<u32> = (0..8)
                .filter(|slot| (b as u32 * 8 + slot) % 5 == 2)
                .collect();
            assert_eq!(batch.substituted, expected);
            assert!(batch
                .substitution_reasons
                .iter()
                .all(|reason| reason.contains("panicked")));
        }
    }
    harness.shutdown().await;
}

/// A server that substitutes what it cannot read (`--on-bad-shard skip`).
fn skipping_damage() -> Options {
    Options {
        pipeline: PipelineConfig {
            on_bad_shard: BadShardPolicy::Skip,
            ..Options::default().pipeline
        },
        ..Options::default()
    }
}

/// Overwrites bytes of a file in place, keeping its size and modification
/// time (so its ETag stand-in, and the index, still match).
fn damage_in_place(path: &std::path::Path, at: usize, len: usize) {
    let modified = std::fs::metadata(path).unwrap().modified().unwrap();
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at..at + len].fill(0x5a);
    std::fs::write(path, &bytes).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.set_times(std::fs::FileTimes::new().set_modified(modified))
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_shard_fails_the_stream_or_is_skipped_keeping_counts() {
    let shards = simple_dataset(2, 8);
    let (dir, uri) = indexed_local_dataset(&shards);
    // Garbage over the headers of shard 1 from its fourth sample on.
    let shard_path = dir.path().join("part-1.tar");
    let tar = std::fs::read(&shard_path).unwrap();
    let fourth_sample = tar
        .windows(12)
        .position(|name| name == b"s001/k000011")
        .unwrap();
    damage_in_place(&shard_path, fourth_sample, 2048);

    let failing = Harness::start(Options::default()).await;
    let mut client = failing.client().await;
    let status = collect(&mut client, unshuffled(&uri)).await.unwrap_err();
    assert_eq!(status.code(), Code::DataLoss, "{status:?}");
    assert!(
        status.message().contains("part-1.tar"),
        "{}",
        status.message()
    );
    failing.shutdown().await;

    let skipping = Harness::start(skipping_damage()).await;
    let mut client = skipping.client().await;
    let batches = collect(&mut client, unshuffled(&uri)).await.unwrap();
    assert_eq!(batches.len(), 2, "counts stay as planned");
    // Shard 1 is the second batch (unshuffled). The damage starts at sample
    // 3; sample 2 was still open (a sample ends where the next key starts),
    // so samples 2.. are substituted by copies of the good samples 0 and 1.
    assert!(batches[0].substituted.is_empty());
    assert_eq!(batches[1].substituted, vec![2, 3, 4, 5, 6, 7]);
    assert!(batches[1]
        .substitute_sources
        .iter()
        .all(|&source| (0..2).contains(&source)));
    assert_eq!(
        keys(&batches)[11],
        "s001/k000011",
        "keys still name the planned samples"
    );
    skipping.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_build_outlives_a_caller_that_gives_up() {
    let harness = Harness::start(Options::default()).await;
    let uri = upload(&harness.s3, "data", "", &simple_dataset(4, 12)).await;
    // No index: the first stream scans every shard, and its reads wait.
    let gate = &harness.s3.state.faults.get_gate;
    gate.close();
    let mut client = harness.client().await;
    // The caller gives up mid-scan (its call is dropped, the HTTP/2 stream reset).
    let call = client.stream_batches(unshuffled(&uri));
    tokio::select! {
        _ = call => panic!("the scan cannot finish while its reads wait"),
        held = gate.wait_held(1, Duration::from_secs(10)) => assert!(held),
    }
    gate.open();
    let batches = collect(&mut client, unshuffled(&uri)).await.unwrap();
    assert_eq!(batches.len(), 6);
    // One listing: the build the first caller started went on and was shared.
    assert_eq!(harness.s3.state.counts.list.load(Ordering::SeqCst), 1);
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_replaced_by_a_shorter_one_ends_the_stream_naming_it() {
    let shards = simple_dataset(2, 8);
    let harness = Harness::start(Options::default()).await;
    let uri = upload(&harness.s3, "data", "re/", &shards).await;
    write_index(&harness.s3, "data", "re/").await;
    // Someone re-uploads shard 1 with its first half only.
    let short = tar_of(&shards[1][..4]);
    put_objects(
        &harness.s3,
        "data",
        [("re/shard-0001.tar".to_string(), short)],
    )
    .await;
    let check = |status: tonic::Status| {
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        assert!(
            status.message().contains("re/shard-0001.tar") && status.message().contains("index"),
            "{}",
            status.message()
        );
    };
    let mut client = harness.client().await;
    check(collect(&mut client, unshuffled(&uri)).await.unwrap_err());
    let s3 = harness.restart_s3().await;

    // An index without ETags (written by hand, or from a store that has
    // none) cannot tell by them: the short read itself must say it.
    let summary = s3.state.object("data", "re/_shardfeed/index.json").unwrap();
    let mut index: serde_json::Value = serde_json::from_slice(&summary).unwrap();
    for shard in index["shards"].as_array_mut().unwrap() {
        shard["etag"] = serde_json::Value::Null;
    }
    let index = serde_json::to_vec(&index).unwrap();
    s3.state
        .insert("data", "re/_shardfeed/index.json", index.into());
    let failing = Harness::with_s3(s3, Options::default()).await;
    let mut client = failing.client().await;
    check(collect(&mut client, unshuffled(&uri)).await.unwrap_err());
    let s3 = failing.restart_s3().await;

    // Under --on-bad-shard skip the missing samples are substituted.
    let skipping = Harness::with_s3(s3, skipping_damage()).await;
    let mut client = skipping.client().await;
    let batches = collect(&mut client, unshuffled(&uri)).await.unwrap();
    assert_eq!(batches.len(), 2, "counts stay as planned");
    assert!(!batches[1].substituted.is_empty());
    skipping.shutdown().await;
}

#[test]
fn a_scan_with_random_bytes_is_corrupt_and_a_whole_one_is_not() {
    // A noisy photo: its scan is most of its bytes.
    let pixels = shardfeed::dev::synthetic::synthetic_image(3, 3, 3, 160, 120);
    let mut jpeg = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 95)
        .encode_image(&pixels)
        .unwrap();
    assert_eq!(decode::check_jpeg_complete(&jpeg), Ok(()));
    for seed in 1..20 {
        let broken = shardfeed::dev::synthetic::scan_corrupted(&jpeg, 4000, seed);
        let error = decode::check_jpeg_complete(&broken).unwrap_err();
        assert!(
            matches!(&error, DecodeError::Corrupt(m) if m.contains("inside the entropy-coded data")),
            "seed {seed}: {error:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_holds_a_bounded_number_of_streams() {
    let harness = Harness::start(Options::default()).await;
    let ListenAddr::Tcp(addr) = harness.addr else {
        unreachable!("the harness listens on TCP")
    };
    // The server's SETTINGS name the limit (before, none: tonic passed the
    // unset limit through), which h2 enforces by refusing streams past it.
    let h2 = raw_h2(addr).await;
    let limit = shardfeed::server::listen::MAX_STREAMS_PER_CONNECTION as usize;
    assert_eq!(h2.current_max_send_streams(), limit);
    // The server still serves a client on another connection.
    let mut client = harness.client().await;
    let uri = upload(&harness.s3, "bounded", "p/", &simple_dataset(2, 8)).await;
    assert!(!collect(&mut client, request(&uri))
        .await
        .unwrap()
        .is_empty());
}
