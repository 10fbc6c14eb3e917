//! A stream's use of the decode pool: how much of each batch goes to it
//! (only the shortfall: the share rises while the trainer waits and falls
//! while local decode keeps ahead), which samples, and how the pool's
//! answers land in the batch.
//!
//! Which samples go where never shows in the batch: an answer is exactly
//! the pixels a local decode writes (the worker runs this build's decode on
//! the same bytes and key), and whatever the pool does not answer, or could
//! not decode, is decoded here. Only decoded deliveries without the
//! decoded-source tier use the pool: the tier's stored sources live on this
//! host's disk, and an encoded delivery already hands its share of decodes
//! to the trainer.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::batch::DecodedBatch;
use super::context::StreamCommon;
use super::encoded::Delivery;
use super::sample::EmittedSample;
use crate::metrics::pool as pool_metrics;
use crate::metrics::GaugeGuard;
use crate::pool::client::UnitAnswer;
use crate::pool::wire::{UnitOutput, UnitSample};
use crate::pool::{PoolClient, PoolShareSetting};

/// Waits on the client shorter than this (scheduling noise) count as none.
const SLACK_WAIT: Duration = Duration::from_millis(1);

/// The pool share's step per batch in `auto`, either way: from either end
/// to the middle in ten batches, then within a step of where it settles.
pub const SHARE_STEP: f64 = 0.05;

/// What the producer saw of the client while it handed on one batch.
#[derive(Debug, Clone, Copy)]
pub(super) struct ClientPace {
    /// How long the producer waited for the client (a full ready queue, or
    /// every ring slot lent).
    pub waited: Duration,
    /// Batches ready ahead of the client.
    pub ahead: usize,
    /// Whether the buffer between the two sides could have filled once: a
    /// stream starts empty, and an empty buffer then says nothing.
    pub primed: bool,
    /// Since the batch before was handed on (None for the first).
    pub interval: Option<Duration>,
}
/// Weight of the newest batch in the demand estimate.
const DEMAND_SMOOTHING: f64 = 0.2;

/// One unit's slots in the batch and the pool's answer (None: decode here).
pub(super) type UnitResult = (Vec<usize>, Option<UnitAnswer>);

/// No batch has finished since the share last looked.
const NO_BALANCE: i64 = i64::MIN;

/// The samples of one batch sent to the pool, in units.
pub(super) struct RemotePart {
    client: PoolClient,
    units: Vec<Vec<usize>>,
    balance: Arc<AtomicI64>,
}

impl RemotePart {
    /// Every slot of the part.
    pub fn slots(&self) -> Vec<usize> {
        self.units.iter().flatten().copied().collect()
    }

    /// How much later the pool's part of a batch finished than the local
    /// part (negative: sooner), for the share to balance the two.
    pub fn finished(&self, remote_late_by: i64) {
        self.balance
            .store(remote_late_by.max(NO_BALANCE + 1), Ordering::Relaxed);
    }

    /// Sends every unit at once; resolves with each unit's answer and when
    /// the last came.
    pub fn send(
        &self,
        output: UnitOutput,
        samples: &[EmittedSample],
    ) -> tokio::task::JoinHandle<(Vec<UnitResult>, Instant)> {
        let units: Vec<(Vec<usize>, Vec<UnitSample>)> = self
            .units
            .iter()
            .map(|slots| {
                let unit = slots
                    .iter()
                    .filter_map(|&slot| unit_sample(&samples[slot]))
                    .collect();
                (slots.clone(), unit)
            })
            .collect();
        let client = self.client.clone();
        tokio::spawn(async move {
            let answers = units
                .iter()
                .map(|(_, unit)| client.decode(output.clone(), unit));
            let answers = futures::future::join_all(answers).await;
            let answered = Instant::now();
            let results = units
                .into_iter()
                .zip(answers)
                .map(|((slots, _), answer)| (slots, answer))
                .collect();
            (results, answered)
        })
    }
}

/// A batch's decode that the decode pool may take part of (one output per
/// sample, or several views): what [`decode_split`] drives.
pub(super) trait SplitDecode: Send + 'static {
    /// Decodes here every sample without an outcome yet, but those
    /// `reserved` (the pool's).
    fn decode_rest(&mut self, reserved: &[bool]);
    /// Writes each sample the pool decoded into its place; one it failed,
    /// or a unit it never answered, stays for local decode.
    fn place_answers(&mut self, answers: Vec<UnitResult>);
    /// The batch, with failures substituted.
    fn finish(self) -> DecodedBatch;
}

/// Decodes a batch on the stream's cores, begun by `begin`. With `remote`,
/// its units leave first (asking for `output`), local cores decode the rest
/// meanwhile, then the answers are placed and whatever the pool did not
/// answer is decoded here; how much later either part finished feeds the
/// share.
pub(super) fn decode_split<W: SplitDecode>(
    cores: Arc<rayon::ThreadPool>,
    queued: GaugeGuard,
    remote: Option<(RemotePart, UnitOutput)>,
    samples: Vec<EmittedSample>,
    begin: impl FnOnce(Vec<EmittedSample>) -> W + Send + 'static,
) -> oneshot::Receiver<DecodedBatch> {
    let (tx, rx) = oneshot::channel();
    let Some((remote, output)) = remote else {
        cores.spawn(move || {
            let mut work = begin(samples);
            work.decode_rest(&[]);
            let batch = work.finish();
            drop(queued);
            let _ = tx.send(batch);
        });
        return rx;
    };
    let answers = remote.send(output, &samples);
    let started = Instant::now();
    let (local_tx, local_rx) = oneshot::channel();
    let mut reserved = vec![false; samples.len()];
    for slot in remote.slots() {
        reserved[slot] = true;
    }
    let local_cores = cores.clone();
    local_cores.spawn(move || {
        let mut work = begin(samples);
        work.decode_rest(&reserved);
        let _ = local_tx.send((work, Instant::now()));
    });
    tokio::spawn(async move {
        let (Ok((mut work, local_done)), answers) = (local_rx.await, answers.await) else {
            return;
        };
        // A unit task that panicked answered nothing: all decoded here.
        let (answers, remote_done) = answers.unwrap_or_else(|_| (Vec::new(), Instant::now()));
        let nanos = |at: Instant| at.duration_since(started).as_nanos() as i64;
        remote.finished(nanos(remote_done) - nanos(local_done));
        cores.spawn(move || {
            work.place_answers(answers);
            work.decode_rest(&[]);
            let batch = work.finish();
            drop(queued);
            let _ = tx.send(batch);
        });
    });
    rx
}

/// What the pool needs of a sample; None for one it has nothing to decode.
fn unit_sample(emitted: &EmittedSample) -> Option<UnitSample> {
    if emitted.sample.unreadable.is_some() {
        return None;
    }
    let (format, data) = emitted.sample.image.as_ref()?;
    Some(UnitSample {
        key: emitted.augment_key(),
        format: *format,
        data: data.clone(),
    })
}

/// The share of each batch one stream sends to the pool, and its part of
/// the host's demand signal. One per stream, owned by its dispatch.
pub(super) struct RemoteShare {
    client: PoolClient,
    setting: PoolShareSetting,
    fraction: f64,
    rank: String,
    metrics: crate::metrics::StreamMetrics,
    /// Nanoseconds the pool's part of the last finished batch came after
    /// the local part ([`NO_BALANCE`]: none finished since last looked).
    balance: Arc<AtomicI64>,
    /// This stream's samples/s the pool should supply, in the host's gauge.
    demand: f64,
}

impl RemoteShare {
    /// The stream's share, where it may use the pool at all.
    pub fn of(common: &StreamCommon, rank: u32) -> Option<Self> {
        let client = common.remote.clone()?;
        if common.delivery != Delivery::Decoded || common.tier.is_some() {
            return None;
        }
        let setting = client.config().share;
        Some(Self {
            fraction: match setting {
                PoolShareSetting::Fixed(share) => share,
                PoolShareSetting::Auto => client.settled_share(),
            },
            client,
            setting,
            rank: crate::metrics::rank_label(rank),
            metrics: common.metrics.clone(),
            balance: Arc::new(AtomicI64::new(NO_BALANCE)),
            demand: 0.0,
        })
    }

    /// The samples of the next batch to send: the last `share` of those
    /// with an image, in units of consecutive slots. None: decode all here.
    pub fn part(&self, samples: &[EmittedSample]) -> Option<RemotePart> {
        if self.fraction <= 0.0 || self.client.live_workers() == 0 {
            return None;
        }
        let decodable: Vec<usize> = (0..samples.len())
            .filter(|&slot| {
                let sample = &samples[slot].sample;
                sample.unreadable.is_none() && sample.image.is_some()
            })
            .collect();
        let count = ((samples.len() as f64 * self.fraction).round() as usize).min(decodable.len());
        if count == 0 {
            return None;
        }
        let unit_samples = self.client.config().unit_samples.max(1);
        let units = decodable[decodable.len() - count..]
            .chunks(unit_samples)
            .map(<[usize]>::to_vec)
            .collect();
        Some(RemotePart {
            client: self.client.clone(),
            units,
            balance: self.balance.clone(),
        })
    }

    /// After each batch handed on: in `auto`, the share falls while the
    /// producer waits on the client (local decode keeps ahead, the pool is
    /// not needed); while the client has nothing ahead (the trainer waits)
    /// it rises, unless the pool's part of the last batch came after the
    /// local part (then the pool is what the batch waits on, and the share
    /// falls). So it settles at the shortfall, and where the pool cannot
    /// cover it, where both parts of a batch finish together. Then the
    /// demand signal: the samples/s the trainer would take if it never
    /// waited, less what local decode gave.
    pub(super) fn tune(&mut self, pace: ClientPace, samples: usize) {
        let handed_share = self.fraction;
        let balance = self.balance.swap(NO_BALANCE, Ordering::Relaxed);
        if self.setting == PoolShareSetting::Auto {
            let pool_lags = balance != NO_BALANCE && balance > SLACK_WAIT.as_nanos() as i64;
            if pace.waited > SLACK_WAIT {
                self.fraction = (self.fraction - SHARE_STEP).max(0.0);
            } else if pace.primed && pace.ahead <= 1 && self.client.live_workers() > 0 {
                let step = if pool_lags { -SHARE_STEP } else { SHARE_STEP };
                self.fraction = (self.fraction + step).clamp(0.0, 1.0);
            }
            self.client.settle_share(self.fraction);
        }
        pool_metrics::share(&self.rank, self.fraction);
        let waited = self.metrics.take_consumer_wait();
        if let Some(interval) = pace.interval {
            let interval = interval.as_secs_f64();
            if interval > 0.0 {
                let busy = (interval - waited.as_secs_f64()).max(interval / 10.0);
                let wanted = samples as f64 / busy;
                let local = samples as f64 * (1.0 - handed_share) / interval;
                let gap = (wanted - local).max(0.0);
                let estimate = self.demand + DEMAND_SMOOTHING * (gap - self.demand);
                pool_metrics::demand_changed(estimate - self.demand);
                self.demand = estimate;
            }
        }
    }
}

impl Drop for RemoteShare {
    fn drop(&mut self) {
        pool_metrics::demand_changed(-self.demand);
    }
}
