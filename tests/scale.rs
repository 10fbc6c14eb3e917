//! ImageNet scale with the default settings: a loose prefix of 1.3 million
//! objects indexes through the real S3 API path, page by page, although the
//! whole listing takes longer than one request may.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use shardfeed::dataset::{build_index, DatasetLocation};
use shardfeed::dev::s3mem;
use shardfeed::shard::BadShardPolicy;
use shardfeed::store::read::ReadConfig;
use shardfeed::store::retry::{RetryPolicy, RetryingStore};
use shardfeed::store::s3::S3Store;
use shardfeed::store::ObjectStore;

/// ImageNet-1k train: 1.28 M images in 1,000 class folders.
const KEYS: usize = 1_300_000;
const CLASSES: usize = 1000;

/// Peak resident memory of this process so far (Linux `VmHWM`), in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loose_prefix_of_imagenet_size_indexes_with_the_default_timeouts() {
    let s3 = s3mem::start(0).await.unwrap();
    s3.state.create_bucket("big");
    let empty = Bytes::new();
    for i in 0..KEYS {
        let key = format!("train/n{:05}/{i:07}.JPEG", i % CLASSES);
        s3.state.insert("big", &key, empty.clone());
    }
    // 1,300 pages of 1,000 keys at 25 ms each: over 30 s in all, the
    // default time bound of one request.
    s3.state.faults.set_list_delay(Duration::from_millis(25));
    let policy = RetryPolicy::default();
    let idle_timeout = policy.idle_timeout;
    let client = shardfeed::store::s3::client(&s3.s3_config()).await;
    let store: Arc<dyn ObjectStore> = Arc::new(RetryingStore::new(
        Arc::new(S3Store::new(client, "big")),
        policy,
    ));
    let rss_before = peak_rss();
    let started = Instant::now();
    let (index, groups) = build_index(
        store,
        &DatasetLocation::prefix("train/"),
        &ReadConfig::default(),
        BadShardPolicy::Fail,
    )
    .await
    .unwrap();
    let took = started.elapsed();
    assert_eq!(index.samples(), KEYS as u64);
    assert_eq!(index.classes.len(), CLASSES);
    assert_eq!(groups.len(), KEYS.div_ceil(1024));
    let pages = s3
        .state
        .counts
        .list
        .load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(pages, KEYS.div_ceil(1000) as u64);
    assert!(
        took > idle_timeout,
        "the listing took {took:?}; it must outlast one request's bound to test it"
    );
    println!(
        "indexed {KEYS} keys in {:.1} s ({pages} pages); peak RSS {:.0} MiB before the \
         build (the in-memory S3 holding the keys), {:.0} MiB after",
        took.as_secs_f64(),
        rss_before as f64 / f64::from(1 << 20),
        peak_rss() as f64 / f64::from(1 << 20)
    );
}
