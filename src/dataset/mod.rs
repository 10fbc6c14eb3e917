//! Datasets: URIs, the shard index, and the registry of opened datasets.
//!
//! The index lives beside the shards under `_shardfeed/`: a summary
//! (`index.json`: shards, sizes, ETags, sample counts; O(shards)) and one small
//! file per shard with each sample's key and byte range, read only when a
//! stream is about to read that shard. `shardfeed index URI` writes it; a
//! server that finds none builds it by scanning once and keeps it in memory.
//!
//! A prefix without shards but with images is a loose-object dataset
//! ([`loose`]): its listing, grouped into virtual shards, is the index.

mod build;
mod charge;
mod format;
mod index;
pub mod loose;
pub mod manifest;
mod opened;
pub mod parquet;
mod registry;
mod scan;
mod uri;

pub use build::{build_index, build_index_reporting, parse_classes, write_index};
pub use format::{RowGroupRef, ShardKind};
pub use index::{
    parse_shard_index, parse_summary, DatasetError, DatasetIndex, DatasetLayout, DatasetLocation,
    ShardEntry, ShardIndex, CLASSES_FILE, INDEX_DIR, INDEX_VERSION,
};
pub use opened::Dataset;
pub use registry::DatasetRegistry;
pub use scan::{index_shard_bytes, IndexProgress};
pub use uri::DatasetUri;
