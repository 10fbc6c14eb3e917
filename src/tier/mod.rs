//! The decoded-source tier, the whole feature: each image brought once to a
//! stored source form and kept on the host's local disk, so later epochs
//! crop and resize from it instead of decoding the JPEG again.
//!
//! - [`output`]: a sample's output defined from its stored source (a miss
//!   derives the source and crops from it exactly as a hit does, so a batch
//!   is the same bytes whatever the tier holds), and what that needs of a
//!   store of sources (`SourceStore`, got and put by one `SourceKey`).
//! - [`records`]: that store, `DecodedCache`: one record per sample on
//!   local disk, their index in memory, eviction by the streams' plans.
//! - [`fill`]: filling it off the critical path, on idle-priority threads,
//!   its queue bounded in memory and spilled to unlinked files.
//! - [`host`]: the one handle the engine holds (`HostTier`): the store once
//!   open, the fill started with the first stream, the default form.
//!
//! What stands outside: the source forms themselves (`decode::source`,
//! which the pool and benchmarks use too), the engine's calls on its
//! `HostTier` (`engine/open.rs`; `engine/warm.rs` asks whether it is open),
//! and the one call a batch's assembly makes (`TierRequest::sample_output`,
//! from `pipeline/assemble.rs`).

pub mod fill;
pub mod host;
pub mod output;
pub mod records;
