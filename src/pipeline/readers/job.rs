//! What a segment's reader is given and the interface every kind of
//! shard's reader implements.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::dataset::{Dataset, ShardIndex};
use crate::pipeline::error::PipelineError;
use crate::shard::{BadShardPolicy, RawSample, SampleLayout};
use crate::store::read::ReadConfig;

/// A sample with its number in the shard, or why the reading stopped.
pub(super) type SampleResult = Result<(u64, RawSample), PipelineError>;

/// Samples `[first, end)` of one shard to read: a planned segment.
pub(super) struct ReadJob {
    pub dataset: Arc<Dataset>,
    pub layout: Arc<SampleLayout>,
    pub shard: u32,
    pub first: u64,
    pub end: u64,
    pub read: ReadConfig,
    pub max_member: u64,
    pub on_bad_shard: BadShardPolicy,
    /// The stream's loose GETs in flight so far (see `objects.rs`).
    pub object_requests: Arc<AtomicUsize>,
}

/// How one kind of shard's planned segment becomes samples: the interface
/// each format's reader implements (`streamed.rs`, `row_groups.rs`,
/// `objects.rs`); `ReadJob::run` (`readers/mod.rs`) is the one place a shard's kind picks
/// its reader.
pub(super) trait SegmentReader {
    /// Whether damage ends the segment's reading, so that under
    /// `--on-bad-shard skip` the rest of it is substituted as a whole.
    const DAMAGE_ENDS_SEGMENT: bool;

    /// Sends samples `[*next, job.end)` in order, each with its number in
    /// the shard, advancing `*next` past each one sent (from where the rest
    /// is substituted when the reading fails).
    async fn read(
        &self,
        job: &ReadJob,
        index: &ShardIndex,
        tx: &mpsc::Sender<SampleResult>,
        next: &mut u64,
    ) -> Result<(), PipelineError>;
}
