//! `shardfeed parquet-bench`: the same photos as tar shards and as Parquet
//! files in the Hugging Face layout (row groups of 100 rows, as the Hub
//! writes images, and of 1,000), streamed alternately in one process
//! through the loopback S3 server with a first-byte delay on every GET,
//! for the evaluation and the training recipe; then the planning of a
//! dataset of many files from their footers. Prints JSON lines and a
//! summary.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::bench::{engine_over, BenchError, TRAIN};
use super::parquet_files::{self, Layout, Row};
use super::s3mem;
use super::synthetic::{self, SyntheticSpec};
use crate::decode::{Crop, Ops, OutputSpec};
use crate::engine::StreamRequest;
use crate::plan::{EpochPosition, Partition, PlanRequest, ShuffleConfig};
use crate::shard::splitter::SampleSplitter;
use crate::shard::{Label, DEFAULT_MAX_MEMBER_BYTES};

#[derive(Debug, Clone)]
pub struct ParquetBenchSpec {
    pub data: SyntheticSpec,
    pub batch_size: u32,
    pub decode_threads: usize,
    pub rounds: usize,
    /// Before every GET's response: S3's time to first byte.
    pub get_delay: Duration,
    /// Files of the planning run (each a few rows).
    pub plan_files: usize,
}

const EVAL: OutputSpec = OutputSpec {
    height: 224,
    width: 224,
    crop: Crop::Center { resize: None },
    resample: crate::decode::Resample::Bilinear,
    ops: Ops::NONE,
};

/// The rows of tar shards: each sample's JPEG and label, in order.
fn rows_of(shards: &[(String, Vec<u8>)]) -> Result<Vec<Row>, BenchError> {
    let mut rows = Vec::new();
    for (name, tar) in shards {
        let mut splitter = SampleSplitter::new(0, DEFAULT_MAX_MEMBER_BYTES);
        splitter.push(tar);
        loop {
            let sample = match splitter.next_sample()? {
                Some(sample) => Some(sample),
                None => splitter.finish()?,
            };
            let Some(sample) = sample else { break };
            let label = match sample.label {
                Label::Value(value) => Some(value),
                _ => None,
            };
            rows.push(Row {
                image: sample.image.map(|(_, bytes)| bytes.to_vec()),
                path: Some(format!("{name}/{}.jpg", sample.key)),
                label,
            });
        }
    }
    Ok(rows)
}

/// The rows as files of `rows_per_file`, in row groups of `rows_per_group`.
fn files_of(
    rows: &[Row],
    rows_per_file: usize,
    rows_per_group: usize,
) -> Result<Vec<(String, Vec<u8>)>, BenchError> {
    let chunks: Vec<&[Row]> = rows.chunks(rows_per_file).collect();
    let count = chunks.len();
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| {
            let layout = Layout {
                rows_per_group,
                ..Layout::default()
            };
            let file = parquet_files::write(chunk, &layout)?;
            Ok((format!("data/train-{i:05}-of-{count:05}.parquet"), file))
        })
        .collect()
}

struct Figures {
    samples: u64,
    seconds: f64,
    gets: u64,
}

async fn one_epoch(
    engine: &crate::engine::Engine,
    s3: &s3mem::RunningS3,
    uri: &str,
    output: OutputSpec,
    spec: &ParquetBenchSpec,
    seed: u64,
) -> Result<Figures, BenchError> {
    let plan = PlanRequest {
        seed,
        epoch: 0,
        rank: 0,
        world_size: 1,
        batch_size: spec.batch_size,
        shuffle: ShuffleConfig::default(),
        partition: Partition::DropLast,
        repeats: 1,
        start_batch: 0,
        resume_from: EpochPosition::default(),
    };
    let gets = s3.state.counts.get.load(Ordering::SeqCst);
    let started = Instant::now();
    let mut batches = engine
        .open_stream(StreamRequest::one(uri, plan, output))
        .await?
        .batches;
    let mut samples = 0u64;
    while let Some(batch) = batches.recv().await {
        samples += batch?.size as u64;
    }
    Ok(Figures {
        samples,
        seconds: started.elapsed().as_secs_f64(),
        gets: s3.state.counts.get.load(Ordering::SeqCst) - gets,
    })
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

pub async fn run(spec: &ParquetBenchSpec) -> Result<(), BenchError> {
    let s3 = s3mem::start(0).await?;
    let owned = spec.data.clone();
    let total = spec.data.shards * spec.data.samples_per_shard;
    eprintln!("synthesizing {total} photo-like JPEGs ...");
    let shards = tokio::task::spawn_blocking(move || synthetic::synthesize_shards(&owned)).await?;
    let rows = rows_of(&shards)?;
    let per_file = 1_000.min(rows.len());
    let layouts = [("parquet-100", 100usize), ("parquet-1000", 1_000)];
    let mut uris = vec![("tar", synthetic::upload_indexed(&s3, "tar/", shards).await?)];
    for (name, group) in layouts {
        let files = files_of(&rows, per_file, group)?;
        let prefix = format!("{name}/");
        let uri = synthetic::upload_indexed(&s3, &prefix, files).await?;
        uris.push((name, uri));
    }
    drop(rows);
    s3.state.faults.set_get_delay(spec.get_delay);
    let engine = engine_over(&s3, spec.decode_threads)?;
    let recipes = [("evaluation", EVAL), ("training", TRAIN)];
    // rates[recipe][layout]: samples/s of each round; gets per 1,000.
    let mut rates = vec![vec![Vec::new(); uris.len()]; recipes.len()];
    let mut gets = vec![vec![0.0; uris.len()]; recipes.len()];
    for round in 0..spec.rounds {
        for (r, (recipe, output)) in recipes.iter().enumerate() {
            for (l, (layout, uri)) in uris.iter().enumerate() {
                let figures = one_epoch(&engine, &s3, uri, *output, spec, round as u64).await?;
                let rate = figures.samples as f64 / figures.seconds;
                let per_thousand = figures.gets as f64 * 1_000.0 / figures.samples.max(1) as f64;
                rates[r][l].push(rate);
                gets[r][l] = per_thousand;
                println!(
                    "{}",
                    serde_json::json!({
                        "benchmark": "parquet_throughput",
                        "round": round,
                        "recipe": recipe,
                        "layout": layout,
                        "samples": figures.samples,
                        "samples_per_second": rate,
                        "gets_per_1000_samples": per_thousand,
                        "get_delay_ms": spec.get_delay.as_millis() as u64,
                        "decode_threads": spec.decode_threads,
                    })
                );
            }
        }
    }
    for (r, (recipe, _)) in recipes.iter().enumerate() {
        for (l, (layout, _)) in uris.iter().enumerate().skip(1) {
            // Each round's ratio against tar's run just before it: the
            // machine's drift between rounds cancels.
            let mut ratios: Vec<f64> = rates[r][l]
                .iter()
                .zip(&rates[r][0])
                .map(|(parquet, tar)| parquet / tar)
                .collect();
            let ratio = median(&mut ratios);
            let rate = median(&mut rates[r][l].clone());
            let tar = median(&mut rates[r][0].clone());
            println!(
                "{recipe}: {layout} {ratio:.3}x tar (median of {} alternating rounds' ratios; \
                 {rate:.0} vs {tar:.0} samples/s); GETs per 1,000 samples {:.1} (tar {:.1}); \
                 {} ms to first byte, {} decode threads",
                spec.rounds,
                gets[r][l],
                gets[r][0],
                spec.get_delay.as_millis(),
                spec.decode_threads
            );
        }
    }
    if spec.plan_files > 0 {
        plan_many_files(&s3, spec).await?;
    }
    Ok(())
}

/// `plan_files` small files (a few rows each, so the footers are what is
/// read), indexed from nothing: the time and the requests it takes.
async fn plan_many_files(s3: &s3mem::RunningS3, spec: &ParquetBenchSpec) -> Result<(), BenchError> {
    let rows: Vec<Row> = (0..4)
        .map(|i| Row {
            image: Some(vec![0xFF, 0xD8, 0xFF, i]),
            path: Some(format!("img/{i}.jpg")),
            label: Some(i64::from(i)),
        })
        .collect();
    let file = parquet_files::write(
        &rows,
        &Layout {
            rows_per_group: 2,
            ..Layout::default()
        },
    )?;
    eprintln!("uploading {} small Parquet files ...", spec.plan_files);
    s3.state.faults.set_get_delay(Duration::ZERO);
    let client = crate::store::s3::client(&s3.s3_config()).await;
    let store = crate::store::s3::S3Store::new(client, synthetic::DEMO_BUCKET);
    use crate::store::ObjectStore;
    for i in 0..spec.plan_files {
        store
            .put(
                &format!("plan/data/train-{i:05}.parquet"),
                bytes::Bytes::from(file.clone()),
            )
            .await?;
    }
    s3.state.faults.set_get_delay(spec.get_delay);
    let store: std::sync::Arc<dyn ObjectStore> = std::sync::Arc::new(store);
    let location = crate::dataset::DatasetLocation::prefix("plan/data/");
    let counts = &s3.state.counts;
    let (gets, lists) = (
        counts.get.load(Ordering::SeqCst),
        counts.list.load(Ordering::SeqCst),
    );
    let started = Instant::now();
    let (index, _) = crate::dataset::build_index(
        store,
        &location,
        &crate::store::read::ReadConfig::default(),
        crate::shard::BadShardPolicy::Fail,
    )
    .await?;
    let seconds = started.elapsed().as_secs_f64();
    let gets = counts.get.load(Ordering::SeqCst) - gets;
    let lists = counts.list.load(Ordering::SeqCst) - lists;
    println!(
        "{}",
        serde_json::json!({
            "benchmark": "parquet_planning",
            "files": spec.plan_files,
            "row_groups": index.shards.len(),
            "samples": index.samples(),
            "seconds": seconds,
            "gets": gets,
            "lists": lists,
            "get_delay_ms": spec.get_delay.as_millis() as u64,
        })
    );
    println!(
        "planning {} files ({} row groups) from their footers: {seconds:.2} s, {gets} GETs, \
         {lists} LIST pages, {} ms to first byte",
        spec.plan_files,
        index.shards.len(),
        spec.get_delay.as_millis()
    );
    Ok(())
}
