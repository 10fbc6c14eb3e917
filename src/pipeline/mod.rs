//! The stream pipeline: wires fetch, parse, shuffle, decode and batch with
//! bounded channels, following a [`StreamPlan`] step by step.
//!
//! # Shape of one stream
//!
//! ```text
//! shard readers  ──► producer task ──► decode pool ──► ready queue ──► gRPC
//! (tokio tasks:       (follows the      (rayon, shared  (bounded mpsc)
//!  ranged GETs,        plan's Pull/Emit   by all streams)
//!  tar parse)          steps; holds the
//!                      shuffle buffer)
//! ```
//!
//! # Where memory is bounded
//!
//! Every queue has a configured bound; nothing grows with the dataset:
//!
//! * **Shard readers.** At most `interleave + prefetch_shards` readers are
//!   alive per stream. Each holds up to `parts_in_flight * part_size` bytes of
//!   ranged GETs in flight, one part being handed to the parser, the parser's
//!   buffer (up to a part plus the member it straddles), and `reader_queue`
//!   parsed samples waiting in its channel.
//! * **Shuffle buffer.** `shuffle_buffer` compressed samples (the plan's
//!   buffer, mirrored here on real bytes).
//! * **Batches.** `decode_ahead` batches being decoded plus `ready_batches`
//!   decoded batches waiting for the client, each
//!   `batch_size * height * width * 3` bytes, or with several views per
//!   sample `batch_size` times every view's `height * width * 3` (an
//!   encoded delivery's batch is at most as long: see [`encoded`]).
//!
//! Peak per stream ≈
//!
//! ```text
//! (interleave + prefetch_shards) * (parts_in_flight + 2) * part_size
//! + (interleave + prefetch_shards) * reader_queue * S
//! + shuffle_buffer * S
//! + (decode_ahead + ready_batches + 3) * batch_bytes
//! ```
//!
//! with `S` the mean compressed sample size. The batch term is the stream's
//! pooled batch buffers (decoding, queued, one being encoded) plus the
//! encoded copies gRPC holds while sending.
//!
//! Decode scratch is shared by all streams: a full-size decode, and a
//! decoded-source tier record read or derived, holds its image's share of
//! the server's scratch budget (`--memory-limit / 8`, at most 1 GiB) while
//! it works, so the decode threads together never hold more.
//!
//! # Where the decoded-source tier's disk I/O runs
//!
//! On the decode threads, inside each sample's decode (decode sees the tier
//! only as a `SourceStore`): a hit reads one record file and a miss writes
//! one, under the scratch budget as above. Not on the async runtime, whose
//! threads only move bytes; and not ahead of the decode on a thread of its
//! own, which would hold a second copy of every record in flight. A slow
//! disk slows the decode pool as a slow decode would, and back-pressure
//! follows as below.
//!
//! # Who blocks whom
//!
//! A slow client fills the ready queue; the producer then waits to send, stops
//! pulling, readers fill their channels and stop fetching. A client that goes
//! away closes the ready queue: the producer notices at once (it watches the
//! queue while it waits) and drops its readers, which aborts their requests.

mod assemble;
mod batch;
pub(crate) mod buffers;
mod config;
mod context;
mod dispatch;
pub mod encoded;
mod error;
mod mix;
mod produce;
mod readers;
mod remote;
mod sample;
pub mod shm;
mod substitute;
mod views;
mod walk;

use tokio::sync::mpsc;

pub use batch::{BatchImages, BatchReceiver, BatchSender, DecodedBatch};
pub use config::{
    PipelineConfig, DEFAULT_DECODE_AHEAD, DEFAULT_PREFETCH_SHARDS, DEFAULT_READER_QUEUE,
    DEFAULT_READY_BATCHES, DEFAULT_STREAM_WINDOW_BYTES,
};
pub use context::{CacheHints, Planned, SharedTarget, Source, StreamCommon, StreamContext};
pub use encoded::{Delivery, Placement, SearchState};
pub use error::PipelineError;
pub use substitute::{substitute_source, Substitution};
pub use views::{GroupPlace, ViewLayout};

/// Starts the stream's producer task and returns its ready queue. Dropping
/// the receiver stops the stream and frees its resources.
///
/// `held` lives as long as the stream's task (e.g. its memory reservation):
/// it is released when the last stage of the stream has stopped.
pub fn spawn_stream<H: Send + 'static>(
    context: StreamContext,
    span: tracing::Span,
    held: H,
) -> BatchReceiver {
    let capacity = context.common.config.ready_batches;
    let feeders_span = span.clone();
    spawn_producer(capacity, span, held, move |tx| async move {
        produce::produce(&context.common, &context.planned, &tx, feeders_span).await
    })
}

/// Runs a stream's producer (`produce`, given the ready queue's sender) as a
/// task: an error it returns is the stream's last item, and it is stopped
/// as soon as the client drops the receiver. `held` lives as long as it.
pub fn spawn_producer<H, F, Fut>(
    ready_batches: usize,
    span: tracing::Span,
    held: H,
    produce: F,
) -> BatchReceiver
where
    H: Send + 'static,
    F: FnOnce(BatchSender) -> Fut,
    Fut: std::future::Future<Output = Result<(), PipelineError>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(ready_batches.max(1));
    let producing = produce(tx.clone());
    let task = async move {
        let _held = held;
        tokio::select! {
            result = producing => {
                if let Err(error) = result {
                    let _ = tx.send(Err(error)).await;
                }
            }
            () = tx.closed() => {
                tracing::debug!("client went away; stream stopped");
            }
        }
    };
    tokio::spawn(tracing::Instrument::instrument(task, span));
    rx
}
