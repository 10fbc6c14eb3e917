//! shardfeed: a per-host data server that streams decoded, batched images
//! from WebDataset tar shards in S3 to GPU trainers over gRPC.
//!
//! Data flows `plan → store → shard → (shuffle) → decode → pipeline → server`;
//! see DESIGN.md for the invariants each module guards.

pub mod bench;
pub mod dataset;
pub mod decode;
pub mod demo;
pub mod metrics;
pub mod pipeline;
pub mod plan;
pub mod s3mem;
pub mod server;
pub mod shard;
pub mod store;
