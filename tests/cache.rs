//! The disk cache, checked by counting requests at the S3 server.

mod common;

use std::sync::atomic::Ordering;

use common::*;
use shardfeed::server::pb;
use shardfeed::store::cache::{CacheConfig, CacheError, DiskCache, EvictionPolicy};

const LARGE: u64 = 1 << 30;

/// A server on `s3` that reads through `cache`.
async fn cached_harness(
    s3: shardfeed::dev::s3mem::RunningS3,
    cache: std::sync::Arc<shardfeed::store::cache::DiskCache>,
) -> Harness {
    Harness::with_s3(
        s3,
        Options {
            cache: Some(cache),
            ..Options::default()
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_epoch_and_a_restart_make_no_gets() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = shardfeed::dev::s3mem::start(0).await.unwrap();
    let uri = upload(&s3, "data", "train/", &simple_dataset(3, 12)).await;
    write_index(&s3, "data", "train/").await;

    let cache = cache_at(dir.path(), LARGE, EvictionPolicy::Planned);
    let harness = cached_harness(s3, cache.clone()).await;
    let mut client = harness.client().await;
    let before = gets(&harness.s3);
    let epoch0 = collect(&mut client, request(&uri)).await.unwrap();
    assert!(gets(&harness.s3) > before);
    let after_first = gets(&harness.s3);
    let epoch1 = collect(
        &mut client,
        pb::StreamBatchesRequest {
            epoch: 1,
            ..request(&uri)
        },
    )
    .await
    .unwrap();
    assert_eq!(
        gets(&harness.s3),
        after_first,
        "epoch 2 of a dataset that fits makes no GETs"
    );
    assert_ne!(keys(&epoch0), keys(&epoch1));
    let digest0 = digest(&epoch0);
    drop(cache);
    let s3 = harness.restart_s3().await;

    // A restarted sidecar (new process state, same directory) finds its warm cache.
    let reopened = cache_at(dir.path(), LARGE, EvictionPolicy::Planned);
    assert!(reopened.used_bytes() > 0);
    let harness = cached_harness(s3, reopened).await;
    let mut client = harness.client().await;
    let before = gets(&harness.s3);
    let again = collect(&mut client, request(&uri)).await.unwrap();
    assert_eq!(gets(&harness.s3), before, "a warm cache survives a restart");
    assert_eq!(
        digest(&again),
        digest0,
        "cached bytes give identical batches"
    );
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_cache_file_is_detected_and_refetched() {
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_at(dir.path(), LARGE, EvictionPolicy::Planned);
    let harness = Harness::start(Options {
        cache: Some(cache.clone()),
        ..Options::default()
    })
    .await;
    let uri = upload(&harness.s3, "data", "", &simple_dataset(2, 16)).await;
    let mut client = harness.client().await;
    let clean = collect(&mut client, request(&uri)).await.unwrap();

    // Flip bytes in every cached data file.
    for item in std::fs::read_dir(dir.path()).unwrap() {
        let path = item.unwrap().path();
        if path.extension().is_some_and(|e| e == "data") {
            let mut bytes = std::fs::read(&path).unwrap();
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0xFF;
            bytes[0] ^= 0xFF;
            std::fs::write(&path, bytes).unwrap();
        }
    }
    let before = gets(&harness.s3);
    let again = collect(&mut client, request(&uri)).await.unwrap();
    assert_eq!(
        digest(&again),
        digest(&clean),
        "identical batches after refetching"
    );
    assert!(cache.stats.corrupt.load(Ordering::SeqCst) >= 2);
    assert!(
        gets(&harness.s3) > before,
        "corrupt blocks were fetched again"
    );
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_download_each_block_once() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = shardfeed::dev::s3mem::start(0).await.unwrap();
    let shards = simple_dataset(3, 20);
    let uri = upload(&s3, "data", "", &shards).await;
    write_index(&s3, "data", "").await;
    let cache = cache_at(dir.path(), LARGE, EvictionPolicy::Planned);
    let harness = cached_harness(s3, cache.clone()).await;
    let before = gets(&harness.s3);
    let (mut a, mut b) = (harness.client().await, harness.client().await);
    let (first, second) = tokio::join!(
        collect(&mut a, request(&uri)),
        collect(&mut b, request(&uri))
    );
    assert_eq!(digest(&first.unwrap()), digest(&second.unwrap()));
    // Each GET fetched a block no other request fetched: the number of GETs
    // equals the number of distinct blocks now cached, and is at most every
    // block of every shard (up to its last sample; the tar trailer is never
    // read) plus the index summary and one index file per shard.
    let fetched = gets(&harness.s3) - before;
    assert_eq!(fetched, cache.blocks_cached());
    assert_eq!(fetched, cache.stats.misses.load(Ordering::SeqCst));
    let block = 16 << 10;
    let all_blocks: u64 = shards
        .iter()
        .map(|s| (tar_of(s).len() as u64 - 1024).div_ceil(block))
        .sum();
    assert!(fetched <= all_blocks + 1 + shards.len() as u64);
    assert!(fetched >= all_blocks - 1, "nearly every block is read once");
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_object_is_refetched_not_served_stale() {
    let dir = tempfile::tempdir().unwrap();
    let s3 = shardfeed::dev::s3mem::start(0).await.unwrap();
    let mut shards = simple_dataset(2, 8);
    let uri = upload(&s3, "data", "", &shards).await;
    let cache = cache_at(dir.path(), LARGE, EvictionPolicy::Planned);
    let harness = cached_harness(s3, cache).await;
    let mut client = harness.client().await;
    let old = collect(&mut client, unshuffled(&uri)).await.unwrap();
    let s3 = harness.restart_s3().await;

    // Replace shard 0 in S3 (new content, hence a new ETag), then restart.
    for sample in &mut shards[0] {
        sample.image = Some(("jpg", jpeg(64, 64, 999)));
    }
    upload(&s3, "data", "", &shards[..1]).await;
    let reopened = cache_at(dir.path(), LARGE, EvictionPolicy::Planned);
    let harness = cached_harness(s3, reopened).await;
    let mut client = harness.client().await;
    let before = gets(&harness.s3);
    let new = collect(&mut client, unshuffled(&uri)).await.unwrap();
    assert!(
        gets(&harness.s3) > before,
        "the replaced shard was fetched again"
    );
    assert_ne!(
        old[0].images, new[0].images,
        "shard 0's new content is served"
    );
    assert_eq!(old[1].images, new[1].images, "shard 1 is unchanged");
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_and_truncated_data_files_are_refetched_without_spinning() {
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_at(dir.path(), LARGE, EvictionPolicy::Planned);
    let harness = Harness::start(Options {
        cache: Some(cache.clone()),
        ..Options::default()
    })
    .await;
    let uri = upload(&harness.s3, "data", "", &simple_dataset(3, 16)).await;
    let mut client = harness.client().await;
    let clean = collect(&mut client, request(&uri)).await.unwrap();

    // One data file deleted, the others cut short, as a crash or a second
    // process on the same directory would leave them.
    let mut data_files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|item| item.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "data"))
        .collect();
    data_files.sort();
    assert!(data_files.len() >= 2, "{data_files:?}");
    std::fs::remove_file(&data_files[0]).unwrap();
    for path in &data_files[1..] {
        let len = std::fs::metadata(path).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .unwrap()
            .set_len(len / 3)
            .unwrap();
    }
    let before = gets(&harness.s3);
    let cpu_before = process_cpu_seconds();
    let again = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        collect(&mut client, request(&uri)),
    )
    .await
    .expect("the stream finishes (no spin on unreadable blocks)")
    .unwrap();
    assert_eq!(digest(&again), digest(&clean), "identical batches");
    assert!(
        gets(&harness.s3) > before,
        "the lost blocks were fetched again"
    );
    assert!(cache.stats.corrupt.load(Ordering::SeqCst) >= 2);
    assert!(
        process_cpu_seconds() - cpu_before < 20.0,
        "CPU time stays bounded"
    );
    // The cache healed: a third epoch reads the disk again.
    let before = gets(&harness.s3);
    let third = collect(&mut client, request(&uri)).await.unwrap();
    assert_eq!(digest(&third), digest(&clean));
    assert_eq!(
        gets(&harness.s3),
        before,
        "healed blocks are served from disk"
    );
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_is_refused_and_short_files_are_healed_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_at(dir.path(), LARGE, EvictionPolicy::Planned);
    let second = shardfeed::store::cache::DiskCache::open(cache.config().clone()).unwrap_err();
    assert!(
        matches!(second, shardfeed::store::cache::CacheError::Locked { .. }),
        "{second}"
    );
    assert!(second.to_string().contains("--cache-dir"), "{second}");

    let s3 = shardfeed::dev::s3mem::start(0).await.unwrap();
    let uri = upload(&s3, "data", "", &simple_dataset(3, 16)).await;
    write_index(&s3, "data", "").await;
    let harness = cached_harness(s3, cache.clone()).await;
    let mut client = harness.client().await;
    let clean = collect(&mut client, request(&uri)).await.unwrap();
    let full = cache.used_bytes();
    drop(cache);
    let s3 = harness.restart_s3().await;

    // Cut every data file to a third, as a crash mid-write would.
    for item in std::fs::read_dir(dir.path()).unwrap() {
        let path = item.unwrap().path();
        if path.extension().is_some_and(|e| e == "data") {
            let len = std::fs::metadata(&path).unwrap().len();
            let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            file.set_len(len / 3).unwrap();
        }
    }
    let reopened = cache_at(dir.path(), LARGE, EvictionPolicy::Planned);
    assert!(
        reopened.used_bytes() < full,
        "blocks past the end of a data file are forgotten at start-up"
    );
    let harness = cached_harness(s3, reopened.clone()).await;
    let mut client = harness.client().await;
    let again = collect(&mut client, request(&uri)).await.unwrap();
    assert_eq!(digest(&again), digest(&clean));
    assert_eq!(
        reopened.stats.corrupt.load(Ordering::SeqCst),
        0,
        "nothing left to discover on read"
    );
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_counted_and_served_from_s3() {
    let dir = tempfile::tempdir().unwrap();
    let cache = cache_at(dir.path(), LARGE, EvictionPolicy::Planned);
    let harness = cached_harness(
        shardfeed::dev::s3mem::start(0).await.unwrap(),
        cache.clone(),
    )
    .await;
    let uri = upload(&harness.s3, "data", "", &simple_dataset(2, 16)).await;
    write_index(&harness.s3, "data", "").await;
    let mut client = harness.client().await;
    let clean = collect(&mut client, request(&uri)).await.unwrap();
    // Every data file now writes to /dev/full (ENOSPC) and reads zeros.
    for item in std::fs::read_dir(dir.path()).unwrap() {
        let path = item.unwrap().path();
        if path.extension().is_some_and(|e| e == "data") {
            std::fs::remove_file(&path).unwrap();
            std::os::unix::fs::symlink("/dev/full", &path).unwrap();
        }
    }
    let again = collect(&mut client, request(&uri)).await.unwrap();
    assert_eq!(digest(&again), digest(&clean), "served from S3 instead");
    assert!(cache.stats.write_failures.load(Ordering::SeqCst) >= 1);
    harness.shutdown().await;
}

fn process_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    // utime and stime, fields 14 and 15 of the whole line (11 and 12 here).
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

#[test]
fn opening_the_cache_touches_only_its_own_files() {
    let dir = tempfile::tempdir().unwrap();
    let theirs = [
        "notes.json",
        "model.tmp",
        "weights.data",
        "0123456789abcdef0123456789abcdeX.json",
        "keep.json.tmp",
    ];
    for name in theirs {
        std::fs::write(dir.path().join(name), b"not the cache's").unwrap();
    }
    // The cache's own debris: a leftover of an interrupted metadata write,
    // and metadata whose data file is gone.
    let own_tmp = "0123456789abcdef0123456789abcdef.json.tmp";
    let own_orphan = "fedcba9876543210fedcba9876543210.json";
    let own_evicted = "00112233445566778899aabbccddeeff.evicted";
    std::fs::write(dir.path().join(own_evicted), b"evicted data").unwrap();
    std::fs::write(dir.path().join(own_tmp), b"{").unwrap();
    std::fs::write(dir.path().join(own_orphan), b"{}").unwrap();
    drop(cache_at(dir.path(), LARGE, EvictionPolicy::Planned));
    for name in theirs {
        assert!(dir.path().join(name).is_file(), "{name} was deleted");
    }
    assert!(!dir.path().join(own_tmp).exists());
    assert!(!dir.path().join(own_orphan).exists());
    assert!(!dir.path().join(own_evicted).exists());
}

/// Reads `key` whole through `store` (a cache in front of S3).
async fn read_whole(store: &dyn shardfeed::store::ObjectStore, key: &str) -> Result<usize, String> {
    let object = store.head(key).await.map_err(|e| e.to_string())?;
    shardfeed::store::read::read_range(store, key, 0..object.size, object.etag.as_deref())
        .await
        .map(|bytes| bytes.len())
        .map_err(|e| e.to_string())
}

/// Bytes `key` holds in `cache`, as the cache keys it.
async fn held(
    store: &dyn shardfeed::store::ObjectStore,
    cache: &shardfeed::store::cache::DiskCache,
    key: &str,
) -> u64 {
    let etag = store.head(key).await.unwrap().etag.unwrap();
    cache.cached_bytes(&store.location(key), &etag)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_takes_the_least_recently_used_across_restarts_and_keeps_nothing_uncached() {
    use futures::StreamExt;
    use shardfeed::store::{cache::CacheStore, s3::S3Store, ObjectStore};
    let dir = tempfile::tempdir().unwrap();
    let s3 = shardfeed::dev::s3mem::start(0).await.unwrap();
    // Six objects of one 16 KiB cache block each; the cache holds four.
    let objects: Vec<_> = (0..6)
        .map(|i| (format!("o{i}"), vec![i as u8; 16 << 10]))
        .collect();
    put_objects(&s3, "lru", objects).await;
    let client = shardfeed::store::s3::client(&s3.s3_config()).await;
    let open = |dir: &std::path::Path, max_bytes| {
        let cache = cache_at(dir, max_bytes, EvictionPolicy::Lru);
        let origin = std::sync::Arc::new(S3Store::new(client.clone(), "lru"));
        (cache.clone(), CacheStore::new(origin, cache))
    };
    let (cache, store) = open(dir.path(), 4 * (16 << 10));
    for key in ["o0", "o1", "o2", "o3", "o0"] {
        read_whole(&store, key).await.unwrap();
    }
    assert_eq!(cache.entries(), 4);
    read_whole(&store, "o4").await.unwrap();
    assert_eq!(
        held(&store, &cache, "o1").await,
        0,
        "o1 was used least recently"
    );
    for key in ["o0", "o2", "o3", "o4"] {
        assert_eq!(held(&store, &cache, key).await, 16 << 10, "{key} kept");
    }
    // Evicted data is unlinked, not left renamed aside.
    let files = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(
        files,
        1 + 2 * 4,
        "the lock, and metadata + data of four entries"
    );

    // A GET that fails (the object is gone) leaves no entry behind.
    let gone = shardfeed::store::ObjectMeta {
        key: "gone".into(),
        size: 16 << 10,
        etag: Some("\"0\"".into()),
    };
    let mut body = store.get_object(&gone).await.unwrap();
    assert!(body.next().await.unwrap().is_err());
    drop(body);
    assert_eq!(cache.entries(), 4);

    // After a restart the order is that of the data's last writes: make o3
    // the oldest; the next object in evicts it.
    drop((cache, store));
    let o3 = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|item| item.unwrap().path())
        .find(|path| {
            path.extension().is_some_and(|e| e == "data") && std::fs::read(path).unwrap()[0] == 3
        })
        .unwrap();
    std::fs::File::options()
        .write(true)
        .open(&o3)
        .unwrap()
        .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1))
        .unwrap();
    let (cache, store) = open(dir.path(), 4 * (16 << 10));
    read_whole(&store, "o5").await.unwrap();
    assert_eq!(held(&store, &cache, "o3").await, 0, "o3 was written first");
    assert_eq!(held(&store, &cache, "o5").await, 16 << 10);
    drop((cache, store));

    // A cache with no room for anything serves every object and holds none.
    let empty = tempfile::tempdir().unwrap();
    let (cache, store) = open(empty.path(), 1);
    for key in ["o0", "o1", "o2"] {
        assert_eq!(read_whole(&store, key).await.unwrap(), 16 << 10);
    }
    assert_eq!(
        cache.entries(),
        0,
        "no entry for objects that were not cached"
    );
}

fn slotted(dir: &std::path::Path, lock_wait: std::time::Duration) -> CacheConfig {
    CacheConfig {
        max_bytes: LARGE,
        min_free_percent: 0.0,
        block_size: 16 << 10,
        slots: 2,
        lock_wait,
        ..CacheConfig::new(dir.to_path_buf())
    }
}

async fn served(data: &[Vec<Sample>], cache: std::sync::Arc<DiskCache>) -> (Harness, String) {
    let s3 = shardfeed::dev::s3mem::start(0).await.unwrap();
    let uri = upload(&s3, "data", "", data).await;
    write_index(&s3, "data", "").await;
    (cached_harness(s3, cache).await, uri)
}

/// A node-scoped cache (hostPath): jobs side by side take their own slots, a
/// replacement pod waits for the old one's, and nothing written is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_sharing_a_cache_directory_take_their_own_slots_and_corrupt_nothing() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let first = DiskCache::open(slotted(dir.path(), Duration::ZERO)).unwrap();
    let second = DiskCache::open(slotted(dir.path(), Duration::ZERO)).unwrap();
    assert_eq!(first.config().dir, dir.path().join("slot-0"));
    assert_eq!(second.config().dir, dir.path().join("slot-1"));
    let third = DiskCache::open_waiting(slotted(dir.path(), Duration::from_millis(1500)))
        .await
        .unwrap_err();
    assert!(
        matches!(third, CacheError::SlotsHeld { slots: 2, .. }),
        "{third}"
    );
    assert!(third.to_string().contains("--cache-slots"), "{third}");

    // Two servers read the same dataset at once, each through its own slot.
    let data = simple_dataset(3, 16);
    let (a, uri_a) = served(&data, first.clone()).await;
    let (b, uri_b) = served(&data, second.clone()).await;
    let (mut client_a, mut client_b) = (a.client().await, b.client().await);
    let (from_a, from_b) = tokio::join!(
        collect(&mut client_a, request(&uri_a)),
        collect(&mut client_b, request(&uri_b))
    );
    let (from_a, from_b) = (from_a.unwrap(), from_b.unwrap());
    assert_eq!(digest(&from_a), digest(&from_b));
    let written = first.used_bytes();
    assert!(written > 0 && second.used_bytes() > 0);

    // The replacement of the first server waits for its slot, then adopts
    // every entry it wrote and serves the next epoch from disk.
    let waiting = tokio::spawn(DiskCache::open_waiting(slotted(
        dir.path(),
        Duration::from_secs(30),
    )));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!waiting.is_finished(), "both slots are held: it must wait");
    drop(first);
    drop(client_a);
    let s3 = a.restart_s3().await;
    let replacement = waiting.await.unwrap().unwrap();
    assert_eq!(replacement.config().dir, dir.path().join("slot-0"));
    assert_eq!(replacement.used_bytes(), written);
    let c = cached_harness(s3, replacement).await;
    let mut client_c = c.client().await;
    let before = gets(&c.s3);
    let again = collect(&mut client_c, request(&uri_a)).await.unwrap();
    assert_eq!(gets(&c.s3), before, "the adopted slot serves from disk");
    assert_eq!(digest(&again), digest(&from_a));
    drop(second);
    b.shutdown().await;
    c.shutdown().await;
}

/// The same through the real binary: `prepare-cache-dir`, then two servers
/// with --cache-slots 2 serve, and a third gives up after its wait with an
/// error naming the flags.
#[test]
fn the_binary_takes_a_free_slot_and_exits_naming_the_flags_when_none_is() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let bin = env!("CARGO_BIN_EXE_shardfeed");
    let root = tempfile::tempdir().unwrap();
    let cache_dir = root.path().join("node-cache");
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let prepared = Command::new(bin)
        .args(["prepare-cache-dir", "--owner", &format!("{uid}:{gid}")])
        .arg(&cache_dir)
        .output()
        .unwrap();
    assert!(prepared.status.success(), "{prepared:?}");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&cache_dir).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o750);

    let serve = |name: &str, lock_wait: &str| {
        let socket = format!("unix:{}/{name}.sock", root.path().display());
        let child = Command::new(bin)
            .args([
                "serve",
                "--listen",
                &socket,
                "--metrics-listen",
                "127.0.0.1:0",
            ])
            .args(["--cache-slots", "2", "--cache-lock-wait", lock_wait])
            .arg("--cache-dir")
            .arg(&cache_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        (child, socket)
    };
    let serving = |socket: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let health = Command::new(bin)
                .args(["health", "--listen", socket])
                .output()
                .unwrap();
            if health.status.success() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    };
    let (mut first, first_socket) = serve("first", "0");
    assert!(serving(&first_socket));
    let (mut second, second_socket) = serve("second", "0");
    assert!(serving(&second_socket));
    let started = Instant::now();
    let (third, _) = serve("third", "1");
    let output = third.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(
        stderr.contains("--cache-slots") && stderr.contains("--cache-lock-wait"),
        "{stderr}"
    );
    for slot in ["slot-0", "slot-1"] {
        assert!(cache_dir.join(slot).join(".lock").exists());
    }
    for child in [&mut first, &mut second] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
