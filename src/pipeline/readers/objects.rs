//! The reader of a group of loose objects: one GET per sample, several in
//! flight, handed on in order.

use std::sync::atomic::{AtomicUsize, Ordering};

use futures::stream::FuturesOrdered;
use futures::StreamExt;
use tokio::sync::mpsc;

use super::job::{ReadJob, SampleResult, SegmentReader};
use crate::dataset::ShardIndex;
use crate::metrics;
use crate::pipeline::error::PipelineError;
use crate::shard::{BadShardPolicy, RawSample};
use crate::store::read::read_object;
use crate::store::StoreError;

/// A virtual group of loose objects ([`crate::dataset::ShardKind::Objects`]).
pub(super) struct Objects;

impl SegmentReader for Objects {
    /// Each object is substituted on its own (below): the others are whole.
    const DAMAGE_ENDS_SEGMENT: bool = false;

    /// Sends the objects `[first, end)` of a loose group in order, with
    /// `object_requests_in_flight` GETs at a time to hide each one's
    /// first-byte latency. An object gone or changed since it was indexed is
    /// a stale index: the stream ends, or under `--on-bad-shard skip` that
    /// one sample is substituted.
    async fn read(
        &self,
        job: &ReadJob,
        index: &ShardIndex,
        tx: &mpsc::Sender<SampleResult>,
        next: &mut u64,
    ) -> Result<(), PipelineError> {
        let store = job.dataset.store.clone();
        let fields = job.layout.fields.len();
        let fetches = (*next..job.end).map(|i| {
            let at = i as usize;
            let object = job.dataset.object(index, at);
            let key = index.keys[at].clone();
            let range = index.starts[at]..index.ends[at];
            let label = index.labels.get(at).copied().filter(|l| *l >= 0);
            let (store, max_member, policy) = (store.clone(), job.max_member, job.on_bad_shard);
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
        let mean_bytes = job.dataset.index.bytes() / job.dataset.index.samples().max(1);
        let ceiling = job.read.object_requests_ceiling(mean_bytes);
        let mut window = ObjectWindow::new(&job.object_requests, ceiling);
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
            *next += 1;
        }
    }
}

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
