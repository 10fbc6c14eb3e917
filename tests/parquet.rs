//! Parquet files end to end, laid out as the Hugging Face Hub stores image
//! datasets: written by the `parquet` crate's own writer, put through
//! aws-sdk-s3 into the loopback S3 server, indexed from their footers and
//! streamed by row group.

mod common;

use common::*;
use shardfeed::dev::parquet_files::{self, Layout, Row};
use shardfeed::server::pb;
use shardfeed::server::pb::shardfeed_client::ShardfeedClient;
use tonic::transport::Channel;

/// The rows of `shards`' samples, in order (label = the `.cls` text).
fn rows_of(samples: &[Sample]) -> Vec<Row> {
    samples
        .iter()
        .enumerate()
        .map(|(i, sample)| Row {
            image: sample.image.as_ref().map(|(_, image)| image.clone()),
            path: Some(format!("img/{i:05}.jpg")),
            label: sample.label.as_ref().map(|l| l.parse().unwrap()),
        })
        .collect()
}

fn parquet_of(samples: &[Sample], layout: &Layout) -> Vec<u8> {
    parquet_files::write(&rows_of(samples), layout).unwrap()
}

async fn upload_files(harness: &Harness, bucket: &str, files: Vec<Vec<u8>>) -> String {
    let objects = files
        .into_iter()
        .enumerate()
        .map(|(i, file)| (format!("data/train-{i:05}-of-00042.parquet"), file));
    put_objects(&harness.s3, bucket, objects).await;
    format!("s3://{bucket}/data/")
}

/// The status a Describe of `uri` (one rank, batches of `batch`) is
/// refused with.
async fn describe_refused(
    client: &mut ShardfeedClient<Channel>,
    uri: &str,
    batch: u32,
) -> tonic::Status {
    client
        .describe(pb::DescribeRequest {
            dataset: uri.to_string(),
            world_size: 1,
            batch_size: Some(batch),
            ..Default::default()
        })
        .await
        .unwrap_err()
}

fn groups_of(rows: usize) -> Layout {
    Layout {
        rows_per_group: rows,
        ..Layout::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_groups_give_the_same_batches_as_the_same_samples_in_tar() {
    let harness = Harness::start(Options::default()).await;
    let shards = simple_dataset(3, 11);
    let tar = upload(&harness.s3, "tar", "train/", &shards).await;
    // Two files: the first holds the first two shards as row groups of 11.
    let first: Vec<Sample> = shards[..2].concat();
    let files = vec![
        parquet_of(&first, &groups_of(11)),
        parquet_of(&shards[2], &groups_of(11)),
    ];
    let uri = upload_files(&harness, "hub", files).await;
    let mut client = harness.client().await;

    let info = describe(&mut client, &uri, 1, 8).await;
    assert_eq!(
        (info.shards, info.samples, info.batches_per_rank),
        (3, 33, 4),
        "a row group is a shard"
    );
    let from_tar = collect(&mut client, unshuffled(&tar)).await.unwrap();
    let from_parquet = collect(&mut client, unshuffled(&uri)).await.unwrap();
    assert_eq!(from_parquet.len(), 4);
    for (t, p) in from_tar.iter().zip(&from_parquet) {
        assert_eq!(t.images, p.images, "same pixels");
        assert_eq!(t.labels, p.labels, "same labels");
        assert!(p.substituted.is_empty());
    }
    // Named by the Image feature's path; the row number is the identity.
    assert_eq!(
        from_parquet[0].keys[..2],
        ["img/00000.jpg", "img/00001.jpg"]
    );
    assert_eq!(
        from_parquet[1].keys[3], "img/00011.jpg",
        "row 11 opens the second row group"
    );

    // Shuffled at two ranks: every row once, the same count on each.
    let (counts, seen) = across_ranks(&mut client, &uri, 2).await;
    assert_eq!(counts, [4, 4]);
    let unique: std::collections::HashSet<_> = seen.iter().collect();
    assert_eq!((seen.len(), unique.len()), (32, 32));
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_codec_page_version_and_encoding_reads_the_same_pixels() {
    let harness = Harness::start(Options::default()).await;
    let shards = simple_dataset(1, 10);
    let tar = upload(&harness.s3, "tarref", "t/", &shards).await;
    let mut client = harness.client().await;
    let mut bucket = 0;
    for codec in ["none", "snappy", "zstd", "gzip", "lz4_raw", "lz4"] {
        // v2 without a dictionary: the crate's writer falls back to the delta
        // encodings (DELTA_BYTE_ARRAY images, DELTA_BINARY_PACKED labels).
        for (page_v2, dictionary) in [(false, false), (true, true), (false, true), (true, false)] {
            let layout = Layout {
                rows_per_group: 4,
                codec: codec.into(),
                page_v2,
                dictionary,
                ..Layout::default()
            };
            bucket += 1;
            let uri = upload_files(
                &harness,
                &format!("codec{bucket}"),
                vec![parquet_of(&shards[0], &layout)],
            )
            .await;
            let mut batches = collect(&mut client, unshuffled(&uri)).await.unwrap();
            // Keys differ (paths, not tar keys): compare the rest.
            for batch in &mut batches {
                batch.keys = (0..batch.keys.len())
                    .map(|i| format!("{:06}", batch.index as usize * 8 + i))
                    .collect();
            }
            let mut tar_batches = collect(&mut client, unshuffled(&tar)).await.unwrap();
            for batch in &mut tar_batches {
                batch.keys = (0..batch.keys.len())
                    .map(|i| format!("{:06}", batch.index as usize * 8 + i))
                    .collect();
            }
            assert_eq!(
                digest(&batches),
                digest(&tar_batches),
                "{codec}, page v2 {page_v2}, dictionary {dictionary}"
            );
        }
    }
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_null_image_is_a_substituted_row_and_a_path_only_image_a_clear_error() {
    let harness = Harness::start(Options::default()).await;
    let mut rows = rows_of(&simple_dataset(1, 8)[0]);
    rows[3].image = None;
    rows[3].path = None;
    rows[5].image = Some(b"not an image at all".to_vec());
    let file = parquet_files::write(&rows, &groups_of(8)).unwrap();
    let uri = upload_files(&harness, "nulls", vec![file]).await;
    let mut client = harness.client().await;
    let batches = collect(&mut client, unshuffled(&uri)).await.unwrap();
    assert_eq!(batches.len(), 1, "the batch count does not change");
    assert_eq!(batches[0].substituted, [3, 5]);
    assert!(
        batches[0].substitution_reasons[0].contains("row 3")
            && batches[0].substitution_reasons[0].contains("null"),
        "{:?}",
        batches[0].substitution_reasons
    );

    // An image stored by path only (outside the file): not fetched, named.
    rows[3].image = Some(Vec::new());
    rows[3].path = Some("s3://elsewhere/cat.jpg".into());
    let file = parquet_files::write(&rows, &groups_of(8)).unwrap();
    let uri = upload_files(&harness, "pathonly", vec![file]).await;
    let status = collect(&mut client, unshuffled(&uri)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("row 3") && status.message().contains("s3://elsewhere/cat.jpg"),
        "{}",
        status.message()
    );
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn columns_are_named_checked_and_projected() {
    let harness = Harness::start(Options::default()).await;
    let shards = simple_dataset(1, 6);
    let uri = upload_files(
        &harness,
        "columns",
        vec![parquet_of(&shards[0], &groups_of(6))],
    )
    .await;
    let mut client = harness.client().await;
    let with = |layout: pb::SampleLayout| pb::StreamBatchesRequest {
        layout: Some(layout),
        batch_size: Some(6),
        ..unshuffled(&uri)
    };
    // A missing column: named, with the columns the file has.
    let status = collect(
        &mut client,
        with(pb::SampleLayout {
            image_feature: "picture".into(),
            ..Default::default()
        }),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("\"picture\"") && status.message().contains("image.bytes"),
        "{}",
        status.message()
    );
    // A wrongly typed one: the type found and the type wanted.
    let status = collect(
        &mut client,
        with(pb::SampleLayout {
            image_feature: "label".into(),
            ..Default::default()
        }),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("INT64") && status.message().contains("wanted binary"),
        "{}",
        status.message()
    );
    // Other columns travel as fields, numbers as text.
    let batches = collect(
        &mut client,
        with(pb::SampleLayout {
            fields: vec!["image.path".into(), "label".into()],
            ..Default::default()
        }),
    )
    .await
    .unwrap();
    let fields = &batches[0].fields;
    assert_eq!(fields.len(), 2);
    assert_eq!(fields[0].values[2].as_ref(), b"img/00002.jpg");
    assert_eq!(fields[1].values[2].as_ref(), b"2");
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class_names_come_from_the_hub_metadata_and_string_labels_map_to_them() {
    let harness = Harness::start(Options::default()).await;
    let shards = simple_dataset(1, 6);
    let classes: Vec<String> = (0..6).map(|i| format!("class-{i}")).collect();
    let hub = Layout {
        classes: classes.clone(),
        ..groups_of(3)
    };
    let text = Layout {
        text_labels: true,
        ..hub.clone()
    };
    let ints = upload_files(&harness, "hubints", vec![parquet_of(&shards[0], &hub)]).await;
    let strings = upload_files(&harness, "hubtext", vec![parquet_of(&shards[0], &text)]).await;
    let mut client = harness.client().await;
    let info = describe(&mut client, &ints, 1, 6).await;
    assert_eq!(info.classes, classes);
    let six = |uri: &str| pb::StreamBatchesRequest {
        batch_size: Some(6),
        ..unshuffled(uri)
    };
    let from_ints = collect(&mut client, six(&ints)).await.unwrap();
    let from_strings = collect(&mut client, six(&strings)).await.unwrap();
    assert_eq!(from_ints[0].labels, [0, 1, 2, 3, 4, 5]);
    assert_eq!(from_strings[0].labels, from_ints[0].labels);
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_is_not_parquet_or_is_cut_short_is_named() {
    let harness = Harness::start(Options::default()).await;
    let shards = simple_dataset(1, 4);
    let whole = parquet_of(&shards[0], &groups_of(4));
    let mut client = harness.client().await;
    let cut = whole[..whole.len() - 3].to_vec();
    let mut lying = whole.clone();
    // The footer claims more metadata than the file holds.
    let n = lying.len();
    lying[n - 8..n - 4].copy_from_slice(&(u32::MAX / 2).to_le_bytes());
    for (bucket, file) in [
        ("notparquet", b"PK\x03\x04 a zip, not parquet".to_vec()),
        ("cut", cut),
        ("lying", lying),
        ("looping", with_boolean_lists_in_its_footer(&whole, 1_000)),
    ] {
        let uri = upload_files(&harness, bucket, vec![file]).await;
        let status = describe_refused(&mut client, &uri, 4).await;
        assert_eq!(status.code(), tonic::Code::DataLoss, "{bucket}");
        assert!(
            status.message().contains("train-00000-of-00042.parquet")
                && status.message().contains("Parquet"),
            "{bucket}: {}",
            status.message()
        );
    }
    harness.shutdown().await;
}

/// `file` with `fields` unknown fields ahead of its footer's own, each a
/// list header claiming 2^31 - 1 booleans (nine bytes): the parquet crate
/// skips such a list one turn per element without reading a byte, so
/// unchecked these 9 KB would keep its decoder looping for minutes.
fn with_boolean_lists_in_its_footer(file: &[u8], fields: usize) -> Vec<u8> {
    let n = file.len();
    let footer_len = u32::from_le_bytes(file[n - 8..n - 4].try_into().unwrap()) as usize;
    let footer_start = n - 8 - footer_len;
    let mut hostile = file[..footer_start].to_vec();
    for _ in 0..fields {
        // Field 100 (long form, type list), then the list header.
        hostile.extend([0x09, 0xC8, 0x01, 0xF1, 0xFF, 0xFF, 0xFF, 0xFF, 0x07]);
    }
    hostile.extend(&file[footer_start..n - 8]);
    let grown = (footer_len + 9 * fields) as u32;
    hostile.extend(grown.to_le_bytes());
    hostile.extend(b"PAR1");
    hostile
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_group_past_the_readers_limit_is_refused_naming_it() {
    let options = Options {
        pipeline: shardfeed::pipeline::PipelineConfig {
            read: small_parts(),
            max_member_bytes: 2 << 10,
            ..shardfeed::pipeline::PipelineConfig::default()
        },
        ..Options::default()
    };
    let harness = Harness::start(options).await;
    let shards = simple_dataset(1, 12);
    let uri = upload_files(
        &harness,
        "large",
        vec![parquet_of(&shards[0], &groups_of(12))],
    )
    .await;
    let mut client = harness.client().await;
    let status = collect(&mut client, unshuffled(&uri)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("row group 0")
            && status.message().contains("train-00000-of-00042.parquet")
            && status.message().contains("limit"),
        "{}",
        status.message()
    );
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_resumed_inside_a_row_group_is_the_full_streams_rest() {
    let harness = Harness::start(Options::default()).await;
    let shards = simple_dataset(2, 10);
    let all: Vec<Sample> = shards.concat();
    let uri = upload_files(&harness, "resume", vec![parquet_of(&all, &groups_of(7))]).await;
    let mut client = harness.client().await;
    let stream = |start_batch| pb::StreamBatchesRequest {
        batch_size: Some(3),
        start_batch,
        augmentation: Some(training_augmentation()),
        ..request(&uri)
    };
    let full = collect(&mut client, stream(0)).await.unwrap();
    let rest = collect(&mut client, stream(3)).await.unwrap();
    assert_eq!(full.len(), 6);
    assert_eq!(digest(&full[3..]), digest(&rest));
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planning_reads_one_tail_per_file_and_no_row_data() {
    let harness = Harness::start(Options::default()).await;
    let shards = simple_dataset(4, 5);
    let files: Vec<Vec<u8>> = shards
        .iter()
        .map(|s| parquet_of(s, &groups_of(2)))
        .collect();
    let uri = upload_files(&harness, "plan", files).await;
    let mut client = harness.client().await;
    let before = gets(&harness.s3);
    let info = describe(&mut client, &uri, 1, 4).await;
    assert_eq!((info.shards, info.samples), (12, 20), "3 row groups a file");
    assert_eq!(gets(&harness.s3) - before, 4, "one ranged GET per file");
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn string_labels_without_class_names_are_their_own_sorted_classes() {
    let harness = Harness::start(Options::default()).await;
    let shards = simple_dataset(1, 6);
    // Labels 0..5 written as these names, with no class list anywhere.
    let names: Vec<String> = ["zebra", "ant", "moth", "cat", "ant", "bee"]
        .map(String::from)
        .to_vec();
    let mut rows = rows_of(&shards[0]);
    for (i, row) in rows.iter_mut().enumerate() {
        row.label = Some(i as i64);
    }
    let layout = Layout {
        rows_per_group: 4,
        classes: names,
        text_labels: true,
        class_metadata: false,
        ..Layout::default()
    };
    let uri = upload_files(
        &harness,
        "textlabels",
        vec![parquet_files::write(&rows, &layout).unwrap()],
    )
    .await;
    let mut client = harness.client().await;
    let info = describe(&mut client, &uri, 1, 6).await;
    assert_eq!(info.classes, ["ant", "bee", "cat", "moth", "zebra"]);
    let batches = collect(
        &mut client,
        pb::StreamBatchesRequest {
            batch_size: Some(6),
            ..unshuffled(&uri)
        },
    )
    .await
    .unwrap();
    assert_eq!(batches[0].labels, [4, 0, 3, 2, 0, 1]);
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_index_plans_row_groups_without_reading_the_footers_again() {
    let harness = Harness::start(Options::default()).await;
    let shards = simple_dataset(2, 9);
    let files: Vec<Vec<u8>> = shards
        .iter()
        .map(|s| parquet_of(s, &groups_of(4)))
        .collect();
    let uri = upload_files(&harness, "saved", files).await;
    write_index(&harness.s3, "saved", "data/").await;
    let mut client = harness.client().await;
    let before = gets(&harness.s3);
    let info = describe(&mut client, &uri, 1, 6).await;
    assert_eq!((info.shards, info.samples), (6, 18));
    assert_eq!(
        gets(&harness.s3) - before,
        1,
        "the summary only: row groups have no per-shard files"
    );
    let batches = collect(&mut client, unshuffled(&uri)).await.unwrap();
    let labels: Vec<i64> = batches.iter().flat_map(|b| b.labels.clone()).collect();
    let stored: Vec<i64> = shards
        .concat()
        .iter()
        .map(|s| s.label.as_ref().unwrap().parse().unwrap())
        .take(16)
        .collect();
    assert_eq!(labels, stored);
    harness.shutdown().await;
}

/// `file` with the first data page of column `leaf` claiming the most
/// decompressed bytes its header's varint can say in as many bytes (the
/// red team's P3: a page that makes a decompressor size its buffer by a
/// claim the footer never charged).
fn with_a_page_claiming_more(file: &[u8], leaf: &str) -> Vec<u8> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let reader = SerializedFileReader::new(bytes::Bytes::copy_from_slice(file)).unwrap();
    let group = reader.metadata().row_group(0);
    let column = (0..group.num_columns())
        .map(|c| group.column(c))
        .find(|c| c.column_path().string() == leaf)
        .expect("the leaf");
    let at = column.data_page_offset() as usize;
    let mut patched = file.to_vec();
    // Field 1 (the page type, DATA_PAGE), then field 2, the claim.
    assert_eq!(&patched[at..at + 3], &[0x15, 0x00, 0x15], "a v1 data page");
    let varint = &mut patched[at + 3..];
    let width = varint.iter().position(|b| b & 0x80 == 0).unwrap() + 1;
    for byte in &mut varint[..width - 1] {
        *byte = 0xFF;
    }
    // The last byte's top bits, less the zigzag sign bit's: positive.
    varint[width - 1] = 0x7F;
    varint[0] = 0xFE;
    patched
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_claiming_more_than_its_footer_is_refused_before_it_is_decompressed() {
    let harness = Harness::start(Options::default()).await;
    let shards = simple_dataset(1, 12);
    let layout = Layout {
        dictionary: false,
        ..groups_of(12)
    };
    let file = with_a_page_claiming_more(&parquet_of(&shards[0], &layout), "image.bytes");
    let uri = upload_files(&harness, "claims", vec![file]).await;
    let mut client = harness.client().await;
    let status = collect(&mut client, unshuffled(&uri)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::DataLoss, "{}", status.message());
    assert!(
        status.message().contains("row group 0")
            && status.message().contains("image.bytes")
            && status.message().contains("more than the")
            && status.message().contains("footer"),
        "{}",
        status.message()
    );
    harness.shutdown().await;
}

/// `file` with the body of column `leaf`'s one data page replaced by
/// `body(length)`, `length` bytes: the header and footer are left as
/// written, so every claim still says what the honest page held.
fn with_a_page_body(file: &[u8], leaf: &str, body: impl Fn(usize) -> Vec<u8>) -> Vec<u8> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let reader = SerializedFileReader::new(bytes::Bytes::copy_from_slice(file)).unwrap();
    let group = reader.metadata().row_group(0);
    let column = (0..group.num_columns())
        .map(|c| group.column(c))
        .find(|c| c.column_path().string() == leaf)
        .expect("the leaf");
    let at = column.data_page_offset() as usize;
    let end = at + column.compressed_size() as usize;
    // Field 1 (DATA_PAGE), field 2 (the claim), field 3 (the body's size).
    assert_eq!(&file[at..at + 3], &[0x15, 0x00, 0x15], "a v1 data page");
    let varint = |from: usize| {
        let width = file[from..].iter().position(|b| b & 0x80 == 0).unwrap() + 1;
        let raw = file[from..from + width]
            .iter()
            .rev()
            .fold(0u64, |value, byte| value << 7 | u64::from(byte & 0x7f));
        (raw >> 1, from + width)
    };
    let (_claim, next) = varint(at + 3);
    assert_eq!(file[next], 0x15, "field 3 follows");
    let (stored, _) = varint(next + 1);
    let start = end - stored as usize;
    let mut patched = file.to_vec();
    let replacement = body(stored as usize);
    assert_eq!(replacement.len(), stored as usize);
    patched[start..end].copy_from_slice(&replacement);
    patched
}

/// This process's peak resident set, from /proc.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// `inflated` zero bytes in as few bytes as `codec` allows, padded with
/// zeros to `length` (past the stream: the decompressor never gets there).
fn bomb(codec: &str, inflated: usize, length: usize) -> Vec<u8> {
    use std::io::Write;
    let chunk = vec![0u8; 16 << 20];
    let mut out = match codec {
        // Members of 16 MiB each: a multi-member stream, read whole.
        "gzip" => {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            encoder.write_all(&chunk).unwrap();
            encoder.finish().unwrap().repeat(inflated / chunk.len())
        }
        "lz4" => {
            let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::new());
            for _ in 0..inflated / chunk.len() {
                encoder.write_all(&chunk).unwrap();
            }
            encoder.finish().unwrap()
        }
        other => unreachable!("{other}"),
    };
    assert!(out.len() <= length, "{codec}: {} > {length}", out.len());
    out.resize(length, 0);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_that_expands_past_its_claim_is_refused_before_the_crate_reads_it() {
    // The red team's P1 at its size (1.2 GB from one page), through the
    // codecs the crate reads to their end: GZIP, and the LZ4 frame it
    // falls back to where an LZ4 page is not Hadoop-framed.
    let harness = Harness::start(Options::default()).await;
    let inflated = 1_200 << 20;
    for (codec, image_bytes) in [("gzip", 1_500_000), ("lz4", 5_000_000)] {
        // Incompressible: the honest page is as long as the image.
        let image: Vec<u8> = (0..image_bytes as u64)
            .map(|i| (shardfeed::hash::fmix64(i) >> 56) as u8)
            .collect();
        // The first of a batch's rows, each in its own row group.
        let rows: Vec<Row> = std::iter::once(image)
            .chain((0..7).map(|i| vec![i; 64]))
            .enumerate()
            .map(|(i, image)| Row {
                image: Some(image),
                path: Some(format!("{i}.jpg")),
                label: Some(0),
            })
            .collect();
        let layout = Layout {
            codec: codec.into(),
            dictionary: false,
            ..groups_of(1)
        };
        let honest = parquet_files::write(&rows, &layout).unwrap();
        let file = with_a_page_body(&honest, "image.bytes", |length| {
            bomb(codec, inflated, length)
        });
        let uri = upload_files(&harness, &format!("bomb-{codec}"), vec![file]).await;
        let mut client = harness.client().await;
        let status = collect(&mut client, unshuffled(&uri)).await.unwrap_err();
        // The crate's unbounded read would have held the 1.2 GB (36 MB
        // peak for this test with the check).
        let peak = peak_rss_kib();
        assert!(peak < 1 << 20, "{codec}: peak RSS {peak} KiB");
        assert_eq!(
            status.code(),
            tonic::Code::DataLoss,
            "{codec}: {}",
            status.message()
        );
        assert!(
            status.message().contains("image.bytes")
                && status.message().contains("decompresses past"),
            "{codec}: {}",
            status.message()
        );
    }
    harness.shutdown().await;
}

/// `file` with its footer written again, the leaf `leaf`'s chunk in row
/// group 0 saying it decompresses to `uncompressed` bytes (pages as
/// written).
fn with_a_chunk_claiming(file: &[u8], leaf: &str, uncompressed: i64) -> Vec<u8> {
    use parquet::file::metadata::ParquetMetaDataWriter;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let reader = SerializedFileReader::new(bytes::Bytes::copy_from_slice(file)).unwrap();
    let metadata = reader.metadata().clone();
    let mut groups: Vec<_> = metadata.row_groups().to_vec();
    let columns = groups[0]
        .columns()
        .iter()
        .map(|column| match column.column_path().string() == leaf {
            true => column
                .clone()
                .into_builder()
                .set_total_uncompressed_size(uncompressed)
                .build()
                .unwrap(),
            false => column.clone(),
        })
        .collect();
    groups[0] = groups[0]
        .clone()
        .into_builder()
        .set_column_metadata(columns)
        .build()
        .unwrap();
    let metadata = metadata.into_builder().set_row_groups(groups).build();
    let footer_length =
        u32::from_le_bytes(file[file.len() - 8..file.len() - 4].try_into().unwrap());
    let mut out = file[..file.len() - 8 - footer_length as usize].to_vec();
    ParquetMetaDataWriter::new(&mut out, &metadata)
        .finish()
        .unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_string_label_chunk_past_plannings_bound_is_refused_before_it_is_read() {
    // The red team's P6 with a footer that says what its pages hold: 1.2 GB
    // of label pages planning would have decompressed before any budget.
    let harness = Harness::start(Options::default()).await;
    let shards = simple_dataset(1, 6);
    let mut rows = rows_of(&shards[0]);
    for (i, row) in rows.iter_mut().enumerate() {
        row.label = Some(i as i64 % 2);
    }
    let layout = Layout {
        classes: vec!["ant".into(), "bee".into()],
        text_labels: true,
        class_metadata: false,
        ..groups_of(6)
    };
    let honest = parquet_files::write(&rows, &layout).unwrap();
    let file = with_a_chunk_claiming(&honest, "label", 1_200 << 20);
    let uri = upload_files(&harness, "labelclaim", vec![file]).await;
    let mut client = harness.client().await;
    let status = describe_refused(&mut client, &uri, 6).await;
    assert_eq!(
        status.code(),
        tonic::Code::FailedPrecondition,
        "{}",
        status.message()
    );
    assert!(
        status.message().contains("row group 0")
            && status.message().contains("string label column")
            && status.message().contains(&(256u64 << 20).to_string()),
        "{}",
        status.message()
    );
    harness.shutdown().await;
}
