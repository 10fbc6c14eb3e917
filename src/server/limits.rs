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
