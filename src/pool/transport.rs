//! The HTTP/2 bounds of pool connections, which both ends (the sidecar's
//! links and the worker's listener) are built with.

/// HTTP/2 windows of pool connections, both ways: a unit's bytes and its
/// answer (about a megabyte each at 8 samples) in flight without waiting.
pub(super) const STREAM_WINDOW_BYTES: u32 = 8 << 20;
pub(super) const CONNECTION_WINDOW_BYTES: u32 = 32 << 20;
/// HTTP/2's largest frame, for answers (the sidecar's links take them): a
/// sample's pixels in 10 frames, not 10 per 16 KiB.
pub(super) const MAX_FRAME_BYTES: u32 = (1 << 24) - 1;
/// The worker takes HTTP/2's smallest frames: h2 buffers a frame whole
/// before anyone reads its headers, and the token is in the headers, so a
/// larger bound let a stranger make the worker buffer 16 MiB a connection
/// before being refused. A unit's compressed images (about 1 MiB) cost 64
/// frames at this size, a few microseconds.
pub(super) const WORKER_MAX_FRAME_BYTES: u32 = 16 << 10;
/// A worker's HTTP/2 bounds per connection: streams beyond its admitted
/// units (2 x `--max-units`) plus health checks only queue in the client;
/// headers are a token, a build name and gRPC's own; a connection whose
/// peer makes the worker reset this many streams (malformed frames), or
/// resets this many itself before they are accepted, is closed.
pub(super) const WORKER_EXTRA_STREAMS: u32 = 8;
/// Connections a worker holds, and how long one may stay open with no
/// call: each sidecar keeps one per worker, so this is the hosts a worker
/// serves (hundreds of GPU hosts, with room); a sidecar whose connection
/// closed for idleness reconnects on its next unit.
pub const CONNECTION_LIMITS: crate::net::connections::ConnectionLimits =
    crate::net::connections::ConnectionLimits {
        max_connections: 4096,
        idle: std::time::Duration::from_secs(300),
    };
pub(super) const MAX_HEADER_LIST_BYTES: u32 = 16 << 10;
pub(super) const MAX_LOCAL_ERROR_RESETS: usize = 256;
pub(super) const MAX_PENDING_ACCEPT_RESETS: usize = 64;
