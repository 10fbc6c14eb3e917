//! Development tooling, behind the `dev` cargo feature (on by default, off
//! in the container image): the in-memory S3-compatible server with scripted
//! faults, synthetic photo datasets, the demo and the benchmarks. The
//! sidecar never links any of it.

pub mod bench;
pub mod cache_scale;
pub mod delivery_bench;
pub mod demo;
pub mod fuzz;
pub mod kernel;
pub mod mix_bench;
pub mod parquet_bench;
pub mod parquet_files;
pub mod pool_bench;
pub mod pool_model;
pub mod pool_sim;
pub mod s3mem;
pub mod shuffle_quality;
pub mod synthetic;
pub mod tier;
pub mod tier_stream;
pub mod transport;
