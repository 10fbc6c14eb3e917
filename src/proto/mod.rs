//! The wire contract, generated from `proto/` at build time: the service's
//! messages (`v1`) and the decode pool's (`pool`), which carries the
//! service's `Augmentation` and `CropBox` as they are, so both are read by
//! one table (`decode::augment::wire`). Generated code only, and the codec
//! the service's stubs are built with.

pub mod codec;

/// `shardfeed.v1`: the service trainers call.
pub mod v1 {
    tonic::include_proto!("shardfeed.v1");
}

/// `shardfeed.pool.v1`: a sidecar's work units to pool workers. Nested as
/// its package is, so its generated references to `shardfeed.v1` resolve.
pub mod pool {
    pub mod v1 {
        tonic::include_proto!("shardfeed.pool.v1");
    }
}
