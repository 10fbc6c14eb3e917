//! The decode pool: hosts whose own cores cannot decode as fast as their
//! trainers consume send the shortfall to pool workers, the same binary
//! run as `shardfeed pool-worker` (a Deployment behind a headless Service).
//!
//! - [`wire`]: the work unit and its answer, to and from the decode types;
//!   the build identity both sides must share.
//! - [`worker`]: the worker's service: bounded, authenticated, drained on
//!   SIGTERM; it decodes through the same [`crate::decode::decode_bounded`]
//!   a local stream uses and plans nothing.
//! - [`client`]: the sidecar's side: live workers (from the Service's DNS
//!   records), rendezvous placement, deadlines, hedging and re-issue.
//!
//! # Exactly once without a journal
//!
//! A sample's pixels are a pure function of its compressed bytes, the
//! output spec and its key (seed, epoch, sample), all of which the unit
//! carries, and a worker runs the decoder of the sidecar's own build (it
//! refuses any other). So a unit can be sent again, or to two workers at
//! once, and whichever answer comes first is the one a local decode would
//! have written; later answers are dropped. A unit no worker answers in
//! time, and every sample a worker could not decode, is decoded locally:
//! what a batch holds never depends on the pool.

pub mod client;
pub mod link;
mod transport;
pub mod wire;
pub mod worker;

pub use client::{PoolClient, PoolConfig, PoolShareSetting};
pub use transport::CONNECTION_LIMITS;
pub use worker::{serve_worker, WorkerConfig};

/// Batches a stream with a pool decodes at once (at least): the memory
/// formula's `decode_ahead` (docs/reference/memory.md) is this with a pool.
pub const POOL_DECODE_AHEAD: usize = 4;

/// The token file's contents, trimmed: a Kubernetes Secret mounted as a
/// file, or any file the operator writes.
pub fn read_token(path: &std::path::Path) -> std::io::Result<String> {
    let text = std::fs::read_to_string(path)?;
    let token = text.trim().to_string();
    if token.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} holds no token", path.display()),
        ));
    }
    Ok(token)
}
