//! The augmentation on the wire, both ways: the one module below the server
//! that names proto. A request's `Augmentation` and a pool unit's carry the
//! same message, and a batch's `CropBox` reports each sample's decisions
//! to the client and back from a decode worker, so one translation serves
//! the service's and the pool's messages: the server and the pool's own
//! wire (`crate::pool::wire`) call it; the crop, the op rows, the pipeline
//! and the engine take the library's types only.
//!
//! An op's row here is its [`OpWire`] (`rows.rs`, one impl per op); the
//! rows' translation (`spec.rs`) is built from the ops table's own list, so
//! the compiler asks every row's type for one.

mod rows;
mod spec;

// The ops' own tests round-trip their rows through these.
#[cfg(test)]
pub use rows::{KernelWire, OpWire};
