//! Cache warming: fills the host's disk cache with a dataset ahead of
//! training, shard by shard, and stops at the size limit rather than evict
//! what it just cached; `warm_decoded` fills the decoded-source tier by
//! streaming the dataset once through it.

use futures::StreamExt;

use crate::dataset::{DatasetError, DatasetRegistry};
use crate::store::read::{read_object, read_parts, ReadConfig};
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    #[error("warming needs a disk cache (--cache-dir)")]
    NoCache,
    #[error("warming the decoded tier needs one (--decoded-cache-dir)")]
    NoTier,
    #[error("{0}")]
    Dataset(#[from] DatasetError),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Stream(#[from] super::EngineError),
    #[error("{0}")]
    Pipeline(#[from] crate::pipeline::PipelineError),
}

/// How a `warm_decoded` run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodedWarmReport {
    /// Samples streamed (the last batch's repeats included).
    pub samples: u64,
    /// Samples that could not be decoded (nothing kept for them).
    pub substituted: usize,
}

/// Streams every sample of `uri` once, in stored order, through `engine`'s
/// decoded-source tier, so that each sample's source is kept at
/// `shorter_side` (and, with `eval_size`, its evaluation output: a center
/// crop keeps both, a random crop only sources). `progress(samples)` is
/// called after each batch.
pub async fn warm_decoded(
    engine: &super::Engine,
    uri: &str,
    shorter_side: u32,
    eval_size: Option<u32>,
    mut progress: impl FnMut(u64),
) -> Result<DecodedWarmReport, WarmError> {
    use crate::decode::source::{SourceForm, SourceKind};
    use crate::decode::{Crop, HorizontalFlip, Ops, OutputSpec, RandomResizedCrop};
    use crate::plan::{EpochPosition, Partition, PlanRequest, ShuffleConfig};
    if engine.decoded_cache_slot().get().is_none() {
        return Err(WarmError::NoTier);
    }
    let output = match eval_size {
        Some(size) => OutputSpec {
            crop: Crop::Center {
                resize: Some((f64::from(size) * 256.0 / 224.0).round() as u32),
            },
            ..OutputSpec::center(size, size)
        },
        None => OutputSpec {
            crop: Crop::RandomResized(RandomResizedCrop::default()),
            ops: Ops::default().with(HorizontalFlip(0.5)),
            ..OutputSpec::center(16, 16)
        },
    };
    let plan = PlanRequest {
        seed: 0,
        epoch: 0,
        rank: 0,
        world_size: 1,
        batch_size: 64,
        shuffle: ShuffleConfig {
            enabled: false,
            ..ShuffleConfig::default()
        },
        // Every sample, the last batch padded with repeats (hits).
        partition: Partition::Pad,
        repeats: 1,
        start_batch: 0,
        resume_from: EpochPosition::default(),
    };
    let mut request = super::StreamRequest::one(uri, plan, output);
    request.output.decoded_source = Some(SourceForm {
        shorter_side,
        kind: SourceKind::Raw,
    });
    // Filling ahead is the point: this pass stores every source it derives.
    request.output.decoded_from_epoch = 0;
    let mut batches = engine.open_stream(request).await?.batches;
    let mut report = DecodedWarmReport {
        samples: 0,
        substituted: 0,
    };
    while let Some(batch) = batches.recv().await {
        let batch = batch?;
        report.samples += batch.size as u64;
        report.substituted += batch.substituted.len();
        progress(report.samples);
    }
    Ok(report)
}

/// How a warm run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmReport {
    /// Shards now wholly cached.
    pub cached_shards: usize,
    pub total_shards: usize,
    pub total_bytes: u64,
    /// Bytes the cache holds now (all datasets).
    pub cache_used_bytes: u64,
}

impl WarmReport {
    /// False when the cache filled up before the last shard.
    pub fn complete(&self) -> bool {
        self.cached_shards == self.total_shards
    }
}

/// Reads every shard of `uri` through the registry's cache until all are
/// cached or the next would need an eviction. `progress(done, total)` is
/// called with bytes after each part.
pub async fn warm(
    registry: &DatasetRegistry,
    uri: &str,
    read: &ReadConfig,
    mut progress: impl FnMut(u64, u64),
) -> Result<WarmReport, WarmError> {
    let cache = registry.cache().ok_or(WarmError::NoCache)?.clone();
    let dataset = registry.open(uri).await?;
    let total_bytes = dataset.index.bytes();
    let mut report = WarmReport {
        cached_shards: 0,
        total_shards: dataset.index.shards.len(),
        total_bytes,
        cache_used_bytes: 0,
    };
    let mut done = 0u64;
    for (shard, entry) in dataset.index.shards.iter().enumerate() {
        if dataset.is_loose() {
            // A group of loose objects, each cached on its own.
            let index = dataset.shard_index(shard as u32).await?;
            if !cache.fits_without_eviction(entry.size) {
                break;
            }
            let objects = (0..index.keys.len()).map(|i| dataset.object(&index, i));
            let mut reads = futures::stream::iter(objects)
                .map(|object| {
                    let store = dataset.store.clone();
                    async move { read_object(store.as_ref(), &object).await }
                })
                .buffered(read.object_requests_in_flight.max(1));
            while let Some(bytes) = reads.next().await {
                done += bytes?.len() as u64;
                progress(done, total_bytes);
            }
            report.cached_shards += 1;
            continue;
        }
        let key = dataset.shard_key(shard as u32);
        let location = dataset.store.location(&key);
        // A row group is part of its file: the file's cached bytes do not
        // say whether its own are.
        let cached = match &entry.etag {
            Some(etag) if entry.cached_whole() => cache.cached_bytes(&location, etag),
            _ => 0,
        };
        if cached >= entry.size {
            // Already cached (an earlier warm, or the index scan just now).
            done += entry.size;
            report.cached_shards += 1;
            continue;
        }
        if !cache.fits_without_eviction(entry.size - cached) {
            break;
        }
        let mut parts = std::pin::pin!(read_parts(
            dataset.store.clone(),
            key,
            entry.byte_range(),
            entry.etag.clone(),
            read,
        ));
        while let Some(part) = parts.next().await {
            done += part?.1.len() as u64;
            progress(done, total_bytes);
        }
        report.cached_shards += 1;
    }
    report.cache_used_bytes = cache.used_bytes();
    Ok(report)
}
