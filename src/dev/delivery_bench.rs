//! `shardfeed delivery-bench`: the server's CPU per sample for encoded
//! delivery against decoded delivery of the same training stream
//! (RandomResizedCrop + flip), alternately in one process so the ratio is
//! not skewed by a machine that got busier between runs. Encoded delivery
//! still reads, parses, shuffles, walks each JPEG's headers and decides its
//! box; what it drops is the decode and resize. A server share of 0.5 is
//! measured beside them.

use super::bench::{bench_request, engine_over, measured_epoch, median, BenchError, TRAIN};
use super::s3mem;
use super::synthetic::{self, SyntheticSpec};
use crate::decode;
use crate::pipeline::Delivery;

#[derive(Debug, Clone)]
pub struct DeliveryBenchSpec {
    pub data: SyntheticSpec,
    pub batch_size: u32,
    pub decode_threads: usize,
    pub rounds: usize,
}

pub async fn run(spec: &DeliveryBenchSpec) -> Result<(), BenchError> {
    let s3 = s3mem::start(0).await?;
    eprintln!(
        "synthesizing {} photo-like JPEGs ...",
        spec.data.shards * spec.data.samples_per_shard
    );
    let uri = synthetic::publish(&s3, &spec.data).await?;
    let engine = engine_over(&s3, spec.decode_threads)?;
    let deliveries = [
        ("decoded", Delivery::Decoded),
        ("encoded", Delivery::encoded(0.0)),
        ("encoded_server_half", Delivery::encoded(0.5)),
    ];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); deliveries.len()];
    let mut rate: Vec<Vec<f64>> = vec![Vec::new(); deliveries.len()];
    for round in 0..spec.rounds {
        for (i, (name, delivery)) in deliveries.iter().enumerate() {
            let mut request = bench_request(&uri, spec.batch_size, TRAIN, 1, round as u64);
            request.output.delivery = *delivery;
            let figures = measured_epoch(&engine, request).await?;
            println!(
                "{}",
                serde_json::json!({
                    "benchmark": "delivery",
                    "round": round,
                    "delivery": name,
                    "decoder": decode::default_decoder_name(),
                    "decode_threads": spec.decode_threads,
                    "samples_per_second": figures.samples_per_second,
                    "cpu_ms_per_sample": figures.cpu_ms_per_sample,
                })
            );
            cpu[i].push(figures.cpu_ms_per_sample);
            rate[i].push(figures.samples_per_second);
        }
    }
    let cpu: Vec<f64> = cpu.iter_mut().map(|v| median(v)).collect();
    let rate: Vec<f64> = rate.iter_mut().map(|v| median(v)).collect();
    println!(
        "medians over {} rounds: decoded {:.3} CPU-ms/sample ({:.0}/s), encoded {:.3} CPU-ms/sample ({:.0}/s): {:.3} of decoded (1/{:.1}), server share 0.5 {:.3} CPU-ms/sample ({:.0}/s)",
        spec.rounds,
        cpu[0],
        rate[0],
        cpu[1],
        rate[1],
        cpu[1] / cpu[0],
        cpu[0] / cpu[1],
        cpu[2],
        rate[2],
    );
    Ok(())
}
