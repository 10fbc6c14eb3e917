//! The server's limits, in one place.

pub const DEFAULT_BATCH_SIZE: u32 = 128;
pub const DEFAULT_MAX_STREAMS: usize = 64;
/// Largest batch accepted, in bytes; keeps one request from asking for
/// gigabytes of buffers.
pub const MAX_BATCH_BYTES: u64 = 1 << 30;
/// Outgoing messages: one batch plus metadata.
pub const MAX_MESSAGE_BYTES: usize = (MAX_BATCH_BYTES as usize) + (16 << 20);
pub use crate::pipeline::DEFAULT_STREAM_WINDOW_BYTES;
/// Connections carry several streams: their window is this many stream windows.
pub(super) const CONNECTION_WINDOWS_PER_STREAM: u32 = 4;

/// Every call's request (a stream's, Describe's, a decode report): whole
/// within 10 s, at most 1 MiB (the largest legitimate one, a mix of 16
/// sources with its weight log, is a few KiB), and 64 MiB across the
/// listeners' unfinished requests: the bytes that calls opened and never
/// finished can hold, whatever the connections and streams.
pub const REQUESTS: crate::net::requests::RequestBounds = crate::net::requests::RequestBounds {
    deadline: std::time::Duration::from_secs(10),
    max_body_bytes: 1 << 20,
    in_flight_bytes: 64 << 20,
};
