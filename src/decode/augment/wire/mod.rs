//! The augmentation on the wire, both ways: the one module below the server
//! that names proto. A request's `Augmentation` and a pool unit's carry the
//! same message, and a batch's `CropBox` reports each sample's decisions
//! to the client and back from a decode worker, so one translation serves
//! the service's and the pool's messages: the server and the pool's own
//! wire (`crate::pool::wire`) call it; the crop, the op rows, the pipeline
//! and the engine take the library's types only.
//!
//! An op's row here is its [`OpWire`] (`rows.rs`, one impl per op) and its
//! line in `spec.rs`'s table of rows, which the compiler holds to the ops
//! table's.

mod rows;
mod spec;

// The ops' own tests round-trip their rows through these.
#[cfg(test)]
pub use rows::{KernelWire, OpWire};
