//! A batch's way from emitted samples to the ready queue: decoded on the
//! pool straight into its buffer (or ring slot), failures substituted, sent
//! in order with at most `decode_ahead` batches decoding.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::stream::FuturesOrdered;
use futures::StreamExt;
use rayon::prelude::*;
use tokio::sync::{mpsc, oneshot};

use super::buffers::BufferPool;
use super::encoded::{self, Delivery, Placement, ServerShare};
use super::{
    shm, substitute_source, BatchImages, DecodedBatch, PipelineError, SharedTarget, StreamContext,
    Substitution,
};
use crate::dataset::Dataset;
use crate::decode::{self, CropBox, SampleKey};
use crate::metrics;
use crate::shard::{Label, RawSample};

/// Where emitted samples come from, and what keys their augmentation: one
/// per stream, or per part of a source of a mixed stream.
#[derive(Debug)]
pub(super) struct SampleOrigin {
    pub dataset: Arc<Dataset>,
    /// With `epoch`, keys every sample's augmentation.
    pub seed: u64,
    /// The stream's epoch, or the source-epoch in a mixed stream.
    pub epoch: u64,
    pub label_offset: i64,
    /// The source's index in a mixed stream (0 otherwise).
    pub source: u32,
}

/// A sample leaving the shuffle buffer, on its way to the decoder.
pub(super) struct EmittedSample {
    pub shard: u32,
    /// A repeat that pads the epoch.
    pub padding: bool,
    pub origin: Arc<SampleOrigin>,
    pub sample: RawSample,
}

/// A sample's versioned identity for the decoded-source tier: its shard's
/// location and version (ETag, or a loose group's digest of its members'
/// ETags) and its key, so a changed object is derived anew. `None` (not
/// kept) when the shard has no version to tell a change by.
fn tier_sample<'a>(
    dataset: &'a Dataset,
    location: &'a str,
    emitted: &'a EmittedSample,
) -> Option<decode::tier::SampleVersion<'a>> {
    let shard = &dataset.index.shards[emitted.shard as usize];
    let version = shard.etag.as_ref().or(shard.digest.as_ref())?;
    Some(decode::tier::SampleVersion {
        location,
        version,
        size: shard.size,
        key: &emitted.sample.key,
    })
}

/// Batches of one stream on their way out: decoding (at most
/// `decode_ahead`), then sent in order to the ready queue.
pub(super) struct BatchDispatch<'a> {
    context: &'a StreamContext,
    ready: ReadySink<'a>,
    decoding: FuturesOrdered<oneshot::Receiver<DecodedBatch>>,
    buffers: BufferPool,
    next_index: u64,
}

/// The ready queue, its gauge, and the tuned share of an encoded delivery
/// with the time the producer waited on the client for the batch at hand.
struct ReadySink<'a> {
    tx: &'a mpsc::Sender<Result<DecodedBatch, PipelineError>>,
    gauge: ::metrics::Gauge,
    share: Option<Arc<ServerShare>>,
    client_wait_ns: AtomicU64,
    /// The stream's shared-memory ring: its lent slots are the batches
    /// ahead of the client (gRPC drains the ready queue eagerly when
    /// messages carry only a slot's descriptor).
    ring: Option<Arc<super::shm::Ring>>,
    /// Batches handed on so far: until the buffer between the two sides
    /// could have filled once, an empty one says nothing about the client.
    handed: AtomicU64,
}

/// Waits on the client shorter than this (scheduling noise) count as none.
const SLACK_WAIT: std::time::Duration = std::time::Duration::from_millis(1);

impl ReadySink<'_> {
    fn waited_on_client(&self, since: Instant) {
        let waited = since.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        self.client_wait_ns.fetch_add(waited, Ordering::Relaxed);
    }

    /// After each batch handed on: a producer that waited on the client
    /// (ready queue full, every ring slot lent) has room, so the server
    /// takes decodes back; one with nothing ahead of the client but the
    /// batch just handed on (and, with a ring, the one the client holds
    /// while it waits for the next) is what the client waits on, so decodes
    /// move to the client (once that buffer could have filled: a stream
    /// starts empty). In between, the buffer is neither full nor empty:
    /// the share holds. It settles where the server just keeps up.
    fn tune_share(&self) {
        let waited = self.client_wait_ns.swap(0, Ordering::Relaxed);
        let Some(share) = &self.share else {
            return;
        };
        let (ahead, buffer) = match &self.ring {
            // Less the one the client holds while it waits for the next.
            Some(ring) => (ring.lent().saturating_sub(1), ring.slot_count()),
            None => (
                self.tx.max_capacity() - self.tx.capacity(),
                self.tx.max_capacity(),
            ),
        };
        let primed = self.handed.fetch_add(1, Ordering::Relaxed) >= buffer as u64;
        if waited > SLACK_WAIT.as_nanos() as u64 {
            share.server_waited();
        } else if primed && ahead <= 1 {
            share.server_behind();
        }
        tracing::trace!(
            waited_ms = waited as f64 / 1e6,
            ahead,
            share = share.get(),
            "tuned the server's decode share"
        );
    }
}

impl<'a> BatchDispatch<'a> {
    pub fn new(
        context: &'a StreamContext,
        tx: &'a mpsc::Sender<Result<DecodedBatch, PipelineError>>,
        first_index: u64,
        rank: u32,
    ) -> Self {
        let share = match &context.delivery {
            Delivery::Encoded(share) if share.is_tuned() => Some(share.clone()),
            _ => None,
        };
        Self {
            context,
            ready: ReadySink {
                tx,
                // Per-stream series would be unbounded; the stream label is its rank.
                gauge: ::metrics::gauge!(metrics::READY_BATCHES, "rank" => metrics::rank_label(rank)),
                share,
                client_wait_ns: AtomicU64::new(0),
                ring: context.shared.as_ref().map(|shared| shared.ring.clone()),
                handed: AtomicU64::new(0),
            },
            decoding: FuturesOrdered::new(),
            // Batches alive at once: decoding, queued, and one being encoded.
            buffers: BufferPool::new(
                context.config.decode_ahead + context.config.ready_batches + 1,
            ),
            next_index: first_index,
        }
    }

    /// Starts decoding a batch of `samples`. `Ok(false)`: the client went away.
    pub async fn submit(&mut self, samples: Vec<EmittedSample>) -> Result<bool, PipelineError> {
        // A shared ring holds the producer back until the client has
        // returned a slot.
        let target = match &self.context.shared {
            Some(shared) => {
                match acquire_sending_decoded(shared, &mut self.decoding, &self.ready).await? {
                    Some(lease) => Some(lease),
                    None => return Ok(false),
                }
            }
            None => None,
        };
        self.decoding.push_back(decode_batch(
            self.context,
            &self.buffers,
            &self.context.metrics,
            samples,
            self.next_index,
            target,
        ));
        self.next_index += 1;
        while self.decoding.len() >= self.context.config.decode_ahead.max(1) {
            if !send_next(&mut self.decoding, &self.ready).await? {
                return Ok(false);
            }
        }
        self.ready.tune_share();
        Ok(true)
    }

    /// Sends every batch still decoding.
    pub async fn finish(mut self) -> Result<(), PipelineError> {
        while !self.decoding.is_empty() {
            if !send_next(&mut self.decoding, &self.ready).await? {
                return Ok(());
            }
        }
        Ok(())
    }
}

/// The batch's extra fields, field by field, in slot order; a substituted
/// slot takes its source's, like its image and label.
fn batch_fields(
    sample_fields: &[&[Option<Bytes>]],
    substituted: &[Substitution],
) -> Vec<Vec<Option<Bytes>>> {
    let count = sample_fields.iter().map(|f| f.len()).max().unwrap_or(0);
    let mut fields: Vec<Vec<Option<Bytes>>> = (0..count)
        .map(|field| {
            sample_fields
                .iter()
                .map(|f| f.get(field).cloned().flatten())
                .collect()
        })
        .collect();
    for substitution in substituted {
        for values in &mut fields {
            values[substitution.slot as usize] = substitution
                .source
                .and_then(|from| values[from as usize].clone());
        }
    }
    fields
}

/// Replaces every failed slot by a good sample of the same batch (image
/// and label), so training never sees a blank image with a class; counts
/// and logs each failure with its shard and key. `copy_image(slot, from)`
/// puts the image of slot `from` in `slot`, or zeros when `from` is None.
fn substitute_failures(
    failures: &[Option<(&'static str, String)>],
    samples: &[EmittedSample],
    labels: &mut [i64],
    crops: &mut [CropBox],
    mut copy_image: impl FnMut(usize, Option<usize>),
) -> Vec<Substitution> {
    let good: Vec<u32> = (0..failures.len() as u32)
        .filter(|&slot| failures[slot as usize].is_none())
        .collect();
    let mut substituted = Vec::new();
    for (slot, failure) in failures.iter().enumerate() {
        let Some((reason, message)) = failure else {
            continue;
        };
        let emitted = &samples[slot];
        metrics::substituted(reason);
        tracing::warn!(
            shard = %emitted.origin.dataset.shard_key(emitted.shard),
            key = %emitted.sample.key,
            error = %message,
            "substituted a sample that could not be decoded"
        );
        let source = substitute_source(&emitted.sample.key, &good);
        copy_image(slot, source.map(|from| from as usize));
        match source {
            Some(from) => {
                labels[slot] = labels[from as usize];
                crops[slot] = crops[from as usize];
            }
            None => {
                labels[slot] = -1;
                crops[slot] = CropBox::default();
            }
        }
        substituted.push(Substitution {
            slot: slot as u32,
            reason: message.clone(),
            source,
        });
    }
    substituted
}

/// Puts slot `from`'s image in the failed slot `slot` (a decoded slot,
/// as every failed one is): its pixels copied, or, when `from` went
/// compressed, its placement shared and the slot's own bytes zeroed; all
/// zeros when `from` is None.
fn copy_placed_image(
    images: &mut [u8],
    placements: &mut [Placement],
    slot: usize,
    from: Option<usize>,
) {
    let own = placements[slot];
    let target = own.offset..own.offset + own.length;
    match from.map(|from| placements[from]) {
        Some(source) if source.decoded => {
            images.copy_within(source.offset..source.offset + source.length, target.start);
        }
        Some(source) => {
            images[target].fill(0);
            placements[slot] = source;
        }
        None => images[target].fill(0),
    }
}

/// Splits the batch's bytes into each slot's region, in slot order.
fn regions<'b>(mut images: &'b mut [u8], placements: &[Placement]) -> Vec<&'b mut [u8]> {
    placements
        .iter()
        .map(|placement| {
            let (region, rest) = std::mem::take(&mut images).split_at_mut(placement.length);
            images = rest;
            region
        })
        .collect()
}

/// A ring slot for the next batch. While the client holds every slot, the
/// batches that finish decoding meanwhile go on to the ready queue: none
/// waits unsent for a slot it does not need (so a draining stream's
/// batches in flight all arrive). `Ok(None)`: the client went away.
async fn acquire_sending_decoded(
    shared: &SharedTarget,
    decoding: &mut FuturesOrdered<oneshot::Receiver<DecodedBatch>>,
    ready: &ReadySink<'_>,
) -> Result<Option<shm::SlotLease>, PipelineError> {
    let started = Instant::now();
    let acquire = shared.acquire();
    tokio::pin!(acquire);
    loop {
        if decoding.is_empty() {
            let lease = acquire.await;
            ready.waited_on_client(started);
            return lease.map(Some);
        }
        tokio::select! {
            biased;
            lease = &mut acquire => {
                ready.waited_on_client(started);
                return lease.map(Some);
            }
            // `FuturesOrdered::next` is cancel-safe: an unfinished batch stays queued.
            decoded = decoding.next() => {
                if !send_decoded(decoded, ready).await? {
                    return Ok(None);
                }
            }
        }
    }
}

/// Sends the oldest decoded batch. `Ok(false)`: the client went away.
async fn send_next(
    decoding: &mut FuturesOrdered<oneshot::Receiver<DecodedBatch>>,
    ready: &ReadySink<'_>,
) -> Result<bool, PipelineError> {
    send_decoded(decoding.next().await, ready).await
}

async fn send_decoded(
    decoded: Option<Result<DecodedBatch, oneshot::error::RecvError>>,
    ready: &ReadySink<'_>,
) -> Result<bool, PipelineError> {
    let batch = decoded
        .ok_or_else(|| PipelineError::Internal("no batch decoding".into()))?
        .map_err(|_| PipelineError::Internal("decode task dropped its batch".into()))?;
    let started = Instant::now();
    let tx = ready.tx;
    let sent = tx.send(Ok(batch)).await.is_ok();
    ready.waited_on_client(started);
    ready.gauge.set((tx.max_capacity() - tx.capacity()) as f64);
    Ok(sent)
}

/// What decoding one sample needs, shared by a batch's decode tasks.
struct SampleDecoder {
    decoder: Arc<dyn decode::Decoder>,
    scratch: Arc<decode::ScratchBudget>,
    spec: decode::OutputSpec,
    tier: Option<decode::tier::TierRequest>,
}

type SampleOutcome = Result<CropBox, (&'static str, String)>;

impl SampleDecoder {
    /// Decodes `emitted` into `out`, or, for a compressed placement, copies
    /// its bytes there and decides its box and flip as a decode would.
    fn run(&self, emitted: &EmittedSample, placement: &Placement, out: &mut [u8]) -> SampleOutcome {
        let (format, data) = match (&emitted.sample.unreadable, &emitted.sample.image) {
            (Some(unreadable), _) => return Err((unreadable.reason, unreadable.message.clone())),
            (None, Some((format, data))) => (*format, data),
            (None, None) => {
                return Err((
                    "no_image",
                    "sample has no .jpg/.jpeg/.png/.webp member".to_string(),
                ))
            }
        };
        let origin = &emitted.origin;
        let key = SampleKey {
            seed: origin.seed,
            epoch: origin.epoch,
            sample: decode::augment::sample_identity(
                &origin.dataset.index.shards[emitted.shard as usize].name,
                &emitted.sample.key,
            ),
        };
        if !placement.decoded {
            out.copy_from_slice(data);
            return Ok(self
                .spec
                .crop_box(placement.source_width, placement.source_height, &key));
        }
        match &self.tier {
            None => decode::decode_bounded(
                &*self.decoder,
                &self.scratch,
                format,
                data,
                &self.spec,
                &key,
                out,
            ),
            Some(tier) => {
                // Named only where a tier directory keeps it.
                let dataset = &origin.dataset;
                let location = tier
                    .cache
                    .as_ref()
                    .map(|_| dataset.store.location(&dataset.shard_key(emitted.shard)));
                let sample = location
                    .as_deref()
                    .and_then(|location| tier_sample(dataset, location, emitted));
                tier.output(
                    &*self.decoder,
                    &self.scratch,
                    format,
                    data,
                    &self.spec,
                    &key,
                    sample.as_ref(),
                    out,
                )
            }
        }
        .map_err(|e| (e.reason(), e.to_string()))
    }
}

/// Decodes a batch on the pool, each image straight into its slot (or,
/// delivered encoded, the client's images copied compressed into theirs).
pub(super) fn decode_batch(
    context: &StreamContext,
    buffers: &BufferPool,
    stream_metrics: &metrics::StreamMetrics,
    samples: Vec<EmittedSample>,
    index: u64,
    shared_slot: Option<shm::SlotLease>,
) -> oneshot::Receiver<DecodedBatch> {
    let (tx, rx) = oneshot::channel();
    let sample_decoder = SampleDecoder {
        decoder: context.decoder.clone(),
        scratch: context.scratch.clone(),
        spec: context.spec,
        tier: context.tier.clone(),
    };
    let delivery = context.delivery.clone();
    let stream_metrics = stream_metrics.clone();
    let buffers = buffers.clone();
    let queued = metrics::GaugeGuard::new(metrics::DECODE_QUEUE, samples.len() as f64);
    context.pool.spawn(move || {
        let slot = sample_decoder.spec.bytes();
        // An encoded batch is at most as long as a decoded one.
        let scratch_limit = sample_decoder.scratch.limit();
        let (mut placements, length) = encoded::place(&samples, &delivery, slot, scratch_limit);
        let (mut heap, mut lease) = match shared_slot {
            Some(lease) => (Vec::new(), Some(lease)),
            None => (buffers.take(slot * samples.len()), None),
        };
        let images: &mut [u8] = match &mut lease {
            Some(lease) => &mut lease.as_mut_slice()[..length],
            None => &mut heap[..length],
        };
        let outcomes: Vec<SampleOutcome> = regions(images, &placements)
            .into_par_iter()
            .zip(samples.par_iter())
            .zip(placements.par_iter())
            .map(|((out, emitted), placement)| {
                let started = Instant::now();
                let outcome = sample_decoder.run(emitted, placement, out);
                if placement.decoded {
                    stream_metrics.decode_time(started.elapsed().as_secs_f64());
                }
                outcome
            })
            .collect();
        let mut crops: Vec<CropBox> = outcomes
            .iter()
            .map(|outcome| outcome.as_ref().copied().unwrap_or_default())
            .collect();
        let failures: Vec<Option<(&'static str, String)>> =
            outcomes.into_iter().map(Result::err).collect();
        let server_decoded = placements.iter().filter(|p| p.decoded).count();
        let mut labels = batch_labels(&samples);
        let substituted = substitute_failures(
            &failures,
            &samples,
            &mut labels,
            &mut crops,
            |slot, from| copy_placed_image(images, &mut placements, slot, from),
        );
        let sample_fields: Vec<&[Option<Bytes>]> =
            samples.iter().map(|e| e.sample.fields.as_slice()).collect();
        let fields = batch_fields(&sample_fields, &substituted);
        let encoded = match delivery {
            Delivery::Decoded => Vec::new(),
            Delivery::Encoded(_) => {
                let (server, client) = (server_decoded, placements.len() - server_decoded);
                metrics::delivered(server, client);
                stream_metrics.server_decoded(server as f64 / placements.len().max(1) as f64);
                placements
            }
        };
        let batch = DecodedBatch {
            index,
            size: samples.len(),
            image_bytes: length,
            images: match lease {
                Some(lease) => BatchImages::Shared(lease),
                None => BatchImages::Inline(buffers.share(heap).slice(..length)),
            },
            encoded,
            labels,
            shards: samples
                .iter()
                .map(|e| e.origin.dataset.index.shards[e.shard as usize].name.clone())
                .collect(),
            sources: samples.iter().map(|e| e.origin.source).collect(),
            source_epochs: samples.iter().map(|e| e.origin.epoch).collect(),
            padded: (0..samples.len() as u32)
                .filter(|&slot| samples[slot as usize].padding)
                .collect(),
            // The samples are done with: move their keys rather than copy them.
            keys: samples
                .into_iter()
                .map(|e| e.sample.name.unwrap_or(e.sample.key))
                .collect(),
            crops,
            substituted,
            fields,
            ready_at: Instant::now(),
        };
        drop(queued);
        let _ = tx.send(batch);
    });
    rx
}

/// Each sample's label after the origin's offset (-1: unlabelled).
fn batch_labels(samples: &[EmittedSample]) -> Vec<i64> {
    samples
        .iter()
        .map(|emitted| {
            if let Label::Invalid(text) = &emitted.sample.label {
                metrics::invalid_label();
                tracing::warn!(
                    shard = %emitted.origin.dataset.shard_key(emitted.shard),
                    key = %emitted.sample.key,
                    label = %text,
                    "label is not an integer; sent as -1"
                );
            }
            match &emitted.sample.label {
                // Below 0 after the offset: unlabelled, as -1 always means.
                Label::Value(label) => label.saturating_add(emitted.origin.label_offset).max(-1),
                _ => -1,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_substituted_slot_carries_its_sources_fields() {
        let caption = |c: Option<&'static str>| vec![c.map(|c| Bytes::from_static(c.as_bytes()))];
        let (a, b, c) = (caption(Some("A")), caption(Some("B")), caption(None));
        let sample_fields: [&[Option<Bytes>]; 3] = [&a, &b, &c];
        let substituted = [
            Substitution {
                slot: 1,
                reason: String::new(),
                source: Some(0),
            },
            Substitution {
                slot: 2,
                reason: String::new(),
                source: None,
            },
        ];
        let fields = batch_fields(&sample_fields, &substituted);
        assert_eq!(
            fields,
            [vec![
                Some(Bytes::from_static(b"A")),
                Some(Bytes::from_static(b"A")),
                None
            ]]
        );
        assert!(batch_fields(&[], &[]).is_empty());
    }

    #[test]
    fn substitute_sources_are_frozen() {
        // A change here changes which pixels training sees for a failed
        // sample: make it on purpose, with a note for users.
        let good = [0, 1, 3, 4, 6, 7];
        let picked: Vec<Option<u32>> = ["a", "train/000123", "s000/k000002", ""]
            .iter()
            .map(|key| substitute_source(key, &good))
            .collect();
        assert_eq!(picked, vec![Some(7), Some(6), Some(7), Some(3)]);
        assert_eq!(substitute_source("a", &[]), None);
    }
}
