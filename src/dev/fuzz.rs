//! Fuzzing entry points: what `fuzz/` (cargo fuzz, libFuzzer) and the
//! property tests feed arbitrary bytes into. Each must return, quickly,
//! without panicking, whatever the input.

use prost::Message;

use crate::engine::budget::{StreamCost, StreamShape};
use crate::pipeline::PipelineConfig;
use crate::plan::{self, ShuffleConfig};
use crate::server::pb;
use crate::shard::splitter::SampleSplitter;
use crate::shard::DEFAULT_MAX_MEMBER_BYTES;

/// Tar bytes of a shard, pushed in chunks whose sizes come from the input's
/// first byte, through the sample splitter; then the whole shard at once
/// through the indexer. Both must agree: chunking never changes the result.
pub fn tar_splitter(data: &[u8]) {
    let Some((&chunking, tar)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunking).max(1) * 7;
    let chunked = split_in_chunks(tar, chunk);
    let whole = crate::dataset::index_shard_bytes(tar, None);
    match (chunked, whole) {
        (Ok(keys), Ok(index)) => {
            assert_eq!(keys, index.keys, "chunking changed the samples");
            assert!(index.starts.iter().zip(&index.ends).all(|(s, e)| s <= e));
        }
        (Err(_), Err(_)) => {}
        (chunked, whole) => panic!(
            "chunked and whole parses disagree: {:?} vs {:?}",
            chunked.map(|k| k.len()),
            whole.map(|i| i.keys.len())
        ),
    }
}

fn split_in_chunks(tar: &[u8], chunk: usize) -> Result<Vec<String>, crate::shard::ShardError> {
    let mut splitter = SampleSplitter::new(0, DEFAULT_MAX_MEMBER_BYTES);
    let mut keys = Vec::new();
    for piece in tar.chunks(chunk) {
        splitter.push(piece);
        while let Some(sample) = splitter.next_sample()? {
            keys.push(sample.key);
        }
    }
    while let Some(sample) = splitter.finish()? {
        keys.push(sample.key);
    }
    Ok(keys)
}

/// Shard sample counts the request fuzzer plans against.
const DATASET: &[u64] = &[100, 37, 250, 1, 64];

/// A `StreamBatchesRequest` as protobuf bytes, through the server's checks,
/// the stream's memory cost and planning (with the first batch's position).
pub fn stream_request(data: &[u8]) {
    let Ok(request) = pb::StreamBatchesRequest::decode(data) else {
        return;
    };
    check_request(&request);
}

/// The checks and planning a decoded request goes through.
pub fn check_request(request: &pb::StreamBatchesRequest) {
    let Ok(request) = crate::server::service::stream_request(request, ShuffleConfig::default())
    else {
        return;
    };
    if plan::validate_shuffle(request.plan.shuffle).is_err() {
        return;
    }
    let shuffle = request.plan.shuffle.effective();
    let cost = StreamCost::new(
        &PipelineConfig::default(),
        StreamShape {
            interleave: shuffle.interleave,
            shuffle_buffer: shuffle.buffer,
            batch_bytes: request.output.spec.bytes() as u64 * u64::from(request.plan.batch_size),
            mean_sample_bytes: 110_000,
            loose_objects: false,
        },
    );
    let _ = cost.total();
    if let Ok(stream) = plan::plan_stream(DATASET, &request.plan) {
        if stream.batches > 0 {
            let first = stream.first_batch;
            let _ = stream.position_after(first);
            let _ = stream.global_samples_after(first);
        }
        let _ = plan::next_epoch_shard_sequence(DATASET, &request.plan);
    }
}
