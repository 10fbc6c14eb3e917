//! The `shardfeed.v1` messages and service (generated in `crate::proto`),
//! by the name the edge has always used for them.

pub use crate::proto::v1::*;
