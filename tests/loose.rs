//! Loose-object datasets end to end: individual images written through
//! aws-sdk-s3 into the loopback S3 server, listed (with pagination), labelled
//! by class folder or manifest, and streamed like shards.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use common::*;
use shardfeed::dataset::DatasetLocation;
use shardfeed::pipeline::PipelineConfig;
use shardfeed::server::pb;
use shardfeed::shard::BadShardPolicy;
use shardfeed::store::cache::EvictionPolicy;

const CLASSES: [(&str, usize); 3] = [("dog", 13), ("bird", 14), ("cat", 13)];

/// `CLASSES` as `prefix<class>/<n>.jpg` objects (distinct pixels each), with
/// non-image objects beside them that a listing must skip.
fn class_folder_objects(prefix: &str) -> Vec<(String, Vec<u8>)> {
    let mut objects = Vec::new();
    let mut seed = 0;
    for (class, count) in CLASSES {
        for n in 0..count {
            seed += 1;
            objects.push((
                format!("{prefix}{class}/{n:03}.jpg"),
                jpeg(40 + (seed % 4) as u32 * 8, 32, seed),
            ));
        }
    }
    objects.push((format!("{prefix}README.txt"), b"not an image".to_vec()));
    objects.push((format!("{prefix}cat/labels.json"), b"{}".to_vec()));
    objects
}

/// The label ImageFolder gives `key` (classes numbered in sorted order).
fn folder_label(key: &str) -> i64 {
    match key.split('/').next() {
        Some("bird") => 0,
        Some("cat") => 1,
        Some("dog") => 2,
        _ => panic!("unexpected key {key}"),
    }
}

fn keyed_pixels(batches: &[pb::Batch]) -> HashMap<String, (i64, Vec<u8>)> {
    let mut out = HashMap::new();
    for batch in batches {
        let per_image = batch.images.len() / batch.keys.len();
        for (i, key) in batch.keys.iter().enumerate() {
            let pixels = batch.images[i * per_image..(i + 1) * per_image].to_vec();
            assert!(
                out.insert(key.clone(), (batch.labels[i], pixels)).is_none(),
                "{key} twice"
            );
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class_folders_round_trip_with_image_folder_labels() {
    let harness = Harness::start(Options::default()).await;
    put_objects(&harness.s3, "loose", class_folder_objects("imgs/")).await;
    // The same images as a tar shard, keyed like the objects without `.jpg`.
    let samples: Vec<Sample> = class_folder_objects("")
        .into_iter()
        .filter(|(key, _)| key.ends_with(".jpg"))
        .map(|(key, data)| Sample {
            key: key.trim_end_matches(".jpg").to_string(),
            image: Some(("jpg", data)),
            label: Some(folder_label(&key).to_string()),
        })
        .collect();
    let tar = upload(&harness.s3, "tars", "same/", &[samples]).await;
    let loose = "s3://loose/imgs/";
    let mut client = harness.client().await;

    let info = describe(&mut client, loose, 1, 8).await;
    assert_eq!(
        (info.shards, info.samples, info.batches_per_rank),
        (1, 40, 5)
    );

    let from_loose = collect(&mut client, unshuffled(loose)).await.unwrap();
    let from_tar = collect(&mut client, unshuffled(&tar)).await.unwrap();
    let served = keyed_pixels(&from_loose);
    assert_eq!(served.len(), 40, "every image once");
    let tar_pixels = keyed_pixels(&from_tar);
    for (key, (label, pixels)) in &served {
        assert_eq!(*label, folder_label(key), "{key}");
        let (tar_label, tar_image) = &tar_pixels[key.trim_end_matches(".jpg")];
        assert_eq!(
            (label, pixels),
            (tar_label, tar_image),
            "{key}: same as in tar"
        );
    }
    assert!(from_loose.iter().all(|b| b.substituted.is_empty()));
    // The index order is a fixed mix of the classes, not the sorted listing.
    let first_batch_labels: HashSet<_> = from_loose[0].labels.iter().collect();
    assert!(first_batch_labels.len() > 1, "{:?}", from_loose[0].keys);

    // Shuffled at two ranks: disjoint, equal counts, the same on a repeat.
    let mut seen = HashSet::new();
    for rank in 0..2 {
        let request = pb::StreamBatchesRequest {
            rank,
            world_size: 2,
            ..request(loose)
        };
        let batches = collect(&mut client, request.clone()).await.unwrap();
        assert_eq!(batches.len(), 2);
        let again = collect(&mut client, request.clone()).await.unwrap();
        assert_eq!(digest(&batches), digest(&again), "deterministic");
        // Resumed at batch 1 (mid-group): exactly the rest of the stream.
        let resumed = pb::StreamBatchesRequest {
            start_batch: 1,
            ..request
        };
        let rest = collect(&mut client, resumed).await.unwrap();
        assert_eq!(digest(&rest), digest(&batches[1..]), "resume");
        for key in keys(&batches) {
            assert!(seen.insert(key.clone()), "{key} at both ranks");
        }
    }

    // Loose objects carry nothing but the image: fields are refused.
    let with_fields = pb::StreamBatchesRequest {
        layout: Some(pb::SampleLayout {
            fields: vec!["txt".into()],
            ..Default::default()
        }),
        ..request(loose)
    };
    let status = collect(&mut client, with_fields).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("loose image objects"),
        "{}",
        status.message()
    );
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_of_more_than_a_thousand_keys_paginates_and_its_stored_index_agrees() {
    let harness = Harness::start(Options::default()).await;
    // The loopback server pages ListObjectsV2 at 1,000 keys like S3.
    let images: Vec<Vec<u8>> = (0..4).map(|seed| jpeg(16, 16, seed)).collect();
    let objects = (0..1100).map(|i| {
        let class = if i % 2 == 0 { "even" } else { "odd" };
        (format!("many/{class}/{i:05}.jpg"), images[i % 4].clone())
    });
    put_objects(&harness.s3, "pages", objects).await;
    let uri = "s3://pages/many/";
    let mut client = harness.client().await;
    let info = describe(&mut client, uri, 1, 100).await;
    assert_eq!(
        (info.shards, info.samples),
        (2, 1100),
        "1,024 objects per group"
    );
    let request = pb::StreamBatchesRequest {
        batch_size: Some(100),
        height: 8,
        width: 8,
        ..unshuffled(uri)
    };
    let built = collect(&mut client, request.clone()).await.unwrap();
    let keys_served = keys(&built);
    let unique: HashSet<_> = keys_served.iter().collect();
    assert_eq!((keys_served.len(), unique.len()), (1100, 1100));
    for batch in &built {
        for (key, label) in batch.keys.iter().zip(&batch.labels) {
            let number: usize = key[key.len() - 9..key.len() - 4].parse().unwrap();
            assert_eq!(*label, (number % 2) as i64, "{key}: even=0, odd=1");
        }
    }

    // `shardfeed index` writes the listing; a server that reads it serves
    // the same batches without listing again.
    write_index(&harness.s3, "pages", "many/").await;
    let s3 = harness.restart_s3().await;
    let harness = Harness::with_s3(s3, Options::default()).await;
    let lists_before = harness
        .s3
        .state
        .counts
        .list
        .load(std::sync::atomic::Ordering::SeqCst);
    let mut client = harness.client().await;
    let stored = collect(&mut client, request).await.unwrap();
    assert_eq!(digest(&built), digest(&stored));
    let lists_after = harness
        .s3
        .state
        .counts
        .list
        .load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(lists_after, lists_before, "the stored index is the listing");
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_list_keys_and_labels_and_name_what_is_missing() {
    let harness = Harness::start(Options::default()).await;
    let mut objects: Vec<(String, Vec<u8>)> = (0..24)
        .map(|i| (format!("flat/img-{i:02}.jpg"), jpeg(24, 24, i)))
        .collect();
    let train: String = (0..16)
        .map(|i| format!("img-{i:02}.jpg,{}\n", i % 5))
        .collect();
    objects.push((
        "flat/train.csv".into(),
        format!("key,label\n{train}").into_bytes(),
    ));
    let val: String = (16..24)
        .map(|i| format!("{{\"key\": \"img-{i:02}.jpg\", \"label\": {}}}\n", 100 + i))
        .collect();
    objects.push(("flat/val.jsonl".into(), val.into_bytes()));
    objects.push((
        "flat/broken.csv".into(),
        b"img-00.jpg,1\nnope.jpg,2\n".to_vec(),
    ));
    put_objects(&harness.s3, "manifests", objects).await;
    let mut client = harness.client().await;

    for (manifest, expected) in [
        ("train.csv", (0..16).map(|i| (i, i % 5)).collect::<Vec<_>>()),
        ("val.jsonl", (16..24).map(|i| (i, 100 + i)).collect()),
    ] {
        let uri = format!("s3://manifests/flat/{manifest}");
        let request = pb::StreamBatchesRequest {
            batch_size: Some(expected.len() as u32),
            ..unshuffled(&uri)
        };
        let batches = collect(&mut client, request).await.unwrap();
        let mut served: Vec<(i64, i64)> = batches[0]
            .keys
            .iter()
            .zip(&batches[0].labels)
            .map(|(key, label)| (key[4..6].parse().unwrap(), *label))
            .collect();
        served.sort();
        assert_eq!(served, expected, "{manifest}");
    }

    let status = collect(&mut client, unshuffled("s3://manifests/flat/broken.csv"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("broken.csv")
            && status
                .message()
                .contains("1 listed objects do not exist (first: [\"nope.jpg\"])"),
        "{}",
        status.message()
    );

    // Two manifests in one folder keep their own index.
    let location = DatasetLocation {
        prefix: "flat/".into(),
        manifest: Some("val.jsonl".into()),
    };
    write_index_at(&harness.s3, "manifests", &location).await;
    let summary = harness
        .s3
        .state
        .object("manifests", "flat/_shardfeed/val.jsonl/index.json")
        .expect("the manifest's index in its own folder");
    assert!(std::str::from_utf8(&summary)
        .unwrap()
        .contains("\"layout\":\"objects\""));
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_changed_or_gone_since_indexing_ends_the_stream_or_is_substituted() {
    let harness = Harness::start(Options::default()).await;
    put_objects(&harness.s3, "stale", class_folder_objects("imgs/")).await;
    let uri = "s3://stale/imgs/";
    let mut client = harness.client().await;
    // Opening the dataset lists it once; then one object is rewritten.
    collect(&mut client, unshuffled(uri)).await.unwrap();
    put_objects(
        &harness.s3,
        "stale",
        [("imgs/cat/004.jpg".into(), jpeg(30, 30, 99))],
    )
    .await;
    let status = collect(&mut client, unshuffled(uri)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("cat/004.jpg") && status.message().contains("rebuild the index"),
        "{status:?}"
    );
    // Deleted for real: GETs run in flight, so an injected fault would land
    // on whichever object's request arrived first, maybe one after 004.
    assert!(harness.s3.state.remove("stale", "imgs/cat/004.jpg"));
    let status = collect(&mut client, unshuffled("s3://stale/imgs/"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("is gone") && status.message().contains("rebuild the index"),
        "{status:?}"
    );

    // Back, so the listing below holds 40 objects again.
    put_objects(
        &harness.s3,
        "stale",
        [("imgs/cat/004.jpg".into(), jpeg(30, 30, 99))],
    )
    .await;

    let s3 = harness.restart_s3().await;
    let skip = Options {
        pipeline: PipelineConfig {
            read: small_parts(),
            on_bad_shard: BadShardPolicy::Skip,
            ..PipelineConfig::default()
        },
        ..Options::default()
    };
    let harness = Harness::with_s3(s3, skip).await;
    let mut client = harness.client().await;
    collect(&mut client, unshuffled(uri)).await.unwrap();
    put_objects(
        &harness.s3,
        "stale",
        [("imgs/cat/005.jpg".into(), jpeg(30, 30, 98))],
    )
    .await;
    assert!(harness.s3.state.remove("stale", "imgs/dog/007.jpg"));
    let batches = collect(&mut client, unshuffled(uri)).await.unwrap();
    assert_eq!(batches.len(), 5, "counts kept");
    let mut substituted: Vec<&str> = batches
        .iter()
        .flat_map(|b| b.substituted.iter().map(|&i| b.keys[i as usize].as_str()))
        .collect();
    substituted.sort_unstable();
    assert_eq!(substituted, ["cat/005.jpg", "dog/007.jpg"]);
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_epochs_read_loose_objects_from_the_disk_cache() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        cache: Some(cache_at(dir.path(), 1 << 30, EvictionPolicy::Planned)),
        ..Options::default()
    };
    let harness = Harness::start(options).await;
    put_objects(&harness.s3, "cached", class_folder_objects("imgs/")).await;
    let mut client = harness.client().await;
    let first = collect(&mut client, request("s3://cached/imgs/"))
        .await
        .unwrap();
    let gets_after_first = gets(&harness.s3);
    assert!(gets_after_first >= 40, "one GET per object at least");
    let second = pb::StreamBatchesRequest {
        epoch: 1,
        ..request("s3://cached/imgs/")
    };
    let second = collect(&mut client, second).await.unwrap();
    assert_eq!(
        gets(&harness.s3),
        gets_after_first,
        "no GET in the second epoch"
    );
    assert_ne!(keys(&first), keys(&second), "another epoch, another order");
    harness.shutdown().await;
}

/// `root/ant` (plain), `root/bee` a symlink to a hidden pool inside the
/// root, `root/cow` empty: three classes, the second reached by a link, the
/// third without images.
fn linked_class_folders(root: &std::path::Path) -> HashMap<String, i64> {
    let mut expected = HashMap::new();
    for (class, dir, label) in [("ant", "ant", 0), ("bee", ".pool/bee", 1)] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
        for n in 0..5u64 {
            let data = jpeg(40, 32, label as u64 * 10 + n);
            std::fs::write(root.join(dir).join(format!("{n}.jpg")), data).unwrap();
            expected.insert(format!("{class}/{n}.jpg"), label);
        }
    }
    std::os::unix::fs::symlink(root.join(".pool/bee"), root.join("bee")).unwrap();
    std::fs::create_dir_all(root.join("cow")).unwrap();
    // An image linked into a second class is a sample of each.
    std::os::unix::fs::symlink(root.join("ant/0.jpg"), root.join("bee/ant0.jpg")).unwrap();
    expected.insert("bee/ant0.jpg".into(), 1);
    expected
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_class_folders_follow_symlinks_and_an_empty_class_keeps_its_label() {
    let dir = tempfile::tempdir().unwrap();
    let expected = linked_class_folders(dir.path());
    let uri = format!("file://{}/", dir.path().display());
    let harness = Harness::start(Options::default()).await;
    let mut client = harness.client().await;
    let info = describe(&mut client, &uri, 1, 1).await;
    assert_eq!(info.samples, 11, "{info:?}");
    let batches = collect(
        &mut client,
        pb::StreamBatchesRequest {
            batch_size: Some(1),
            ..unshuffled(&uri)
        },
    )
    .await
    .unwrap();
    let served: HashMap<String, i64> = keyed_pixels(&batches)
        .into_iter()
        .map(|(key, (label, _))| (key, label))
        .collect();
    assert_eq!(served, expected);

    // A class folder linked from outside the dataset directory is refused,
    // naming the link, rather than silently dropped.
    let other = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(other.path().join("ant")).unwrap();
    std::fs::write(other.path().join("ant/0.jpg"), jpeg(40, 32, 1)).unwrap();
    std::fs::write(outside.path().join("1.jpg"), jpeg(40, 32, 2)).unwrap();
    std::os::unix::fs::symlink(outside.path(), other.path().join("dog")).unwrap();
    let uri = format!("file://{}/", other.path().display());
    let status = collect(&mut client, unshuffled(&uri)).await.unwrap_err();
    assert!(
        status.message().contains("outside the dataset directory")
            && status.message().contains("dog"),
        "{status:?}"
    );
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_beside_a_stray_shard_are_refused_naming_both() {
    let harness = Harness::start(Options::default()).await;
    let mut objects = class_folder_objects("mixed/");
    objects.push((
        "mixed/old/part-0.tar".into(),
        tar_of(&simple_dataset(1, 2)[0]),
    ));
    put_objects(&harness.s3, "data", objects).await;
    let mut client = harness.client().await;
    let status = collect(&mut client, unshuffled("s3://data/mixed/"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains("mixed/old/part-0.tar") && status.message().contains(".jpg"),
        "{}",
        status.message()
    );
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_keeps_one_index_per_dataset_and_lets_idle_ones_go() {
    use shardfeed::dataset::DatasetRegistry;
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    for dir in &dirs {
        std::fs::write(dir.path().join("a.tar"), tar_of(&simple_dataset(1, 3)[0])).unwrap();
    }
    let uri = |i: usize| format!("file://{}/", dirs[i].path().display());
    let registry = DatasetRegistry::new(Default::default(), fast_retries(), small_parts())
        .with_index_budget(1); // nothing idle is kept
    let first = registry.open(&uri(0)).await.unwrap();
    let spelled = format!("file://{}//./", dirs[0].path().display());
    let again = registry.open(&spelled).await.unwrap();
    assert!(
        Arc::ptr_eq(&first, &again),
        "one dataset, one index, however spelled"
    );

    // Dataset 0 is in use (held here): opening another keeps it.
    let _other = registry.open(&uri(1)).await.unwrap();
    assert!(Arc::ptr_eq(&first, &registry.open(&uri(0)).await.unwrap()));
    // Once idle, it is let go when another dataset is opened.
    let idle = Arc::downgrade(&first);
    drop((first, again));
    let _third = registry.open(&uri(2)).await.unwrap();
    assert!(
        idle.upgrade().is_none(),
        "an idle index past the budget is dropped"
    );
    assert_eq!(registry.open(&uri(0)).await.unwrap().index.samples(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_against_a_changed_listing_fails_naming_the_difference() {
    let harness = Harness::start(Options::default()).await;
    put_objects(&harness.s3, "data", class_folder_objects("grow/")).await;
    let uri = "s3://data/grow/";
    let request = pb::StreamBatchesRequest {
        batch_size: Some(8),
        ..request(uri)
    };
    let mut client = harness.client().await;
    let full = collect(&mut client, request.clone()).await.unwrap();
    let position = full[1].position.clone().unwrap();
    assert!(position.dataset.starts_with("samples=40 "), "{position:?}");
    let resumed = |position: pb::EpochPosition| pb::StreamBatchesRequest {
        resume_from: Some(position),
        ..request.clone()
    };

    // A restarted server lists the same objects: the same index, resumable.
    let s3 = harness.restart_s3().await;
    let harness = Harness::with_s3(s3, Options::default()).await;
    let mut client = harness.client().await;
    let rest = collect(&mut client, resumed(position.clone()))
        .await
        .unwrap();
    assert_eq!(keys(&rest), keys(&full[2..]));

    // An object added between starts regroups the listing: refused.
    put_objects(
        &harness.s3,
        "data",
        [("grow/cat/new.jpg".to_string(), jpeg(40, 32, 999))],
    )
    .await;
    let s3 = harness.restart_s3().await;
    let harness = Harness::with_s3(s3, Options::default()).await;
    let mut client = harness.client().await;
    let status = collect(&mut client, resumed(position)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains("samples=40") && status.message().contains("samples=41"),
        "{}",
        status.message()
    );
    harness.shutdown().await;
}
