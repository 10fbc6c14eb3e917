//! The `shardfeed.v1` messages and service, generated from `proto/` at build
//! time.

tonic::include_proto!("shardfeed.v1");
