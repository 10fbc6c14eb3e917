//! The rest of a sample: extra tar members and TFRecord features returned
//! beside the image, labels from a `.json` member, and the per-field cap.

mod common;

use common::*;
use shardfeed::server::pb;
use shardfeed::shard::tar::TarWriter;
use shardfeed::shard::tfrecord::{example_bytes, write_record};

/// Tar shards whose sample `n` has an image, `.txt` "caption n" (absent
/// for every fifth sample), `.json` {"label": n * 3}, and `.cls` n.
async fn upload_captioned(
    harness: &Harness,
    prefix: &str,
    shards: usize,
    per_shard: usize,
) -> String {
    let mut objects = Vec::new();
    for s in 0..shards {
        let mut tar = TarWriter::new();
        for i in 0..per_shard {
            let n = s * per_shard + i;
            let key = format!("s{s}/{n:05}");
            tar.append(&format!("{key}.jpg"), &jpeg(40, 32, n as u64));
            if n % 5 != 4 {
                tar.append(&format!("{key}.txt"), format!("caption {n}").as_bytes());
            }
            tar.append(
                &format!("{key}.json"),
                format!("{{\"label\": {}}}", n * 3).as_bytes(),
            );
            tar.append(&format!("{key}.cls"), n.to_string().as_bytes());
        }
        objects.push((format!("{prefix}shard-{s}.tar"), tar.finish()));
    }
    put_objects(&harness.s3, "captioned", objects).await;
    format!("s3://captioned/{prefix}")
}

fn with_layout(dataset: &str, layout: pb::SampleLayout) -> pb::StreamBatchesRequest {
    pb::StreamBatchesRequest {
        layout: Some(layout),
        ..request(dataset)
    }
}

/// Sample number of each key (`s{shard}/{n}`), in batch order.
fn numbers(batch: &pb::Batch) -> Vec<usize> {
    batch
        .keys
        .iter()
        .map(|k| k.rsplit('/').next().unwrap().parse().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_members_arrive_intact_and_in_step_with_their_images() {
    let harness = Harness::start(Options::default()).await;
    let dataset = upload_captioned(&harness, "steps/", 2, 12).await;
    let mut client = harness.client().await;
    let layout = pb::SampleLayout {
        fields: vec!["txt".into(), "json".into()],
        label_json_key: "label".into(),
        ..Default::default()
    };
    // Shuffled: the fields must follow their samples through the shuffle.
    let batches = collect(&mut client, with_layout(&dataset, layout))
        .await
        .unwrap();
    assert_eq!(batches.len(), 3);
    for batch in &batches {
        let [txt, json] = &batch.fields[..] else {
            panic!("two fields, got {:?}", batch.fields.len())
        };
        assert_eq!((txt.name.as_str(), json.name.as_str()), ("txt", "json"));
        for (slot, n) in numbers(batch).into_iter().enumerate() {
            assert_eq!(batch.labels[slot], n as i64 * 3, "the label from .json");
            assert_eq!(json.values[slot], format!("{{\"label\": {}}}", n * 3));
            if n % 5 == 4 {
                assert!(txt.values[slot].is_empty());
                assert!(txt.missing.contains(&(slot as u32)));
            } else {
                assert_eq!(txt.values[slot], format!("caption {n}"));
                assert!(!txt.missing.contains(&(slot as u32)));
            }
        }
    }
    // Without a layout, nothing extra and labels from .cls.
    let plain = collect(&mut client, unshuffled(&dataset)).await.unwrap();
    assert!(plain[0].fields.is_empty());
    assert_eq!(plain[0].labels[..3], [0, 1, 2]);
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_over_the_cap_ends_the_stream_naming_it() {
    let harness = Harness::start(Options::default()).await;
    let dataset = upload_captioned(&harness, "short/", 1, 8).await;
    let mut client = harness.client().await;
    let layout = pb::SampleLayout {
        fields: vec!["txt".into()],
        max_field_bytes: 9,
        ..Default::default()
    };
    let ok = collect(&mut client, with_layout(&dataset, layout.clone())).await;
    assert!(ok.is_ok(), "captions 0 to 7 are 9 bytes: within the cap");
    // "caption 10" and on are 10 bytes: the second shard holds them.
    let dataset_long = upload_captioned(&harness, "long/", 2, 8).await;
    let status = collect(&mut client, with_layout(&dataset_long, layout))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    let message = status.message();
    assert!(
        message.contains("\"txt\"")
            && message.contains("max_field_bytes")
            && message.contains("shard-1.tar"),
        "{message}"
    );
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_layouts_are_invalid_arguments_saying_what_is_wrong() {
    let harness = Harness::start(Options::default()).await;
    let dataset = upload_captioned(&harness, "bad/", 1, 8).await;
    let mut client = harness.client().await;
    for (layout, expected) in [
        (
            pb::SampleLayout {
                fields: (0..17).map(|i| format!("f{i}")).collect(),
                ..Default::default()
            },
            "at most 16",
        ),
        (
            pb::SampleLayout {
                fields: vec!["txt".into(), "txt".into()],
                ..Default::default()
            },
            "twice",
        ),
        (
            pb::SampleLayout {
                fields: vec![String::new()],
                ..Default::default()
            },
            "not a field name",
        ),
        (
            pb::SampleLayout {
                max_field_bytes: 64 << 20,
                ..Default::default()
            },
            "max_field_bytes",
        ),
    ] {
        let status = collect(&mut client, with_layout(&dataset, layout))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(expected), "{}", status.message());
        let field = match expected {
            "max_field_bytes" => "layout.max_field_bytes",
            _ => "layout.fields",
        };
        assert_eq!(bad_field(&status), field, "{expected}");
    }
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tfrecord_features_by_name_with_renamed_image_and_label() {
    let harness = Harness::start(Options::default()).await;
    let mut shard = Vec::new();
    for n in 0..8u64 {
        let caption = format!("caption {n}");
        let example = example_bytes(
            &jpeg(40, 32, n),
            Some(n as i64),
            &[("caption", caption.as_bytes())],
        );
        write_record(&mut shard, &example);
    }
    put_objects(
        &harness.s3,
        "renamed",
        [("tf/a.tfrecord".to_string(), shard)],
    )
    .await;
    let dataset = "s3://renamed/tf/";
    let mut client = harness.client().await;
    let layout = pb::SampleLayout {
        fields: vec!["caption".into(), "absent".into()],
        ..Default::default()
    };
    let batches = collect(
        &mut client,
        pb::StreamBatchesRequest {
            shuffle: Some(false),
            ..with_layout(dataset, layout)
        },
    )
    .await
    .unwrap();
    let batch = &batches[0];
    assert_eq!(batch.labels, (0..8).collect::<Vec<i64>>());
    for (slot, value) in batch.fields[0].values.iter().enumerate() {
        assert_eq!(value, &format!("caption {slot}"));
    }
    assert_eq!(batch.fields[1].missing, (0..8).collect::<Vec<u32>>());

    // A label feature that is not there: labels are -1, images still decode.
    let renamed = pb::SampleLayout {
        label_feature: "y".into(),
        ..Default::default()
    };
    let batches = collect(
        &mut client,
        pb::StreamBatchesRequest {
            shuffle: Some(false),
            ..with_layout(dataset, renamed)
        },
    )
    .await
    .unwrap();
    assert_eq!(batches[0].labels, [-1; 8]);
    assert!(batches[0].substituted.is_empty());
    // An image feature that is not there: every sample is corrupt.
    let renamed = pb::SampleLayout {
        image_feature: "jpeg".into(),
        ..Default::default()
    };
    let batches = collect(&mut client, with_layout(dataset, renamed))
        .await
        .unwrap();
    assert_eq!(batches[0].substituted.len(), 8);
    assert!(batches[0].substitution_reasons[0].contains("\"jpeg\""));
    harness.shutdown().await;
}
