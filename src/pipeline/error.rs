//! Why a stream's pipeline stopped: each mapped to a gRPC code at the edge
//! (`server::status`).

use crate::dataset::DatasetError;
use crate::shard::ShardError;
use crate::store::StoreError;

/// Why a stream's pipeline stopped.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("{0}")]
    Dataset(#[from] DatasetError),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("shard {location}: {source}")]
    Shard {
        location: String,
        #[source]
        source: ShardError,
    },
    #[error(
        "shard {location} does not match its index (sample {index}: expected key {expected:?}, \
         found {found:?}); rebuild the index with `shardfeed index`"
    )]
    StaleIndex {
        location: String,
        index: u64,
        expected: String,
        found: String,
    },
    #[error(
        "{location} is gone, though the dataset's index lists it; rebuild the index with \
         `shardfeed index` (or serve with --on-bad-shard skip to substitute missing objects)"
    )]
    ObjectGone { location: String },
    #[error("{0}")]
    SharedMemory(String),
    /// The shared-memory socket is at its client limit.
    #[error("{0}")]
    SharedMemoryBusy(String),
    /// The client closed its shared-memory connection: it left the stream
    /// (an abandoned iterator, a finished job), which is not a fault.
    #[error("the client closed its shared-memory connection")]
    ClientLeft,
    #[error("internal pipeline error: {0}")]
    Internal(String),
}
