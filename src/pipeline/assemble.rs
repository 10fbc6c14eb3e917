//! A batch decoded on the pool: each sample straight into its slot of the
//! batch's buffer (or ring slot), or, delivered encoded, copied compressed
//! into its place; failures substituted; labels and fields gathered.

use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;
use tokio::sync::oneshot;

use super::batch::{BatchImages, DecodedBatch};
use super::buffers::BufferPool;
use super::context::StreamCommon;
use super::encoded::{self, BatchShare, Placement};
use super::sample::EmittedSample;
use super::substitute::copy_placed_image;
use super::{remote, shm};
use crate::decode::{self, CropBox};
use crate::metrics;
use crate::pool::wire::SampleAnswer;

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
#[derive(Clone)]
struct SampleDecoder {
    decoder: Arc<dyn decode::Decoder>,
    scratch: Arc<decode::ScratchBudget>,
    spec: decode::OutputSpec,
    tier: Option<crate::tier::output::TierRequest>,
}

pub(super) type SampleOutcome = Result<CropBox, (&'static str, String)>;

impl SampleDecoder {
    /// Decodes `emitted` into `out`, or, for a client slot, fills it in its
    /// mode's form and decides its box and flip as a decode would.
    fn run(&self, emitted: &EmittedSample, placement: &Placement, out: &mut [u8]) -> SampleOutcome {
        let (format, data) = emitted.image()?;
        let key = emitted.augment_key();
        if let Some(slot) = placement.client {
            slot.mode.fill(data, out);
            let sample = slot.sample;
            return Ok(self
                .spec
                .crop_box(sample.source_width, sample.source_height, &key));
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
            Some(tier) => emitted.with_tier_name(|name| {
                tier.sample_output(
                    &*self.decoder,
                    &self.scratch,
                    format,
                    data,
                    &self.spec,
                    &key,
                    name,
                    out,
                )
            }),
        }
        .map_err(|e| (e.reason(), e.to_string()))
    }
}

/// A batch on its way: its samples, where each goes in its bytes, the
/// bytes themselves (process memory or a ring slot), and each sample's
/// outcome once decoded here or answered by the pool.
pub(super) struct BatchWork {
    decoder: SampleDecoder,
    stream_metrics: metrics::StreamMetrics,
    buffers: BufferPool,
    share: Option<BatchShare>,
    index: u64,
    samples: Vec<EmittedSample>,
    placements: Vec<Placement>,
    length: usize,
    heap: Vec<u8>,
    lease: Option<shm::SlotLease>,
    outcomes: Vec<Option<SampleOutcome>>,
    /// Samples the pool decoded.
    remote: usize,
}

impl BatchWork {
    fn new(
        (decoder, stream_metrics, buffers): (SampleDecoder, metrics::StreamMetrics, BufferPool),
        share: Option<BatchShare>,
        index: u64,
        samples: Vec<EmittedSample>,
        shared_slot: Option<shm::SlotLease>,
    ) -> Self {
        let slot = decoder.spec.bytes();
        // An encoded batch is at most as long as a decoded one.
        let (placements, length) =
            encoded::place(&samples, share, &decoder.spec, decoder.scratch.limit());
        let (heap, lease) = match shared_slot {
            Some(lease) => (Vec::new(), Some(lease)),
            None => (buffers.take(slot * samples.len()), None),
        };
        let outcomes = vec![None; samples.len()];
        Self {
            decoder,
            stream_metrics,
            buffers,
            share,
            index,
            samples,
            placements,
            length,
            heap,
            lease,
            outcomes,
            remote: 0,
        }
    }

    fn images(&mut self) -> &mut [u8] {
        match &mut self.lease {
            Some(lease) => &mut lease.as_mut_slice()[..self.length],
            None => &mut self.heap[..self.length],
        }
    }
}

impl remote::SplitDecode for BatchWork {
    /// Decodes here every sample without an outcome yet, but those
    /// `reserved` (for the pool's answers).
    fn decode_rest(&mut self, reserved: &[bool]) {
        let (decoder, stream_metrics) = (&self.decoder, &self.stream_metrics);
        let (samples, placements, outcomes) = (&self.samples, &self.placements, &self.outcomes);
        let length = self.length;
        let images: &mut [u8] = match &mut self.lease {
            Some(lease) => &mut lease.as_mut_slice()[..length],
            None => &mut self.heap[..length],
        };
        let decoded: Vec<(usize, SampleOutcome)> = regions(images, placements)
            .into_par_iter()
            .enumerate()
            .filter(|(slot, _)| {
                outcomes[*slot].is_none() && !reserved.get(*slot).copied().unwrap_or(false)
            })
            .map(|(slot, out)| {
                let (emitted, placement) = (&samples[slot], &placements[slot]);
                let started = Instant::now();
                let outcome = decoder.run(emitted, placement, out);
                if placement.decoded() {
                    stream_metrics.decode_time(started.elapsed().as_secs_f64());
                }
                (slot, outcome)
            })
            .collect();
        for (slot, outcome) in decoded {
            self.outcomes[slot] = Some(outcome);
        }
    }

    /// Writes each sample the pool decoded into its slot; one it failed
    /// (or a unit it never answered) stays for local decode.
    fn place_answers(&mut self, answers: Vec<remote::UnitResult>) {
        for (slots, answer) in answers {
            let Some(answer) = answer else {
                continue;
            };
            for (i, (&slot, sample)) in slots.iter().zip(&answer.samples).enumerate() {
                let SampleAnswer::Decoded(crop) = sample else {
                    continue;
                };
                let placement = self.placements[slot];
                let pixels = &answer.pixels[i * placement.length..(i + 1) * placement.length];
                self.images()[placement.offset..placement.offset + placement.length]
                    .copy_from_slice(pixels);
                self.outcomes[slot] = Some(Ok(*crop));
                self.remote += 1;
            }
        }
    }

    /// The batch, with failures substituted and labels and fields gathered.
    fn finish(mut self) -> DecodedBatch {
        let (share, index) = (self.share, self.index);
        let outcomes: Vec<SampleOutcome> = std::mem::take(&mut self.outcomes)
            .into_iter()
            .map(|outcome| {
                outcome.unwrap_or_else(|| Err(("internal", "sample left undecoded".into())))
            })
            .collect();
        let mut crops: Vec<CropBox> = outcomes
            .iter()
            .map(|outcome| outcome.as_ref().copied().unwrap_or_default())
            .collect();
        let failures: Vec<Option<(&'static str, String)>> =
            outcomes.into_iter().map(Result::err).collect();
        let samples = std::mem::take(&mut self.samples);
        let server_decoded = self.placements.iter().filter(|p| p.decoded()).count();
        if share.is_none() {
            crate::metrics::pool::samples(
                (server_decoded - self.remote) as u64,
                self.remote as u64,
            );
        }
        let mut placements = std::mem::take(&mut self.placements);
        let length = self.length;
        let images = self.images();
        let mut batch =
            DecodedBatch::settle(index, samples, &failures, &mut crops, |slot, from| {
                copy_placed_image(images, &mut placements, slot, from)
            });
        batch.crops = crops;
        if share.is_some() {
            batch.deliver_placed(placements, &self.stream_metrics);
        }
        batch.image_bytes = length;
        batch.images = match self.lease {
            Some(lease) => BatchImages::Shared(lease),
            None => BatchImages::Inline(self.buffers.share(self.heap).slice(..length)),
        };
        batch
    }
}

/// Decodes a batch on the pool, each image straight into its slot (or,
/// delivered encoded, the client's images copied compressed into theirs).
/// With `remote`, the samples it names go to the decode pool first and
/// only those it does not answer are decoded here.
pub(super) fn decode_batch(
    common: &StreamCommon,
    buffers: &BufferPool,
    share: Option<BatchShare>,
    remote: Option<remote::RemotePart>,
    samples: Vec<EmittedSample>,
    index: u64,
    shared_slot: Option<shm::SlotLease>,
) -> oneshot::Receiver<DecodedBatch> {
    if let Some(views) = &common.views {
        return super::views::decode_batch(
            common,
            (views.clone(), share),
            buffers,
            remote,
            samples,
            index,
            shared_slot,
        );
    }
    let sample_decoder = SampleDecoder {
        decoder: common.decoder.clone(),
        scratch: common.scratch.clone(),
        spec: common.spec,
        tier: common.tier.clone(),
    };
    let parts = (sample_decoder, common.metrics.clone(), buffers.clone());
    let queued = metrics::GaugeGuard::new(metrics::DECODE_QUEUE, samples.len() as f64);
    let remote = remote.map(|part| (part, common.spec.into()));
    remote::decode_split(
        common.pool.clone(),
        queued,
        remote,
        samples,
        move |samples| BatchWork::new(parts, share, index, samples, shared_slot),
    )
}
