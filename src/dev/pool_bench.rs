//! `shardfeed pool-bench`: a training stream decoded by this process alone
//! against the same stream with a decode pool taking the shortfall,
//! alternately in one process so the ratio is not skewed by a machine that
//! got busier between runs. Run it pinned to some cores and the workers to
//! others (`taskset`) to see what the pool adds to a host's cores. Also
//! prints the wire bytes per sample of the unit format (compressed bytes
//! out, pixels back) and this process's CPU per sample either way.

use prost::Message;

use super::bench::{bench_request, engine_over, measured_epoch, median, BenchError, TRAIN};
use super::s3mem;
use super::synthetic::{self, SyntheticSpec};
use crate::decode::{self, SampleKey};
use crate::pool::wire::{self, UnitSample};
use crate::pool::{PoolClient, PoolConfig};
use crate::shard::ImageFormat;

#[derive(Debug, Clone)]
pub struct PoolBenchSpec {
    pub data: SyntheticSpec,
    pub batch_size: u32,
    pub decode_threads: usize,
    pub rounds: usize,
    pub pool: PoolConfig,
}

/// Bytes on the wire per sample, out and back, for units of `unit_samples`
/// of the demo's photos (protobuf framing included; HTTP/2 adds 9 bytes a
/// frame).
fn wire_bytes(jpegs: &[bytes::Bytes], unit_samples: usize) -> (f64, f64) {
    let samples: Vec<UnitSample> = jpegs
        .iter()
        .enumerate()
        .map(|(i, data)| UnitSample {
            key: SampleKey {
                seed: 1,
                epoch: 0,
                sample: i as u64,
                copy: 0,
            },
            format: ImageFormat::Jpeg,
            data: data.clone(),
        })
        .collect();
    let (mut out, mut back, mut count) = (0usize, 0usize, 0usize);
    for unit in samples.chunks(unit_samples.max(1)) {
        out += wire::unit_to_wire(0, TRAIN, unit).encoded_len();
        let answer = wire::pb::DecodedUnit {
            unit_id: 0,
            pixels: vec![0u8; TRAIN.bytes() * unit.len()].into(),
            results: unit
                .iter()
                .map(|_| {
                    wire::answer_to_wire(&wire::SampleAnswer::Decoded(decode::CropBox {
                        left: 1.5,
                        top: 2.5,
                        width: 100.25,
                        height: 90.75,
                        drawn: decode::Drawn {
                            horizontal_flip: true,
                            ..decode::Drawn::default()
                        },
                    }))
                })
                .collect(),
        };
        back += answer.encoded_len();
        count += unit.len();
    }
    (
        out as f64 / count.max(1) as f64,
        back as f64 / count.max(1) as f64,
    )
}

pub async fn run(spec: &PoolBenchSpec) -> Result<(), BenchError> {
    let s3 = s3mem::start(0).await?;
    eprintln!(
        "synthesizing {} photo-like JPEGs ...",
        spec.data.shards * spec.data.samples_per_shard
    );
    let uri = synthetic::publish(&s3, &spec.data).await?;
    let jpegs = synthetic::photos(&spec.data, 64);
    let (out_bytes, back_bytes) = wire_bytes(&jpegs, spec.pool.unit_samples);
    let client = PoolClient::start(spec.pool.clone(), decode::default_decoder_name());
    let workers = client
        .wait_for_workers(1, std::time::Duration::from_secs(10))
        .await;
    if workers == 0 {
        return Err(format!("no pool worker at {:?}", spec.pool.targets).into());
    }
    let local = engine_over(&s3, spec.decode_threads)?;
    let pooled = engine_over(&s3, spec.decode_threads)?.with_pool(client.clone());
    let (mut rates, mut cpus) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    let mut remote_shares = Vec::new();
    for round in 0..spec.rounds {
        for (arm, (name, engine)) in [("local", &local), ("pooled", &pooled)]
            .into_iter()
            .enumerate()
        {
            let before = client.counts();
            let request = bench_request(&uri, spec.batch_size, TRAIN, 1, round as u64);
            let figures = measured_epoch(engine, request).await?;
            let remote = client.counts().remote_samples - before.remote_samples;
            let samples = (spec.data.shards * spec.data.samples_per_shard) as f64;
            let remote_share = remote as f64 / samples;
            if arm == 1 {
                remote_shares.push(remote_share);
            }
            println!(
                "{}",
                serde_json::json!({
                    "benchmark": "pool",
                    "round": round,
                    "arm": name,
                    "decoder": decode::default_decoder_name(),
                    "decode_threads": spec.decode_threads,
                    "pool_share": format!("{:?}", spec.pool.share),
                    "workers": workers,
                    "samples_per_second": figures.samples_per_second,
                    "cpu_ms_per_sample": figures.cpu_ms_per_sample,
                    "remote_share": remote_share,
                })
            );
            rates[arm].push(figures.samples_per_second);
            cpus[arm].push(figures.cpu_ms_per_sample);
        }
    }
    let rate = [median(&mut rates[0]), median(&mut rates[1])];
    let cpu = [median(&mut cpus[0]), median(&mut cpus[1])];
    let share = median(&mut remote_shares);
    // CPU here per pooled sample: what the pooled epoch cost beyond its
    // locally decoded share, spread over the samples the pool decoded.
    let per_remote = if share > 0.0 {
        (cpu[1] - (1.0 - share) * cpu[0]) / share
    } else {
        f64::NAN
    };
    println!(
        "medians over {} rounds, {} decode threads here, {workers} worker(s): local {:.0}/s ({:.2} CPU-ms/sample), pooled {:.0}/s ({:.2} CPU-ms/sample, {:.0}% decoded remotely): {:.2}x; CPU here per pool-decoded sample {:.2} ms against {:.2} ms decoded locally; wire {:.0} B/sample out, {:.0} B/sample back",
        spec.rounds,
        spec.decode_threads,
        rate[0],
        cpu[0],
        rate[1],
        cpu[1],
        100.0 * share,
        rate[1] / rate[0],
        per_remote,
        cpu[0],
        out_bytes,
        back_bytes
    );
    println!(
        "{}",
        serde_json::json!({
            "benchmark": "pool_summary",
            "rounds": spec.rounds,
            "local_samples_per_second": rate[0],
            "pooled_samples_per_second": rate[1],
            "ratio": rate[1] / rate[0],
            "remote_share": share,
            "local_cpu_ms_per_sample": cpu[0],
            "pooled_cpu_ms_per_sample": cpu[1],
            "cpu_ms_per_remote_sample": per_remote,
            "wire_bytes_out_per_sample": out_bytes,
            "wire_bytes_back_per_sample": back_bytes,
            "units": format!("{:?}", client.counts()),
        })
    );
    Ok(())
}
