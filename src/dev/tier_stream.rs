//! `shardfeed tier-stream-bench`: the decoded-source tier on the real
//! stream path (fetch, parse, decode pool, batches; no gRPC), in one run:
//! today's path for one epoch, then the tier cold (epoch 0, every source
//! derived and stored) and warm (epochs 1 and 2), every epoch defined from
//! the stored source (`stored_from_epoch` 0: the cost a first stored epoch
//! pays for what the background fill did not store), for the training and the
//! evaluation recipe, beside the entropy floor (full-size decode, one
//! thread) times the decode threads. Prints JSON lines and a summary.

use std::sync::Arc;
use std::time::Instant;

use super::bench::{bench_request, engine_over, measured_epoch, BenchError, EpochFigures};
use super::s3mem;
use super::synthetic::{self, SyntheticSpec};
use crate::decode::source::{stored_size, SourceForm, SourceKind};
use crate::decode::{self, Crop, CropBox, OutputSpec};
use crate::engine::Engine;
use crate::shard::ImageFormat;
use crate::tier::records::DecodedCache;

#[derive(Debug, Clone)]
pub struct TierStreamSpec {
    pub data: SyntheticSpec,
    pub batch_size: u32,
    pub decode_threads: usize,
    pub shorter_side: u32,
}

/// Full-size decodes per second on one thread: the entropy floor.
fn entropy_floor(jpegs: &[Vec<u8>]) -> f64 {
    let decoder = decode::default_decoder();
    let started = Instant::now();
    let mut done = 0usize;
    for jpeg in jpegs {
        let Ok((width, height)) = decode::source_dimensions(ImageFormat::Jpeg, jpeg) else {
            continue;
        };
        let spec = OutputSpec {
            crop: Crop::Stretch,
            ..OutputSpec::center(height, width)
        };
        let whole = CropBox::whole(width, height);
        let mut out = vec![0u8; spec.bytes()];
        if decoder
            .decode_into(ImageFormat::Jpeg, jpeg, &spec, &whole, &mut out)
            .is_ok()
        {
            done += 1;
        }
    }
    done as f64 / started.elapsed().as_secs_f64()
}

async fn epoch(
    engine: &Engine,
    uri: &str,
    spec: &TierStreamSpec,
    output: OutputSpec,
    epoch: u64,
    tier: Option<SourceForm>,
) -> Result<EpochFigures, BenchError> {
    let mut request = bench_request(uri, spec.batch_size, output, 1, epoch);
    request.output.decoded_source = tier;
    request.output.decoded_from_epoch = 0;
    measured_epoch(engine, request).await
}

pub async fn run(spec: &TierStreamSpec) -> Result<(), BenchError> {
    let s3 = s3mem::start(0).await?;
    eprintln!(
        "synthesizing {} photo-like JPEGs ...",
        spec.data.shards * spec.data.samples_per_shard
    );
    let uri = synthetic::publish(&s3, &spec.data).await?;
    // The demo's photos: the CLI varies only how many the dataset holds.
    let floor_sample = tokio::task::spawn_blocking(|| super::tier::photos(128)).await?;
    let floor = tokio::task::spawn_blocking(move || entropy_floor(&floor_sample)).await?;
    let form = SourceForm {
        shorter_side: spec.shorter_side,
        kind: SourceKind::Raw,
    };
    let (w, h) = stored_size(spec.data.width, spec.data.height, &form);
    let dir = tempfile_dir()?;
    for (name, output) in super::tier::recipes() {
        let _ = std::fs::remove_dir_all(&dir);
        let tier = Arc::new(DecodedCache::open(&dir, u64::MAX)?);
        let engine = engine_over(&s3, spec.decode_threads)?.with_decoded_cache(tier.clone());
        let today = epoch(&engine, &uri, spec, output, 0, None).await?;
        // The tier's outputs with no directory: every source derived, none
        // stored (the cold epoch's cost without its writes).
        let derive_only = engine_over(&s3, spec.decode_threads)?;
        let derived = epoch(&derive_only, &uri, spec, output, 0, Some(form)).await?;
        let cold = epoch(&engine, &uri, spec, output, 0, Some(form)).await?;
        let warm1 = epoch(&engine, &uri, spec, output, 1, Some(form)).await?;
        let warm2 = epoch(&engine, &uri, spec, output, 2, Some(form)).await?;
        let warm = (warm1.samples_per_second + warm2.samples_per_second) / 2.0;
        let warm_cpu = (warm1.cpu_ms_per_sample + warm2.cpu_ms_per_sample) / 2.0;
        let cores = spec.decode_threads as f64;
        println!(
            "{}",
            serde_json::json!({
                "benchmark": "decoded_tier_stream",
                "recipe": name,
                "form": form.to_string(),
                "decoder": decode::default_decoder_name(),
                "decode_threads": spec.decode_threads,
                "samples": spec.data.shards * spec.data.samples_per_shard,
                "record_bytes_per_sample": tier.bytes() / tier.records().max(1) as u64,
                "typical_stored_size": [w, h],
                "today_samples_per_second": today.samples_per_second,
                "today_cpu_ms_per_sample": today.cpu_ms_per_sample,
                "derive_only_samples_per_second": derived.samples_per_second,
                "derive_only_cpu_ms_per_sample": derived.cpu_ms_per_sample,
                "cold_samples_per_second": cold.samples_per_second,
                "cold_cpu_ms_per_sample": cold.cpu_ms_per_sample,
                "warm_samples_per_second": warm,
                "warm_cpu_ms_per_sample": warm_cpu,
                "entropy_floor_per_thread": floor,
                "warm_over_today": warm / today.samples_per_second,
                "warm_over_floor_times_threads": warm / (floor * cores),
                "cold_over_today": cold.samples_per_second / today.samples_per_second,
            })
        );
        println!(
            "{name}: today {:.0}/s ({:.2} CPU-ms/sample), tier derived without storing {:.0}/s ({:.2} CPU-ms/sample), cold {:.0}/s ({:.0}% of today), warm {:.0}/s ({:.2} CPU-ms/sample): {:.2}x today, {:.2}x the entropy floor ({:.0}/s/thread) x {} threads",
            today.samples_per_second,
            today.cpu_ms_per_sample,
            derived.samples_per_second,
            derived.cpu_ms_per_sample,
            cold.samples_per_second,
            100.0 * cold.samples_per_second / today.samples_per_second,
            warm,
            warm_cpu,
            warm / today.samples_per_second,
            warm / (floor * cores),
            floor,
            spec.decode_threads
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn tempfile_dir() -> std::io::Result<std::path::PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    Ok(std::env::temp_dir().join(format!("shardfeed-tier-{}-{nanos}", std::process::id())))
}
