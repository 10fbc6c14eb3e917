//! The gRPC edge: the `shardfeed.v1` service, its limits, listeners, health
//! and drain. It translates protobuf to the engine's types and errors to
//! statuses; it holds no plan, pipeline or cache logic.
//!
//! - [`service`]: request checks and translation, stream admission, the
//!   batch stream with stall accounting.
//! - [`status`]: every error a request can end with, and the one table that
//!   maps them to gRPC codes.
//! - [`listen`]: TCP and Unix listeners, the tonic server, graceful shutdown.
//! - `local`: [`LocalServer`], the in-process server of the demo, benchmarks
//!   and tests.
//! - [`authority`]: lets any gRPC client call over the Unix socket, whatever
//!   `:authority` it sends.
//! - [`client`]: a channel to a server, and the health check.

mod allow;
mod authority;
pub mod client;
mod delivery;
mod layout;
mod limits;
pub mod listen;
mod local;
mod mix;
pub mod pb;
mod request;
pub mod service;
pub mod shm;
pub mod status;
mod views;

pub use allow::rule_allows;
pub use client::{check_health, connect};
pub use limits::{
    DEFAULT_BATCH_SIZE, DEFAULT_MAX_STREAMS, DEFAULT_STREAM_WINDOW_BYTES, MAX_BATCH_BYTES,
    MAX_MESSAGE_BYTES,
};
pub use listen::{serve, ListenAddr, Listener, ServeError, DEFAULT_SHUTDOWN_GRACE};
pub use local::LocalServer;
pub use service::{Lifecycle, ServiceConfig, ShardfeedService};
pub use status::{status_code, ServiceError};
