//! The disk cache at the scale of a loose-image dataset: fills it with
//! `entries` small objects, then measures cached reads alone, cached reads
//! while other readers' misses evict an entry each, and reopening. Prints
//! one JSON line per phase.
//!
//! The origin is synthetic (bytes made on request), so the figures are the
//! cache's own: its lock, its bookkeeping and its files.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;

use super::bench::BenchError;
use crate::store::cache::{CacheConfig, CacheStore, DiskCache, EvictionPolicy};
use crate::store::{ListPage, ObjectMeta, ObjectStore, PartStream, StoreError};

#[derive(Debug, Clone)]
pub struct CacheScaleSpec {
    pub entries: usize,
    pub object_bytes: usize,
    /// Where the cache lives (a fresh directory under it is used).
    pub dir: std::path::PathBuf,
    pub readers: usize,
    pub seconds: f64,
}

/// Objects `o<n>` of `size` bytes, all at ETag "1", made on request.
#[derive(Debug)]
struct SyntheticOrigin {
    size: u64,
}

impl SyntheticOrigin {
    fn meta(&self, key: &str) -> ObjectMeta {
        ObjectMeta {
            key: key.to_string(),
            size: self.size,
            etag: Some("\"1\"".into()),
        }
    }
}

#[async_trait]
impl ObjectStore for SyntheticOrigin {
    async fn list_page(&self, _prefix: &str, _token: Option<&str>) -> Result<ListPage, StoreError> {
        Ok(ListPage::default())
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        Ok(self.meta(key))
    }

    async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        _if_match: Option<&str>,
    ) -> Result<PartStream, StoreError> {
        let fill = key.len() as u8;
        let bytes = Bytes::from(vec![fill; (range.end - range.start) as usize]);
        Ok(futures::stream::iter([Ok((range.start, bytes))]).boxed())
    }

    async fn put(&self, _key: &str, _data: Bytes) -> Result<(), StoreError> {
        Ok(())
    }

    fn location(&self, key: &str) -> String {
        format!("synthetic://{key}")
    }
}

async fn read(store: &CacheStore, origin: &SyntheticOrigin, n: usize) -> Result<(), BenchError> {
    let mut body = store.get_object(&origin.meta(&format!("o{n}"))).await?;
    while let Some(part) = body.next().await {
        part?;
    }
    Ok(())
}

/// A small, fast, deterministic generator for picking objects.
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

pub async fn run(spec: &CacheScaleSpec) -> Result<(), BenchError> {
    let dir = spec
        .dir
        .join(format!("shardfeed-cache-scale-{}", std::process::id()));
    let config = CacheConfig {
        max_bytes: (spec.entries * spec.object_bytes) as u64,
        min_free_percent: 0.0,
        policy: EvictionPolicy::Planned,
        ..CacheConfig::new(dir.clone())
    };
    let origin = Arc::new(SyntheticOrigin {
        size: spec.object_bytes as u64,
    });
    let cache = DiskCache::open(config.clone())?;
    let store = Arc::new(CacheStore::new(origin.clone(), cache.clone()));

    let started = Instant::now();
    futures::stream::iter(0..spec.entries)
        .map(|n| {
            let (store, origin) = (store.clone(), origin.clone());
            async move { read(&store, &origin, n).await }
        })
        .buffer_unordered(64)
        .fold(Ok(()), |done: Result<(), BenchError>, result| async move {
            done.and(result)
        })
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{{\"phase\":\"fill\",\"entries\":{},\"object_bytes\":{},\"seconds\":{seconds:.1},\"objects_per_second\":{:.0}}}",
        cache.entries(),
        spec.object_bytes,
        spec.entries as f64 / seconds
    );

    // The previous eviction's cost per victim: a scan of every entry.
    let scans = 20;
    let started = Instant::now();
    for _ in 0..scans {
        std::hint::black_box(cache.oldest_by_full_scan());
    }
    println!(
        "{{\"phase\":\"baseline_full_scan\",\"entries\":{},\"ms_per_victim\":{:.3}}}",
        cache.entries(),
        started.elapsed().as_secs_f64() * 1e3 / scans as f64
    );

    // Cached reads alone, then with evicting misses beside them.
    let alone = hits(&store, &origin, spec, None).await?;
    print_hits("hits", &alone, None);
    let evictions_before = cache.stats.evictions.load(Ordering::Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let missing = {
        let (store, origin, stop) = (store.clone(), origin.clone(), stop.clone());
        let first = spec.entries;
        tokio::spawn(async move {
            // Objects never read before: each miss evicts the oldest entry.
            let mut n = first;
            let mut latencies = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let at = Instant::now();
                read(&store, &origin, n).await?;
                latencies.push(at.elapsed());
                n += 1;
            }
            Ok::<_, BenchError>(latencies)
        })
    };
    let during = hits(&store, &origin, spec, Some(&stop)).await?;
    let misses = missing.await??;
    let evictions = cache.stats.evictions.load(Ordering::Relaxed) - evictions_before;
    print_hits("hits_while_evicting", &during, Some((evictions, &misses)));

    drop(store);
    drop(cache);
    let started = Instant::now();
    let reopened = DiskCache::open(config)?;
    println!(
        "{{\"phase\":\"reopen\",\"entries\":{},\"seconds\":{:.1}}}",
        reopened.entries(),
        started.elapsed().as_secs_f64()
    );
    drop(reopened);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// Per-read latencies of `spec.readers` readers of random cached objects
/// for `spec.seconds`; then raises `stop`, if given.
async fn hits(
    store: &Arc<CacheStore>,
    origin: &Arc<SyntheticOrigin>,
    spec: &CacheScaleSpec,
    stop: Option<&Arc<AtomicBool>>,
) -> Result<(Vec<Duration>, f64), BenchError> {
    let deadline = Instant::now() + Duration::from_secs_f64(spec.seconds);
    let readers = (0..spec.readers).map(|reader| {
        let (store, origin) = (store.clone(), origin.clone());
        // The newest half of the entries: not the ones the misses evict.
        let (low, span) = (spec.entries / 2, spec.entries / 2);
        tokio::spawn(async move {
            let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ reader as u64;
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let n = low + (next_random(&mut state) as usize % span.max(1));
                let at = Instant::now();
                read(&store, &origin, n).await?;
                latencies.push(at.elapsed());
            }
            Ok::<_, BenchError>(latencies)
        })
    });
    let started = Instant::now();
    let mut latencies = Vec::new();
    for reader in futures::future::join_all(readers).await {
        latencies.extend(reader??);
    }
    let seconds = started.elapsed().as_secs_f64();
    if let Some(stop) = stop {
        stop.store(true, Ordering::Relaxed);
    }
    Ok((latencies, seconds))
}

fn percentile(sorted: &[Duration], fraction: f64) -> f64 {
    let index = ((sorted.len() as f64 * fraction) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(index).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

fn print_hits(
    phase: &str,
    (latencies, seconds): &(Vec<Duration>, f64),
    misses: Option<(u64, &Vec<Duration>)>,
) {
    let mut sorted = latencies.clone();
    sorted.sort();
    let mut line = format!(
        "{{\"phase\":\"{phase}\",\"hits_per_second\":{:.0},\"hit_p50_ms\":{:.3},\"hit_p99_ms\":{:.3},\"hit_max_ms\":{:.3}",
        latencies.len() as f64 / seconds,
        percentile(&sorted, 0.5),
        percentile(&sorted, 0.99),
        percentile(&sorted, 1.0),
    );
    if let Some((evictions, misses)) = misses {
        let mut sorted = misses.clone();
        sorted.sort();
        line.push_str(&format!(
            ",\"evictions\":{evictions},\"evictions_per_second\":{:.0},\"miss_p50_ms\":{:.3},\"miss_p99_ms\":{:.3}",
            evictions as f64 / seconds,
            percentile(&sorted, 0.5),
            percentile(&sorted, 0.99),
        ));
    }
    println!("{line}}}");
}
