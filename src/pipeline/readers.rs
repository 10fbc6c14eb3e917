//! The shard readers of a stream: one task per planned byte range of a
//! shard (or group of loose objects), started in order a window ahead, each
//! sending its samples, in order, into a bounded channel.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::*;
use crate::dataset::ShardIndex;
use crate::plan::{RankPlan, SampleRef};
use crate::shard::{RawSample, SampleSplitter, ShardFormat};
use crate::store::read::{read_object, read_parts};

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
struct ReadJob {
    dataset: Arc<Dataset>,
    layout: Arc<SampleLayout>,
    shard: u32,
    first: u64,
    end: u64,
    read: ReadConfig,
    max_member: u64,
    on_bad_shard: BadShardPolicy,
}

impl ReadJob {
    async fn run(self, tx: &mpsc::Sender<SampleResult>) -> Result<(), PipelineError> {
        let index = self.dataset.shard_index(self.shard).await?;
        if self.dataset.is_loose() {
            return self.read_objects(&index, tx).await;
        }
        let mut next = self.first;
        let result = self.read(&index, tx, &mut next).await;
        // A field over the request's cap is the request's problem, not damage.
        let damaged = match &result {
            Err(PipelineError::Shard { source, .. }) => {
                !matches!(source, ShardError::FieldTooLarge { .. })
            }
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
        let mut samples =
            futures::stream::iter(fetches).buffered(self.read.object_requests_in_flight.max(1));
        while let Some(sample) = samples.next().await {
            if tx.send(Ok(sample?)).await.is_err() {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Sends samples from `*next` on, advancing it past each one sent.
    async fn read(
        &self,
        index: &ShardIndex,
        tx: &mpsc::Sender<SampleResult>,
        next: &mut u64,
    ) -> Result<(), PipelineError> {
        let entry = &self.dataset.index.shards[self.shard as usize];
        let key = self.dataset.shard_key(self.shard);
        let location = self.dataset.store.location(&key);
        let range = index.starts[self.first as usize]..index.ends[self.end as usize - 1];
        let format = ShardFormat::from_name(&entry.name).unwrap_or(ShardFormat::Tar);
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
