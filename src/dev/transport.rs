//! A synthetic batch source for measuring the transport alone: each batch of
//! the stream's plan is a fixed pseudo-random pattern written straight into
//! its buffer or shared-memory slot on the decode pool, with no reads, no
//! parsing and no decoding. Producing a batch costs one write of its bytes,
//! the least any decoder pays; everything after it (the ring, credits, the
//! gRPC message, the client) is the real path.

use std::sync::OnceLock;
use std::time::Instant;

use rayon::prelude::*;
use tokio::sync::oneshot;

use crate::decode::CropBox;
use crate::pipeline::buffers::BufferPool;
use crate::pipeline::{
    spawn_producer, BatchImages, BatchReceiver, BatchSender, DecodedBatch, PipelineError,
    StreamContext,
};
use crate::plan::rng::Rng;

/// Small enough to stay in L2, as a real decoder's output rows do.
const PATTERN_BYTES: usize = 256 << 10;

fn pattern() -> &'static [u8] {
    static PATTERN: OnceLock<Vec<u8>> = OnceLock::new();
    PATTERN.get_or_init(|| {
        let mut rng = Rng::derive(&[PATTERN_BYTES as u64]);
        (0..PATTERN_BYTES).map(|_| rng.next_u64() as u8).collect()
    })
}

/// Fills `out` with the pattern, starting `start` bytes into it.
fn fill(out: &mut [u8], mut start: usize) {
    let pattern = pattern();
    for chunk in out.chunks_mut(PATTERN_BYTES) {
        let len = chunk.len();
        let take = len.min(PATTERN_BYTES - start % PATTERN_BYTES);
        let from = start % PATTERN_BYTES;
        chunk[..take].copy_from_slice(&pattern[from..from + take]);
        chunk[take..].copy_from_slice(&pattern[..len - take]);
        start = 0;
    }
}

/// Starts a stream that sends the plan's batches, each image a pattern (its
/// offset set by the sample's place in the epoch, so images differ), labels
/// the same places. Like [`crate::pipeline::spawn_stream`], dropping the
/// receiver stops it and `held` lives as long as it runs.
pub fn spawn_synthetic_stream<H: Send + 'static>(
    context: StreamContext,
    span: tracing::Span,
    held: H,
) -> BatchReceiver {
    let capacity = context.common.config.ready_batches;
    spawn_producer(capacity, span, held, move |tx| async move {
        produce(&context, &tx).await
    })
}

async fn produce(context: &StreamContext, tx: &BatchSender) -> Result<(), PipelineError> {
    let common = &context.common;
    let size = context.planned.batch_size() as usize;
    let image_bytes = common.spec.bytes();
    let buffers = BufferPool::new(common.config.ready_batches + 2);
    for index in context.planned.batch_range() {
        let mut lease = match &common.ring {
            Some(shared) => Some(shared.acquire().await?),
            None => None,
        };
        let (done, filled) = oneshot::channel();
        let first_sample = index as usize * size;
        let buffers = buffers.clone();
        common.pool.spawn(move || {
            let mut heap = Vec::new();
            let images: &mut [u8] = match &mut lease {
                Some(lease) => &mut lease.as_mut_slice()[..size * image_bytes],
                None => {
                    heap = buffers.take(size * image_bytes);
                    &mut heap
                }
            };
            images
                .par_chunks_mut(image_bytes)
                .enumerate()
                .for_each(|(i, out)| fill(out, (first_sample + i) * 4099));
            let images = match lease {
                Some(lease) => BatchImages::Shared(lease),
                None => BatchImages::Inline(buffers.share(heap)),
            };
            let _ = done.send(images);
        });
        let images = filled
            .await
            .map_err(|_| PipelineError::Internal("synthetic fill dropped".into()))?;
        let batch = DecodedBatch {
            index,
            size,
            images,
            image_bytes: size * image_bytes,
            encoded: Vec::new(),
            labels: (0..size).map(|i| (first_sample + i) as i64).collect(),
            keys: (0..size)
                .map(|i| format!("{:09}", first_sample + i))
                .collect(),
            shards: Vec::new(),
            sources: vec![0; size],
            source_epochs: Vec::new(),
            padded: Vec::new(),
            copies: Vec::new(),
            crops: vec![CropBox::default(); size],
            view_crops: Vec::new(),
            substituted: Vec::new(),
            fields: Vec::new(),
            ready_at: Instant::now(),
            search: None,
        };
        if tx.send(Ok(batch)).await.is_err() {
            return Ok(()); // the client went away
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_every_byte_from_the_pattern_at_the_given_offset() {
        let mut out = vec![0u8; PATTERN_BYTES + 100];
        fill(&mut out, 7);
        let pattern = pattern();
        assert_eq!(out[..PATTERN_BYTES - 7], pattern[7..]);
        assert_eq!(out[PATTERN_BYTES - 7..PATTERN_BYTES], pattern[..7]);
        assert_eq!(out[PATTERN_BYTES..], pattern[..100]);
    }
}
