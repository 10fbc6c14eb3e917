//! The shard readers of a stream: one task per planned byte range of a
//! shard (or group of loose objects), started in order a window ahead, each
//! sending its samples, in order, into a bounded channel.

mod row_groups;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::stream::FuturesOrdered;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::config::PipelineConfig;
use super::context::Source;
use super::error::PipelineError;
use crate::dataset::{Dataset, ShardIndex, ShardKind};
use crate::metrics;
use crate::plan::{RankPlan, SampleRef};
use crate::shard::splitter::SampleSplitter;
use crate::shard::{BadShardPolicy, RawSample, SampleLayout, ShardError, ShardFormat};
use crate::store::read::{read_object, read_parts, ReadConfig};
use crate::store::StoreError;

type SampleResult = Result<(u64, RawSample), PipelineError>;

/// The shard readers of one rank plan, one per segment (a byte range of a
/// shard), started in order, a window ahead.
pub(super) struct ShardReaders<'a> {
    config: &'a PipelineConfig,
    source: &'a Source,
    plan: &'a RankPlan,
    starts: Vec<Option<u64>>,
    receivers: HashMap<u32, mpsc::Receiver<SampleResult>>,
    /// Aborts every reader when the stream ends or is dropped.
    tasks: JoinSet<()>,
    next_to_spawn: u32,
    /// Loose GETs in flight, as the stream's readers sized them so far.
    object_requests: Arc<AtomicUsize>,
}

impl<'a> ShardReaders<'a> {
    pub(super) fn new(
        config: &'a PipelineConfig,
        source: &'a Source,
        plan: &'a RankPlan,
        starts: Vec<Option<u64>>,
    ) -> Self {
        Self {
            config,
            source,
            plan,
            starts,
            receivers: HashMap::new(),
            tasks: JoinSet::new(),
            next_to_spawn: 0,
            object_requests: Arc::new(AtomicUsize::new(config.read.object_requests_in_flight)),
        }
    }

    fn ensure_spawned(&mut self, segment: u32) {
        let last = (segment as usize + self.config.prefetch_shards)
            .min(self.plan.segments.len().saturating_sub(1)) as u32;
        while self.next_to_spawn <= last {
            let index = self.next_to_spawn;
            self.next_to_spawn += 1;
            let Some(first) = self.starts[index as usize] else {
                continue;
            };
            let segment = self.plan.segments[index as usize];
            let (tx, rx) = mpsc::channel(self.config.reader_queue.max(1));
            self.receivers.insert(index, rx);
            if let Some(hints) = &self.source.cache_hints {
                let location = self
                    .source
                    .dataset
                    .store
                    .location(&self.source.dataset.shard_key(segment.shard));
                for follower in &hints.followers {
                    follower.reached(&hints.stream, &location);
                }
            }
            let job = ReadJob {
                dataset: self.source.dataset.clone(),
                layout: self.source.layout.clone(),
                shard: segment.shard,
                first,
                end: segment.end,
                read: self.config.read.clone(),
                max_member: self.config.max_member_bytes,
                on_bad_shard: self.config.on_bad_shard,
                object_requests: self.object_requests.clone(),
            };
            self.tasks.spawn(async move {
                if let Err(error) = job.run(&tx).await {
                    let _ = tx.send(Err(error)).await;
                }
            });
        }
    }

    /// The bytes of `sample`, skipping samples its reader had to read past.
    pub(super) async fn take(&mut self, sample: SampleRef) -> Result<RawSample, PipelineError> {
        self.ensure_spawned(sample.segment);
        let end = self.plan.segments[sample.segment as usize].end;
        let receiver = self.receivers.get_mut(&sample.segment).ok_or_else(|| {
            PipelineError::Internal(format!("no reader for segment {}", sample.segment))
        })?;
        loop {
            match receiver.recv().await {
                Some(Ok((index, raw))) if index == sample.index => {
                    if index + 1 == end {
                        self.receivers.remove(&sample.segment);
                    }
                    return Ok(raw);
                }
                // Emitted before the resume point: parsed, never decoded.
                Some(Ok((index, _))) if index < sample.index => continue,
                Some(Ok((index, _))) => {
                    return Err(PipelineError::Internal(format!(
                        "reader passed sample {} (at {index})",
                        sample.index
                    )))
                }
                Some(Err(error)) => return Err(error),
                None => {
                    return Err(PipelineError::Internal(format!(
                        "reader for segment {} ended before sample {}",
                        sample.segment, sample.index
                    )))
                }
            }
        }
    }
}

/// Reads samples `[first, end)` of one shard: one sequential byte range.
/// The GETs in flight of a loose reader. Sized (no flag): from the
/// stream's count so far, a quarter more each time the reader hands on a
/// sample to an empty queue after its first window's worth, up to the
/// ceiling. An empty queue then means the stream takes samples as fast as
/// they arrive: the GETs in flight do not cover their latency at the
/// stream's pace (Little's law: in flight = rate x latency). A queue that
/// stays non-empty means the decode is the slower side, and the count
/// holds. The count is kept per stream, so each of its readers starts
/// where the last one got.
struct ObjectWindow<'a> {
    shared: &'a AtomicUsize,
    ceiling: usize,
    limit: usize,
    sent: usize,
}

impl<'a> ObjectWindow<'a> {
    fn new(shared: &'a AtomicUsize, ceiling: usize) -> Self {
        let limit = shared.load(Ordering::Relaxed).clamp(1, ceiling.max(1));
        Self {
            shared,
            ceiling,
            limit,
            sent: 0,
        }
    }

    fn limit(&self) -> usize {
        self.limit
    }

    /// One sample about to be handed on; `drained`: its queue was empty.
    fn sent(&mut self, drained: bool) {
        self.sent += 1;
        if drained && self.sent > self.limit && self.limit < self.ceiling {
            self.limit = (self.limit + self.limit.div_ceil(4)).min(self.ceiling);
            self.sent = 0;
            self.shared.fetch_max(self.limit, Ordering::Relaxed);
            tracing::debug!(
                in_flight = self.limit,
                ceiling = self.ceiling,
                "loose reads: more GETs in flight"
            );
        }
    }
}

struct ReadJob {
    dataset: Arc<Dataset>,
    layout: Arc<SampleLayout>,
    shard: u32,
    first: u64,
    end: u64,
    read: ReadConfig,
    max_member: u64,
    on_bad_shard: BadShardPolicy,
    /// The stream's loose GETs in flight so far (see [`ObjectWindow`]).
    object_requests: Arc<AtomicUsize>,
}

impl ReadJob {
    async fn run(self, tx: &mpsc::Sender<SampleResult>) -> Result<(), PipelineError> {
        let index = self.dataset.shard_index(self.shard).await?;
        let mut next = self.first;
        // Each kind of shard's reader (`dataset::ShardKind` names them).
        let result = match &self.dataset.index.shards[self.shard as usize].kind {
            ShardKind::Objects { .. } => return self.read_objects(&index, tx).await,
            ShardKind::RowGroup(_) => self.read_row_group(tx, &mut next).await,
            &ShardKind::Streamed(format) => self.read(format, &index, tx, &mut next).await,
        };
        // A field over the request's cap, or a Parquet file whose columns
        // are not what the request reads, is not damage.
        let damaged = match &result {
            Err(PipelineError::Shard { source, .. }) => match source {
                ShardError::FieldTooLarge { .. } => false,
                ShardError::Parquet(error) => !error.is_precondition(),
                _ => true,
            },
            Err(PipelineError::StaleIndex { .. })
            | Err(PipelineError::Store(StoreError::Truncated { .. })) => true,
            _ => false,
        };
        if !(damaged && self.on_bad_shard == BadShardPolicy::Skip) {
            return result;
        }
        let Err(error) = result else { return Ok(()) };
        // Keep every rank's counts: the rest of the range becomes
        // placeholders that the decode stage substitutes.
        metrics::bad_shard();
        tracing::warn!(
            %error,
            substituted = self.end - next,
            "skipping the rest of a damaged shard (--on-bad-shard skip)"
        );
        let why = error.to_string();
        while next < self.end {
            let placeholder = RawSample::unreadable(index.keys[next as usize].clone(), why.clone());
            if tx.send(Ok((next, placeholder))).await.is_err() {
                break;
            }
            next += 1;
        }
        Ok(())
    }

    /// Sends the objects `[first, end)` of a loose group in order, with
    /// `object_requests_in_flight` GETs at a time to hide each one's
    /// first-byte latency. An object gone or changed since it was indexed is
    /// a stale index: the stream ends, or under `--on-bad-shard skip` that
    /// one sample is substituted.
    async fn read_objects(
        &self,
        index: &ShardIndex,
        tx: &mpsc::Sender<SampleResult>,
    ) -> Result<(), PipelineError> {
        let store = self.dataset.store.clone();
        let fields = self.layout.fields.len();
        let fetches = (self.first..self.end).map(|i| {
            let at = i as usize;
            let object = self.dataset.object(index, at);
            let key = index.keys[at].clone();
            let range = index.starts[at]..index.ends[at];
            let label = index.labels.get(at).copied().filter(|l| *l >= 0);
            let (store, max_member, policy) = (store.clone(), self.max_member, self.on_bad_shard);
            async move {
                if object.size > max_member {
                    return Ok((i, crate::shard::oversized_object(key, range, max_member)));
                }
                let _in_flight = metrics::GaugeGuard::new(metrics::PARTS_IN_FLIGHT, 1.0);
                match read_object(store.as_ref(), &object).await {
                    Ok(bytes) => Ok((
                        i,
                        crate::shard::object_sample(key, range, label, bytes, fields),
                    )),
                    Err(error @ (StoreError::NotFound { .. } | StoreError::Changed { .. }))
                        if policy == BadShardPolicy::Skip =>
                    {
                        tracing::warn!(
                            %error,
                            "an indexed object is gone or changed; substituting it \
                             (--on-bad-shard skip)"
                        );
                        Ok((i, RawSample::unreadable(key, error.to_string())))
                    }
                    Err(StoreError::NotFound { location, .. }) => {
                        Err(PipelineError::ObjectGone { location })
                    }
                    Err(error) => Err(PipelineError::Store(error)),
                }
            }
        });
        let mean_bytes = self.dataset.index.bytes() / self.dataset.index.samples().max(1);
        let ceiling = self.read.object_requests_ceiling(mean_bytes);
        let mut window = ObjectWindow::new(&self.object_requests, ceiling);
        let mut fetches = fetches.into_iter();
        let mut pending = FuturesOrdered::new();
        loop {
            while pending.len() < window.limit() {
                match fetches.next() {
                    Some(fetch) => pending.push_back(fetch),
                    None => break,
                }
            }
            let Some(sample) = pending.next().await else {
                return Ok(());
            };
            window.sent(tx.capacity() == tx.max_capacity());
            if tx.send(Ok(sample?)).await.is_err() {
                return Ok(());
            }
        }
    }

    /// Sends samples from `*next` on, advancing it past each one sent.
    async fn read(
        &self,
        format: ShardFormat,
        index: &ShardIndex,
        tx: &mpsc::Sender<SampleResult>,
        next: &mut u64,
    ) -> Result<(), PipelineError> {
        let entry = &self.dataset.index.shards[self.shard as usize];
        let key = self.dataset.shard_key(self.shard);
        let location = self.dataset.store.location(&key);
        let range = index.starts[self.first as usize]..index.ends[self.end as usize - 1];
        let mut splitter = SampleSplitter::for_format(
            format,
            range.start,
            self.first,
            self.max_member,
            self.layout.clone(),
        );
        let mut parts = std::pin::pin!(read_parts(
            self.dataset.store.clone(),
            key,
            range,
            entry.etag.clone(),
            &self.read,
        ));
        let shard_error = |source| PipelineError::Shard {
            location: location.clone(),
            source,
        };
        let mut finished = false;
        loop {
            let sample = if finished {
                splitter.finish().map_err(shard_error)?
            } else {
                match splitter.next_sample().map_err(shard_error)? {
                    Some(sample) => Some(sample),
                    None => {
                        match parts.next().await {
                            Some(part) => splitter.push(&part?.1),
                            None => finished = true,
                        }
                        continue;
                    }
                }
            };
            let Some(sample) = sample else { break };
            if *next >= self.end {
                break;
            }
            let expected = &index.keys[*next as usize];
            if *expected != sample.key {
                return Err(PipelineError::StaleIndex {
                    location,
                    index: *next,
                    expected: expected.clone(),
                    found: sample.key,
                });
            }
            if tx.send(Ok((*next, sample))).await.is_err() {
                return Ok(());
            }
            *next += 1;
        }
        if *next < self.end {
            return Err(PipelineError::StaleIndex {
                location,
                index: *next,
                expected: index.keys[*next as usize].clone(),
                found: "<end of range>".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::read::ReadConfig;

    #[test]
    fn a_drained_reader_grows_its_window_to_the_ceiling_and_a_full_one_holds() {
        let shared = AtomicUsize::new(16);
        let mut window = ObjectWindow::new(&shared, 40);
        for _ in 0..100 {
            window.sent(false);
        }
        assert_eq!(
            window.limit(),
            16,
            "the consumer is behind: the count holds"
        );
        // Drained, but only once a window's worth went by: 16 sends, then 20.
        let mut window = ObjectWindow::new(&shared, 40);
        for _ in 0..16 {
            window.sent(true);
        }
        assert_eq!(window.limit(), 16);
        window.sent(true);
        assert_eq!(window.limit(), 20);
        for _ in 0..1000 {
            window.sent(true);
        }
        assert_eq!(window.limit(), 40, "at most the ceiling");
        assert_eq!(shared.load(Ordering::Relaxed), 40);
        // The stream's next reader starts where this one got.
        assert_eq!(ObjectWindow::new(&shared, 64).limit(), 40);
        assert_eq!(ObjectWindow::new(&shared, 8).limit(), 8);
    }

    #[test]
    fn the_ceiling_is_the_flag_or_what_the_bytes_allow() {
        let sized = ReadConfig::default();
        assert_eq!(sized.object_requests_ceiling(110_000), 128);
        assert_eq!(sized.object_requests_ceiling(1 << 20), 32);
        assert_eq!(
            sized.object_requests_ceiling(8 << 20),
            16,
            "never below the start"
        );
        let flag = ReadConfig {
            object_requests_in_flight: 24,
            object_requests_sized: false,
            ..ReadConfig::default()
        };
        assert_eq!(flag.object_requests_ceiling(110_000), 24);
    }
}
