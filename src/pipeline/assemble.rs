//! A batch decoded on the pool: each sample straight into its slot of the
//! batch's buffer (or ring slot), or, delivered encoded, copied compressed
//! into its place; failures substituted; labels and fields gathered.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use rayon::prelude::*;
use tokio::sync::oneshot;

use super::buffers::BufferPool;
use super::encoded::{self, Placement};
use super::sample::EmittedSample;
use super::substitute::{batch_fields, copy_placed_image, substitute_failures};
use super::{shm, BatchImages, DecodedBatch, StreamCommon};
use crate::dataset::Dataset;
use crate::decode::{self, CropBox, SampleKey};
use crate::metrics;
use crate::shard::Label;

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
    common: &StreamCommon,
    buffers: &BufferPool,
    server_fraction: Option<f64>,
    samples: Vec<EmittedSample>,
    index: u64,
    shared_slot: Option<shm::SlotLease>,
) -> oneshot::Receiver<DecodedBatch> {
    let (tx, rx) = oneshot::channel();
    let sample_decoder = SampleDecoder {
        decoder: common.decoder.clone(),
        scratch: common.scratch.clone(),
        spec: common.spec,
        tier: common.tier.clone(),
    };
    let stream_metrics = common.metrics.clone();
    let buffers = buffers.clone();
    let queued = metrics::GaugeGuard::new(metrics::DECODE_QUEUE, samples.len() as f64);
    common.pool.spawn(move || {
        let slot = sample_decoder.spec.bytes();
        // An encoded batch is at most as long as a decoded one.
        let scratch_limit = sample_decoder.scratch.limit();
        let (mut placements, length) =
            encoded::place(&samples, server_fraction, slot, scratch_limit);
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
        let encoded = match server_fraction {
            None => Vec::new(),
            Some(_) => {
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
