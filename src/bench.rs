//! Benchmarks that run the real path in-process and print JSON lines.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::dataset::{build_index, write_index, DatasetRegistry};
use crate::pipeline::PipelineConfig;
use crate::s3mem;
use crate::server::{self, pb, ListenAddr, Listener, ServiceConfig, ShardfeedService};
use crate::shard::tar::TarWriter;
use crate::store::cache::{CacheConfig, DiskCache, EvictionPolicy};
use crate::store::retry::ReadConfig;
use crate::store::s3::S3Store;
use crate::store::ObjectStore;

pub type BenchError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone)]
pub struct CacheBenchSpec {
    pub shards: usize,
    pub samples_per_shard: usize,
    /// Bytes of ignored payload per sample (sizes the shards).
    pub sample_bytes: usize,
    /// Cache size as a fraction of the dataset.
    pub cache_fraction: f64,
    pub epochs: u64,
}

impl Default for CacheBenchSpec {
    fn default() -> Self {
        Self {
            shards: 40,
            samples_per_shard: 32,
            sample_bytes: 16 << 10,
            cache_fraction: 0.5,
            epochs: 3,
        }
    }
}

/// Streams `epochs` epochs through a cache of `cache_fraction` of the dataset
/// with each eviction policy; prints the S3 bytes each epoch fetched.
pub async fn cache_policy(spec: &CacheBenchSpec) -> Result<(), BenchError> {
    let s3 = s3mem::start(0).await?;
    let client = crate::store::s3::client(&s3.s3_config()).await;
    client.create_bucket().bucket("bench").send().await?;
    let store: Arc<dyn ObjectStore> = Arc::new(S3Store::new(client, "bench"));
    let jpeg = {
        let pixels = crate::demo::synthetic_image(1, 1, 1, 32, 32);
        let mut out = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 80).encode_image(&pixels)?;
        out
    };
    let filler = vec![7u8; spec.sample_bytes];
    let mut dataset_bytes = 0u64;
    for shard in 0..spec.shards {
        let mut tar = TarWriter::new();
        for i in 0..spec.samples_per_shard {
            let key = format!("s{shard:04}-{i:04}");
            tar.append(&format!("{key}.jpg"), &jpeg);
            tar.append(&format!("{key}.bin"), &filler);
            tar.append(&format!("{key}.cls"), b"1");
        }
        let tar = tar.finish();
        dataset_bytes += tar.len() as u64;
        store
            .put(&format!("data/shard-{shard:05}.tar"), Bytes::from(tar))
            .await?;
    }
    let read = ReadConfig {
        part_size: 256 << 10,
        ..ReadConfig::default()
    };
    let (index, shard_indexes) = build_index(store.clone(), "data/", &read).await?;
    write_index(store.as_ref(), "data/", &index, &shard_indexes).await?;
    let cache_bytes = (dataset_bytes as f64 * spec.cache_fraction) as u64;

    // "none" first: the first epoch's time without a cache is the baseline
    // for the cost of filling the cache while streaming.
    for (name, policy) in [
        ("none", None),
        ("lru", Some(EvictionPolicy::Lru)),
        ("planned", Some(EvictionPolicy::Planned)),
    ] {
        let dir = tempdir()?;
        let mut registry = DatasetRegistry::new(s3.s3_config(), read.clone());
        if let Some(policy) = policy {
            registry = registry.with_cache(DiskCache::open(CacheConfig {
                dir: dir.clone(),
                max_bytes: cache_bytes,
                min_free_percent: 0.0,
                // As in production: one cache block per ranged GET.
                block_size: read.part_size,
                policy,
                metadata_ttl: None,
            })?);
        }
        let registry = Arc::new(registry);
        let service = ShardfeedService::new(
            registry,
            PipelineConfig {
                read: read.clone(),
                ..PipelineConfig::default()
            },
            ServiceConfig::default(),
        )?;
        let listener = Listener::bind(&ListenAddr::Tcp(([127, 0, 0, 1], 0).into())).await?;
        let addr = listener.local_addr();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server::serve(
            listener,
            service,
            async move {
                let _ = stopped.await;
            },
            Duration::from_secs(1),
        ));
        let mut client = pb::shardfeed_client::ShardfeedClient::new(server::connect(&addr).await?)
            .max_decoding_message_size(usize::MAX);
        let epochs = if policy.is_none() { 1 } else { spec.epochs };
        for epoch in 0..epochs {
            let before = s3.state.counts.get_bytes.load(Ordering::SeqCst);
            let started = std::time::Instant::now();
            let request = pb::StreamBatchesRequest {
                dataset: "s3://bench/data/".into(),
                epoch,
                world_size: 1,
                batch_size: Some(16),
                height: 32,
                width: 32,
                ..Default::default()
            };
            let mut stream = client.stream_batches(request).await?.into_inner();
            while stream.message().await?.is_some() {}
            let seconds = started.elapsed().as_secs_f64();
            let fetched = s3.state.counts.get_bytes.load(Ordering::SeqCst) - before;
            println!(
                "{{\"policy\":\"{name}\",\"epoch\":{},\"dataset_bytes\":{dataset_bytes},\"cache_bytes\":{cache_bytes},\"s3_bytes\":{fetched},\"s3_fraction_of_dataset\":{:.3},\"seconds\":{seconds:.3}}}",
                epoch + 1,
                fetched as f64 / dataset_bytes as f64
            );
        }
        let _ = stop.send(());
        serving.await??;
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

fn tempdir() -> std::io::Result<std::path::PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("shardfeed-bench-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
