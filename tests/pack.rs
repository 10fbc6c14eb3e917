//! `shardfeed pack` end to end: an image folder packed into the loopback S3
//! server through aws-sdk-s3, then served back by shardfeed.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use common::*;
use shardfeed::dataset::{DatasetRegistry, DatasetUri};
use shardfeed::dev::s3mem::{self, RunningS3};
use shardfeed::pack::{pack, PackConfig, PackReport, PackSource};
use shardfeed::server::pb;

fn png(width: u32, height: u32) -> Vec<u8> {
    let pixels = image::RgbImage::from_fn(width, height, |x, y| image::Rgb([x as u8, y as u8, 90]));
    let mut out = std::io::Cursor::new(Vec::new());
    pixels.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

/// An ImageFolder tree: 3 classes, 10 images each (JPEG, one PNG), plus a
/// dangling symlink, a text file posing as a JPEG and a README. Returns the
/// expected label of every sample key.
fn image_folder(root: &Path) -> HashMap<String, i64> {
    let mut expected = HashMap::new();
    for (label, class) in ["cat", "dog", "emu"].iter().enumerate() {
        let dir = root.join(class);
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..10u64 {
            let (name, data) = if i == 9 {
                (format!("img.{i}.png"), png(40, 30))
            } else {
                (format!("img{i}.jpg"), jpeg(48, 40, label as u64 * 100 + i))
            };
            std::fs::write(dir.join(&name), data).unwrap();
            let key = if i == 9 {
                format!("{class}/img_{i}")
            } else {
                format!("{class}/img{i}")
            };
            expected.insert(key, label as i64);
        }
    }
    std::os::unix::fs::symlink(root.join("nowhere.jpg"), root.join("dog/broken.jpg")).unwrap();
    std::fs::write(root.join("emu/notes.jpg"), b"not an image at all").unwrap();
    std::fs::write(root.join("cat/README.txt"), b"readme").unwrap();
    expected
}

async fn pack_into(
    s3: &RunningS3,
    source: &Path,
    manifest: Option<&Path>,
    uri: &str,
) -> PackReport {
    let registry = DatasetRegistry::new(s3.s3_config(), fast_retries(), small_parts());
    let (store, prefix) = registry.store_for(&DatasetUri::parse(uri).unwrap()).await;
    let config = PackConfig {
        source: PackSource::Folder(source.to_path_buf()),
        manifest: manifest.map(Path::to_path_buf),
        shard_bytes: 12_000,
        seed: 5,
        object_requests_in_flight: 4,
    };
    pack(&config, store, &prefix, |_| {}).await.unwrap()
}

/// Every sample of the dataset, once, with its label (batch size 1, unshuffled).
async fn served_labels(harness: &Harness, uri: &str) -> HashMap<String, i64> {
    let mut client = harness.client().await;
    let batches = collect(
        &mut client,
        pb::StreamBatchesRequest {
            batch_size: Some(1),
            ..unshuffled(uri)
        },
    )
    .await
    .unwrap();
    let mut labels = HashMap::new();
    for batch in &batches {
        assert!(batch.substituted.is_empty(), "every packed image decodes");
        for (key, label) in batch.keys.iter().zip(&batch.labels) {
            assert!(
                labels.insert(key.clone(), *label).is_none(),
                "{key} served twice"
            );
        }
    }
    labels
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_folder_round_trips_with_its_labels() {
    let source = tempfile::tempdir().unwrap();
    let expected = image_folder(source.path());
    let s3 = s3mem::start(0).await.unwrap();
    create_bucket(&s3, "packed").await;

    let report = pack_into(&s3, source.path(), None, "s3://packed/train/").await;
    assert_eq!(report.samples, 30);
    assert_eq!(report.classes, vec!["cat", "dog", "emu"]);
    let skipped: Vec<String> = report
        .skipped
        .iter()
        .map(|s| s.path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        skipped,
        vec!["README.txt", "broken.jpg", "notes.jpg"],
        "{:?}",
        report.skipped
    );
    assert!(report.shards >= 3, "{} shards", report.shards);
    let classes = s3.state.object("packed", "train/classes.txt").unwrap();
    assert_eq!(&classes[..], b"cat\ndog\nemu\n");
    // Shards stay near the target: none passes it, and each but the last
    // closed only because the next sample did not fit.
    let sizes = shard_sizes(&s3, "packed", "train/");
    assert_eq!(sizes.len(), report.shards);
    for (name, size) in &sizes {
        assert!(*size <= 12_000, "{name}: {size} bytes");
    }
    for (name, size) in &sizes[..sizes.len() - 1] {
        assert!(*size >= 6_000, "{name}: {size} bytes");
    }
    let harness = Harness::with_s3(s3, Options::default()).await;
    let served = served_labels(&harness, "s3://packed/train/").await;
    assert_eq!(
        served, expected,
        "every readable sample once, with its class"
    );
    harness.shutdown().await;
}

fn shard_sizes(s3: &RunningS3, bucket: &str, prefix: &str) -> Vec<(String, usize)> {
    let mut sizes = Vec::new();
    for i in 0.. {
        let name = format!("{prefix}shard-{i:06}.tar");
        match s3.state.object(bucket, &name) {
            Some(data) => sizes.push((name, data.len())),
            None => break,
        }
    }
    sizes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_seed_packs_the_same_bytes() {
    let source = tempfile::tempdir().unwrap();
    image_folder(source.path());
    let s3 = s3mem::start(0).await.unwrap();
    create_bucket(&s3, "packed").await;
    pack_into(&s3, source.path(), None, "s3://packed/a/").await;
    pack_into(&s3, source.path(), None, "s3://packed/b/").await;
    let (a, b) = (
        shard_sizes(&s3, "packed", "a/"),
        shard_sizes(&s3, "packed", "b/"),
    );
    assert_eq!(a.len(), b.len());
    for ((name_a, _), (name_b, _)) in a.iter().zip(&b) {
        assert_eq!(
            s3.state.object("packed", name_a),
            s3.state.object("packed", name_b),
            "{name_a} and {name_b} differ"
        );
    }
    // The first shard's classes are mixed: the pack order is shuffled.
    let first = s3.state.object("packed", &a[0].0).unwrap();
    let text = String::from_utf8_lossy(&first);
    let classes = ["cat/", "dog/", "emu/"]
        .iter()
        .filter(|c| text.contains(*c))
        .count();
    assert!(classes >= 2, "the first shard holds {classes} class(es)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flat_folder_with_a_csv_manifest_packs_to_a_local_directory() {
    let source = tempfile::tempdir().unwrap();
    let mut manifest = String::from("path,label\n");
    let mut expected = HashMap::new();
    for i in 0..12u64 {
        let name = format!("photo_{i:02}.jpg");
        std::fs::write(source.path().join(&name), jpeg(32, 32, i)).unwrap();
        let class = ["bird", "fish"][i as usize % 2];
        manifest.push_str(&format!("{name},{class}\n"));
        expected.insert(format!("photo_{i:02}"), (i % 2) as i64);
    }
    manifest.push_str("missing.jpg,bird\n");
    let manifest_path = source.path().join("labels.csv");
    std::fs::write(&manifest_path, manifest).unwrap();
    let dest = tempfile::tempdir().unwrap();
    let uri = format!("file://{}/", dest.path().display());

    let s3 = s3mem::start(0).await.unwrap();
    let report = pack_into(&s3, source.path(), Some(&manifest_path), &uri).await;
    assert_eq!(report.samples, 12);
    assert_eq!(report.classes, vec!["bird", "fish"]);
    assert_eq!(report.skipped.len(), 1, "{:?}", report.skipped);
    assert!(
        report.skipped[0].reason.contains("unreadable"),
        "{:?}",
        report.skipped
    );
    assert!(dest.path().join("_shardfeed/index.json").is_file());
    let harness = Harness::with_s3(s3, Options::default()).await;
    assert_eq!(served_labels(&harness, &uri).await, expected);
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_shards_go_up_in_parts() {
    // Five 16 MB "photos" (a JPEG signature, then noise) make one shard of
    // 80 MB, over the multipart threshold.
    let source = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(source.path().join("big")).unwrap();
    for i in 0..5u64 {
        let mut data = vec![0xFF, 0xD8, 0xFF, 0xE0];
        let mut rng = shardfeed::plan::rng::Rng::derive(&[i]);
        data.extend((0..16_000_000 / 8).flat_map(|_| rng.next_u64().to_le_bytes()));
        std::fs::write(source.path().join(format!("big/{i}.jpg")), data).unwrap();
    }
    let s3 = s3mem::start(0).await.unwrap();
    create_bucket(&s3, "packed").await;
    let registry = DatasetRegistry::new(s3.s3_config(), fast_retries(), small_parts());
    let (store, prefix) = registry
        .store_for(&DatasetUri::parse("s3://packed/big/").unwrap())
        .await;
    let report = pack(
        &PackConfig {
            source: PackSource::Folder(source.path().to_path_buf()),
            manifest: None,
            shard_bytes: 100_000_000,
            seed: 0,
            object_requests_in_flight: 4,
        },
        Arc::clone(&store),
        &prefix,
        |_| {},
    )
    .await
    .unwrap();
    assert_eq!((report.shards, report.samples), (1, 5));
    assert_eq!(
        s3.state
            .counts
            .multipart_uploads
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    assert_eq!(s3.state.open_uploads(), 0);
    let shard = s3.state.object("packed", "big/shard-000000.tar").unwrap();
    assert_eq!(shard.len() as u64, report.bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tfrecord_files_pack_into_tar_shards_with_their_labels() {
    use shardfeed::shard::tfrecord::{example_bytes, write_record};
    let source = tempfile::tempdir().unwrap();
    let mut expected = HashMap::new();
    for (file, count) in [("train-0", 6u64), ("train-1", 5)] {
        let mut records = Vec::new();
        let mut starts = Vec::new();
        for n in 0..count {
            starts.push(records.len());
            let label = (n * 10) as i64;
            write_record(
                &mut records,
                &example_bytes(&jpeg(40, 32, n), Some(label), &[]),
            );
            expected.insert(format!("{file}/{n:08}"), label);
        }
        if file == "train-1" {
            records[starts[2] + 30] ^= 0x20; // record 2's data: skipped, reported
            expected.remove(&format!("{file}/{:08}", 2));
        }
        std::fs::write(source.path().join(format!("{file}.tfrecord")), records).unwrap();
    }
    let s3 = s3mem::start(0).await.unwrap();
    create_bucket(&s3, "packed").await;
    let report = pack_into(&s3, source.path(), None, "s3://packed/tf/").await;
    assert_eq!(report.samples, 10);
    assert!(
        report.classes.is_empty(),
        "labels are the Examples' integers"
    );
    assert_eq!(report.skipped.len(), 1, "{:?}", report.skipped);
    assert!(
        report.skipped[0].reason.contains("record 2")
            && report.skipped[0].reason.contains("CRC32C"),
        "{:?}",
        report.skipped
    );
    let harness = Harness::with_s3(s3, Options::default()).await;
    assert_eq!(served_labels(&harness, "s3://packed/tf/").await, expected);
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loose_objects_in_s3_pack_into_tar_shards_with_their_folder_labels() {
    let source = tempfile::tempdir().unwrap();
    let expected = image_folder(source.path());
    let s3 = s3mem::start(0).await.unwrap();
    // The same tree as loose objects (the dangling symlink has no bytes).
    let mut objects = Vec::new();
    for class in ["cat", "dog", "emu"] {
        for entry in std::fs::read_dir(source.path().join(class)).unwrap() {
            let path = entry.unwrap().path();
            if let Ok(data) = std::fs::read(&path) {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                objects.push((format!("imgs/{class}/{name}"), data));
            }
        }
    }
    put_objects(&s3, "loose", objects).await;
    create_bucket(&s3, "packed").await;

    let registry = DatasetRegistry::new(s3.s3_config(), fast_retries(), small_parts());
    let objects = registry.open("s3://loose/imgs/").await.unwrap();
    let (store, prefix) = registry
        .store_for(&DatasetUri::parse("s3://packed/from-loose/").unwrap())
        .await;
    let config = PackConfig {
        source: PackSource::Objects(objects),
        manifest: None,
        shard_bytes: 12_000,
        seed: 5,
        object_requests_in_flight: 4,
    };
    let report = pack(&config, store, &prefix, |_| {}).await.unwrap();
    assert_eq!(report.samples, 30);
    assert_eq!(report.classes, vec!["cat", "dog", "emu"]);
    let skipped: Vec<_> = report.skipped.iter().map(|s| s.path.clone()).collect();
    assert_eq!(
        skipped,
        [Path::new("emu/notes.jpg")],
        "{:?}",
        report.skipped
    );
    assert!(report.shards >= 3, "{} shards", report.shards);

    let harness = Harness::with_s3(s3, Options::default()).await;
    assert_eq!(
        served_labels(&harness, "s3://packed/from-loose/").await,
        expected
    );

    // Shards are not loose objects: packing them again is refused.
    let shards = registry.open("s3://packed/from-loose/").await.unwrap();
    let again = PackConfig {
        source: PackSource::Objects(shards),
        ..config
    };
    let (store, prefix) = registry
        .store_for(&DatasetUri::parse("s3://packed/again/").unwrap())
        .await;
    let error = pack(&again, store, &prefix, |_| {}).await.unwrap_err();
    assert!(
        error.to_string().contains("already tar or TFRecord shards"),
        "{error}"
    );
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_of_twelve_integer_classes_keeps_every_label() {
    // A `file,label` header and 12 integer classes: labels 10 and 11 must
    // not be read as names sorted as text ("10" < "2").
    let source = tempfile::tempdir().unwrap();
    let mut manifest = String::from("file,label\n");
    let mut expected = HashMap::new();
    for i in 0..48u64 {
        let name = format!("img_{i:02}.jpg");
        std::fs::write(source.path().join(&name), jpeg(32, 32, i)).unwrap();
        manifest.push_str(&format!("{name},{}\n", i % 12));
        expected.insert(format!("img_{i:02}"), (i % 12) as i64);
    }
    let manifest_path = source.path().join("labels.csv");
    std::fs::write(&manifest_path, &manifest).unwrap();
    let s3 = s3mem::start(0).await.unwrap();
    create_bucket(&s3, "packed").await;
    let report = pack_into(&s3, source.path(), Some(&manifest_path), "s3://packed/int/").await;
    assert!(report.classes.is_empty(), "integer labels stay integers");
    assert!(s3.state.object("packed", "int/classes.txt").is_none());
    let harness = Harness::with_s3(s3, Options::default()).await;
    assert_eq!(served_labels(&harness, "s3://packed/int/").await, expected);
    harness.shutdown().await;

    // One class name among integers is an error naming its line.
    std::fs::write(&manifest_path, format!("{manifest}img_48.jpg,cat\n")).unwrap();
    let registry = DatasetRegistry::new(Default::default(), fast_retries(), small_parts());
    let dest = tempfile::tempdir().unwrap();
    let uri = format!("file://{}/", dest.path().display());
    let (store, prefix) = registry.store_for(&DatasetUri::parse(&uri).unwrap()).await;
    let config = PackConfig {
        source: PackSource::Folder(source.path().to_path_buf()),
        manifest: Some(manifest_path.clone()),
        shard_bytes: 12_000,
        seed: 5,
        object_requests_in_flight: 4,
    };
    let error = pack(&config, store, &prefix, |_| {}).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("line 50: label \"cat\" is a class name"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinked_class_folders_are_packed_and_an_empty_class_keeps_its_label() {
    let source = tempfile::tempdir().unwrap();
    let root = source.path();
    let mut expected = HashMap::new();
    for (class, dir, label) in [("ant", "ant", 0), ("bee", ".pool/bee", 1)] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
        for n in 0..10u64 {
            std::fs::write(root.join(dir).join(format!("{n}.jpg")), jpeg(40, 32, n)).unwrap();
            expected.insert(format!("{class}/{n}"), label);
        }
    }
    std::os::unix::fs::symlink(root.join(".pool/bee"), root.join("bee")).unwrap();
    std::fs::create_dir_all(root.join("cow")).unwrap();
    std::fs::write(root.join("cow/notes.jpg"), b"not an image").unwrap();
    let s3 = s3mem::start(0).await.unwrap();
    create_bucket(&s3, "packed").await;
    let report = pack_into(&s3, root, None, "s3://packed/linked/").await;
    assert_eq!(report.samples, 20);
    assert_eq!(report.classes, ["ant", "bee", "cow"]);
    assert!(
        report
            .skipped
            .iter()
            .any(|s| s.path.ends_with("cow") && s.reason.contains("keeps its label")),
        "{:?}",
        report.skipped
    );
    let harness = Harness::with_s3(s3, Options::default()).await;
    assert_eq!(
        served_labels(&harness, "s3://packed/linked/").await,
        expected
    );
    harness.shutdown().await;
}
