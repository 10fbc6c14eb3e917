//! What a writer of an allowed dataset folder can try: a folder that
//! appears as a link out of `--allow` just after the check (D1), files that
//! claim a terabyte (D2). The server refuses each with a status that says
//! why and keeps serving.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use shardfeed::server::pb;

fn describe_request(dataset: &str) -> pb::DescribeRequest {
    pb::DescribeRequest {
        dataset: dataset.to_string(),
        world_size: 1,
        batch_size: Some(4),
        partition: pb::Partition::DropLast as i32,
        repeats: 0,
    }
}

/// A dataset folder of one shard and a class list naming `class`.
fn write_dataset(folder: &std::path::Path, class: &str) {
    std::fs::create_dir_all(folder).unwrap();
    std::fs::write(
        folder.join("shard-000.tar"),
        tar_of(&simple_dataset(1, 8)[0]),
    )
    .unwrap();
    std::fs::write(folder.join("classes.txt"), format!("{class}\n")).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_that_appears_as_a_link_out_of_allow_is_never_served() {
    let outside = tempfile::tempdir().unwrap();
    write_dataset(outside.path(), "SECRET");
    let root = tempfile::tempdir().unwrap();
    let allowed = root.path().join("allowed");
    std::fs::create_dir_all(&allowed).unwrap();
    let late = allowed.join("late");
    let harness = Harness::start(Options {
        allow: vec![format!("file://{}/", allowed.display())],
        ..Options::default()
    })
    .await;
    let mut client = harness.client().await;
    let uri = format!("file://{}/", late.display());

    // Absent when asked for: refused, not compared by its path.
    let absent = client.describe(describe_request(&uri)).await.unwrap_err();
    assert_eq!(absent.code(), tonic::Code::NotFound, "{absent:?}");
    assert!(absent.message().contains("--allow"), "{absent:?}");

    // The link appears and disappears while requests come: every answer is
    // a refusal, none the outside folder's classes or batches.
    let stop = Arc::new(AtomicBool::new(false));
    let flipper = {
        let (stop, late, target) = (stop.clone(), late.clone(), outside.path().to_path_buf());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = std::os::unix::fs::symlink(&target, &late);
                std::thread::yield_now();
                let _ = std::fs::remove_file(&late);
                std::thread::yield_now();
            }
        })
    };
    let mut refusals = std::collections::HashMap::new();
    for attempt in 0..300 {
        let answer = if attempt % 3 == 0 {
            collect(&mut client, unshuffled(&uri)).await.map(|_| ())
        } else {
            client
                .describe(describe_request(&uri))
                .await
                .map(|info| panic!("served the outside folder: {:?}", info.into_inner().classes))
        };
        let refused = answer.expect_err("a link out of --allow was served");
        *refusals.entry(refused.code()).or_insert(0) += 1;
    }
    stop.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
    for code in refusals.keys() {
        assert!(
            matches!(code, tonic::Code::NotFound | tonic::Code::PermissionDenied),
            "{refusals:?}"
        );
    }

    // An honest dataset under the rule is still served.
    write_dataset(&allowed.join("honest"), "cat");
    let honest = format!("file://{}/", allowed.join("honest").display());
    let info = describe(&mut client, &honest, 1, 4).await;
    assert_eq!((info.samples, info.classes), (8, vec!["cat".to_string()]));
    harness.shutdown().await;
}

/// A sparse file that claims `size` bytes and holds none.
fn sparse(path: &std::path::Path, size: u64) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::File::create(path).unwrap().set_len(size).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_that_claim_a_terabyte_are_refused_on_their_size() {
    let root = tempfile::tempdir().unwrap();
    let harness = Harness::start(Options {
        allow: vec![format!("file://{}/", root.path().display())],
        ..Options::default()
    })
    .await;
    let mut client = harness.client().await;
    let terabyte = 1u64 << 40;

    // A summary index, a class list and a per-shard index, each sparse.
    let summary = root.path().join("summary");
    write_dataset(&summary, "cat");
    sparse(&summary.join("_shardfeed/index.json"), terabyte);
    let classes = root.path().join("classes");
    write_dataset(&classes, "cat");
    sparse(&classes.join("classes.txt"), terabyte);
    let shard_index = root.path().join("shard_index");
    write_dataset(&shard_index, "cat");
    let shard_bytes = std::fs::metadata(shard_index.join("shard-000.tar"))
        .unwrap()
        .len();
    let listed = serde_json::json!({
        "version": 1,
        "shards": [{"name": "shard-000.tar", "size": shard_bytes, "etag": null, "samples": 8}],
    });
    std::fs::create_dir_all(shard_index.join("_shardfeed")).unwrap();
    std::fs::write(
        shard_index.join("_shardfeed/index.json"),
        listed.to_string(),
    )
    .unwrap();
    sparse(
        &shard_index.join("_shardfeed/shards/shard-000.tar.json"),
        terabyte,
    );
    let uri = |folder: &std::path::Path| format!("file://{}/", folder.display());

    for (folder, what) in [
        (&summary, "index.json"),
        (&classes, "classes.txt"),
        (&shard_index, ".json"),
    ] {
        let refused = if folder == &shard_index {
            collect(&mut client, unshuffled(&uri(folder)))
                .await
                .unwrap_err()
        } else {
            client
                .describe(describe_request(&uri(folder)))
                .await
                .unwrap_err()
        };
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{refused:?}"
        );
        assert!(
            refused.message().contains(what) && refused.message().contains("1099511627776"),
            "{refused:?}"
        );
    }
    // The process lives on and serves.
    let honest = root.path().join("honest");
    write_dataset(&honest, "dog");
    assert_eq!(describe(&mut client, &uri(&honest), 1, 4).await.samples, 8);
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_byte_or_a_file_as_a_folder_is_named_for_what_it_is() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("file.txt"), b"not a folder").unwrap();
    for allow in [vec![], vec![format!("file://{}/", root.path().display())]] {
        let harness = Harness::start(Options {
            allow: allow.clone(),
            ..Options::default()
        })
        .await;
        let mut client = harness.client().await;
        let nul = format!("file://{}/a\0b/", root.path().display());
        let refused = client.describe(describe_request(&nul)).await.unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::InvalidArgument,
            "{allow:?} {refused:?}"
        );
        assert!(refused.message().contains("NUL"), "{refused:?}");
        let file = format!("file://{}/file.txt/", root.path().display());
        let refused = client.describe(describe_request(&file)).await.unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::NotFound,
            "{allow:?} {refused:?}"
        );
        harness.shutdown().await;
    }
}
