//! shardfeed: a per-host data server that streams decoded, batched images
//! from WebDataset tar shards in S3 to GPU trainers over gRPC.
//!
//! Data flows `plan → store → shard → (shuffle) → decode → pipeline → server`;
//! [`engine`] owns what every stream shares. `docs/ARCHITECTURE.md` says
//! what each module owns and must never do; DESIGN.md gives the invariants.

pub mod cli;
pub mod dataset;
pub mod decode;
pub mod engine;
pub mod hash;
pub mod metrics;
pub mod net;
pub mod pack;
pub mod pipeline;
pub mod plan;
pub mod pool;
pub mod proto;
pub mod server;
pub mod shard;
pub mod store;
pub mod tier;

#[cfg(feature = "dev")]
pub mod dev;
