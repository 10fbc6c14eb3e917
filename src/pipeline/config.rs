//! A stream pipeline's settings and their defaults (what each bounds is
//! the memory essay in the module's doc).

use crate::shard::{BadShardPolicy, DEFAULT_MAX_MEMBER_BYTES};
use crate::store::read::ReadConfig;

pub const DEFAULT_PREFETCH_SHARDS: usize = 2;
pub const DEFAULT_READER_QUEUE: usize = 64;
pub const DEFAULT_READY_BATCHES: usize = 2;
pub const DEFAULT_DECODE_AHEAD: usize = 2;
/// HTTP/2 flow-control windows sized for multi-megabyte messages: the
/// server's, and what its own clients ask for. A stream's batches in the
/// transport count against a tuned share's measurements (`dispatch`).
pub const DEFAULT_STREAM_WINDOW_BYTES: u32 = 16 << 20;

#[derive(Debug, Clone)]
pub struct PipelineConfig {
    pub read: ReadConfig,
    /// Shard readers (one per plan segment) started ahead of the ones the
    /// schedule is using.
    pub prefetch_shards: usize,
    /// Parsed samples queued per segment reader.
    pub reader_queue: usize,
    /// Decoded batches queued for the client.
    pub ready_batches: usize,
    /// Batches being decoded at once per stream.
    pub decode_ahead: usize,
    pub max_member_bytes: u64,
    pub on_bad_shard: BadShardPolicy,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            read: ReadConfig::default(),
            prefetch_shards: DEFAULT_PREFETCH_SHARDS,
            reader_queue: DEFAULT_READER_QUEUE,
            ready_batches: DEFAULT_READY_BATCHES,
            decode_ahead: DEFAULT_DECODE_AHEAD,
            max_member_bytes: DEFAULT_MAX_MEMBER_BYTES,
            on_bad_shard: BadShardPolicy::Fail,
        }
    }
}
