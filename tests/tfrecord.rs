//! TFRecord shards end to end: written through aws-sdk-s3 into the loopback
//! S3 server, indexed and streamed by shardfeed like tar shards.

mod common;

use common::*;
use shardfeed::server::pb;
use shardfeed::shard::tfrecord::{example_bytes, write_record};

/// The samples of `shards` as TFRecord shards (label = the `.cls` text),
/// and each record's start in its shard.
fn tfrecords_of(shards: &[Vec<Sample>]) -> Vec<(Vec<u8>, Vec<usize>)> {
    shards
        .iter()
        .map(|samples| {
            let mut out = Vec::new();
            let mut starts = Vec::new();
            for sample in samples {
                starts.push(out.len());
                let (_, image) = sample.image.as_ref().expect("an image");
                let label = sample.label.as_ref().map(|l| l.parse().unwrap());
                write_record(&mut out, &example_bytes(image, label, &[]));
            }
            (out, starts)
        })
        .collect()
}

async fn upload_tfrecords(harness: &Harness, prefix: &str, shards: &[Vec<u8>]) -> String {
    let objects = shards
        .iter()
        .enumerate()
        .map(|(i, shard)| (format!("{prefix}train-{i:05}.tfrecord"), shard.clone()));
    put_objects(&harness.s3, "records", objects).await;
    format!("s3://records/{prefix}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tfrecords_give_the_same_batches_as_the_same_samples_in_tar() {
    let harness = Harness::start(Options::default()).await;
    let shards = simple_dataset(3, 11);
    let tar = upload(&harness.s3, "tar", "train/", &shards).await;
    let records: Vec<Vec<u8>> = tfrecords_of(&shards).into_iter().map(|(r, _)| r).collect();
    let tf = upload_tfrecords(&harness, "train/", &records).await;
    let mut client = harness.client().await;

    let info = describe(&mut client, &tf, 1, 8).await;
    assert_eq!(
        (info.shards, info.samples, info.batches_per_rank),
        (3, 33, 4)
    );

    let from_tar = collect(&mut client, unshuffled(&tar)).await.unwrap();
    let from_tf = collect(&mut client, unshuffled(&tf)).await.unwrap();
    assert_eq!(from_tf.len(), 4);
    for (t, r) in from_tar.iter().zip(&from_tf) {
        assert_eq!(t.images, r.images, "same pixels");
        assert_eq!(t.labels, r.labels, "same labels");
        assert!(r.substituted.is_empty());
    }
    // Keys are record numbers within each shard.
    assert_eq!(from_tf[0].keys[..3], ["00000000", "00000001", "00000002"]);
    assert_eq!(
        from_tf[1].keys[3], "00000000",
        "the second shard's first record"
    );

    // Shuffled at two ranks: each sample once, at the same per-rank counts.
    let (counts, seen) = across_ranks(&mut client, &tf, 2).await;
    assert_eq!(counts, [4, 4]);
    let unique: std::collections::HashSet<_> = seen.iter().collect();
    assert_eq!((seen.len(), unique.len()), (32, 32));
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_failing_its_data_checksum_is_one_substituted_sample() {
    let harness = Harness::start(Options::default()).await;
    let shards = simple_dataset(2, 8);
    let mut records = tfrecords_of(&shards);
    let (shard, starts) = &mut records[1];
    let damaged = starts[5] + 20; // inside record 5's data
    shard[damaged] ^= 0x40;
    let tf = upload_tfrecords(
        &harness,
        "crc/",
        &records.into_iter().map(|(r, _)| r).collect::<Vec<_>>(),
    )
    .await;
    let mut client = harness.client().await;
    let batches = collect(&mut client, unshuffled(&tf)).await.unwrap();
    assert_eq!(batches.len(), 2, "the batch count does not change");
    let batch = &batches[1];
    assert_eq!(batch.substituted, [5]);
    assert!(
        batch.substitution_reasons[0].contains("CRC32C"),
        "{:?}",
        batch.substitution_reasons
    );
    assert_eq!(batch.keys[5], "00000005");
    let source = batch.substitute_sources[0] as usize;
    assert_eq!(
        batch.labels[5], batch.labels[source],
        "the substitute's label"
    );
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_length_failing_its_checksum_is_a_shard_error_naming_the_shard() {
    let harness = Harness::start(Options::default()).await;
    let shards = simple_dataset(2, 6);
    let mut records = tfrecords_of(&shards);
    let (shard, starts) = &mut records[1];
    shard[starts[3] + 2] ^= 0x01; // record 3's length field
    let tf = upload_tfrecords(
        &harness,
        "len/",
        &records.into_iter().map(|(r, _)| r).collect::<Vec<_>>(),
    )
    .await;
    let mut client = harness.client().await;
    let status = collect(&mut client, unshuffled(&tf)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::DataLoss);
    assert!(
        status.message().contains("train-00001.tfrecord")
            && status.message().contains("length checksum"),
        "{}",
        status.message()
    );
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imagenet_records_are_named_by_their_filename_and_labels_can_start_at_zero() {
    // TensorFlow's ImageNet records: labels 1..1000 (0 = background) and an
    // `image/filename` feature; one record lacks the name.
    let harness = Harness::start(Options::default()).await;
    let mut shard = Vec::new();
    for i in 0..6u64 {
        let image = jpeg(32, 24, i);
        let name = format!("n0144{i}_{i}.JPEG");
        let extra: Vec<(&str, &[u8])> = if i == 5 {
            Vec::new()
        } else {
            vec![("image/filename", name.as_bytes())]
        };
        write_record(&mut shard, &example_bytes(&image, Some(i as i64), &extra));
    }
    let uri = upload_tfrecords(&harness, "imagenet/", &[shard]).await;
    let mut client = harness.client().await;
    let request = |offset: i64, key_feature: &str| pb::StreamBatchesRequest {
        batch_size: Some(6),
        layout: Some(pb::SampleLayout {
            label_offset: offset,
            key_feature: key_feature.into(),
            ..Default::default()
        }),
        ..unshuffled(&uri)
    };
    let batches = collect(&mut client, request(0, "")).await.unwrap();
    assert_eq!(
        batches[0].labels,
        [0, 1, 2, 3, 4, 5],
        "as stored by default"
    );
    assert_eq!(
        batches[0].keys,
        [
            "n01440_0.JPEG",
            "n01441_1.JPEG",
            "n01442_2.JPEG",
            "n01443_3.JPEG",
            "n01444_4.JPEG",
            "00000005"
        ],
        "named by image/filename, by record number without it"
    );
    let shifted = collect(&mut client, request(-1, "")).await.unwrap();
    assert_eq!(
        shifted[0].labels,
        [-1, 0, 1, 2, 3, 4],
        "0..999; background unlabelled"
    );
    assert_eq!(shifted[0].images, batches[0].images, "the same pixels");
    let numbered = collect(&mut client, request(0, "no/such/feature"))
        .await
        .unwrap();
    assert_eq!(numbered[0].keys[0], "00000000");

    let status = collect(&mut client, request(1 << 40, ""))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(bad_field(&status), "layout.label_offset", "{status:?}");
    harness.shutdown().await;
}
