//! What a stream hands the server: decoded (or encoded) batches, through a
//! bounded ready queue.

use std::time::Instant;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::encoded::{Placement, SearchState};
use super::error::PipelineError;
use super::sample::EmittedSample;
use super::shm;
use super::substitute::{batch_fields, substitute_failures, Substitution};
use crate::decode::CropBox;
use crate::metrics;
use crate::shard::Label;

/// Where a batch's pixels are.
#[derive(Debug)]
pub enum BatchImages {
    /// In process memory, to be sent inline.
    Inline(Bytes),
    /// In a slot of the stream's shared-memory ring (the first
    /// `size * height * width * 3` bytes of it).
    Shared(shm::SlotLease),
}

/// A decoded batch, ready to send.
#[derive(Debug)]
pub struct DecodedBatch {
    pub index: u64,
    pub size: usize,
    /// `image_bytes` bytes: NHWC pixels, `size * height * width * 3` of
    /// them; delivered encoded, each sample where `encoded` places it.
    pub images: BatchImages,
    pub image_bytes: usize,
    /// Delivered encoded: per slot, where its bytes are and whether they
    /// are pixels or a JPEG (empty otherwise).
    pub encoded: Vec<Placement>,
    pub labels: Vec<i64>,
    pub keys: Vec<String>,
    pub shards: Vec<String>,
    /// Per slot: the source of a mixed stream it came from (0 otherwise),
    /// and that source's epoch (the stream's epoch otherwise).
    pub sources: Vec<u32>,
    pub source_epochs: Vec<u64>,
    /// Slots holding a repeat that pads the epoch (partition pad).
    pub padded: Vec<u32>,
    /// Per slot, the sample's copy index (repeated augmentation); empty
    /// when every slot holds copy 0.
    pub copies: Vec<u32>,
    /// Per slot: the source box the image came from and whether it was
    /// flipped (a substitute carries its source's).
    pub crops: Vec<CropBox>,
    /// A stream of views, per slot: each view's box and decisions, group
    /// by group (then `crops` is empty, and the pixels lie as
    /// [`super::views::ViewLayout`] places them).
    pub view_crops: Vec<Vec<CropBox>>,
    /// Samples replaced by a substitute, in slot order.
    pub substituted: Vec<Substitution>,
    /// Per field of the stream's layout, per slot: its bytes (a substitute
    /// carries its source's).
    pub fields: Vec<Vec<Option<Bytes>>>,
    /// When the batch became ready (for stall accounting).
    pub ready_at: Instant,
    /// A tuned encoded delivery: where the server's search for its share
    /// stands (its center is the best share so far).
    pub search: Option<SearchState>,
}

impl DecodedBatch {
    /// Hands an encoded batch's placements on with it, counting which side
    /// decodes how many (the share's metrics).
    pub(super) fn deliver_placed(
        &mut self,
        placements: Vec<Placement>,
        stream_metrics: &metrics::StreamMetrics,
    ) {
        let server = placements.iter().filter(|p| p.decoded()).count();
        metrics::delivered(server, placements.len() - server);
        stream_metrics.server_decoded(server as f64 / placements.len().max(1) as f64);
        self.encoded = placements;
    }

    /// A batch's parts its samples give, once each has its outcome: labels,
    /// keys, origins and fields, every failure substituted (`copy_image(slot,
    /// from)` puts good slot `from`'s image in failed `slot`, zeros when None;
    /// `crops`, each slot's boxes, a substitute taking its source's). Its
    /// images, their boxes and placements are the caller's to set.
    pub(super) fn settle<Crops: Clone + Default>(
        index: u64,
        samples: Vec<EmittedSample>,
        failures: &[Option<(&'static str, String)>],
        crops: &mut [Crops],
        copy_image: impl FnMut(usize, Option<usize>),
    ) -> DecodedBatch {
        let mut labels = batch_labels(&samples);
        let substituted = substitute_failures(failures, &samples, &mut labels, crops, copy_image);
        let sample_fields: Vec<&[Option<Bytes>]> =
            samples.iter().map(|e| e.sample.fields.as_slice()).collect();
        let fields = batch_fields(&sample_fields, &substituted);
        DecodedBatch {
            index,
            size: samples.len(),
            image_bytes: 0,
            images: BatchImages::Inline(Bytes::new()),
            encoded: Vec::new(),
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
            copies: if samples.iter().any(|e| e.copy != 0) {
                samples.iter().map(|e| e.copy).collect()
            } else {
                Vec::new()
            },
            // The samples are done with: move their keys rather than copy them.
            keys: samples
                .into_iter()
                .map(|e| e.sample.name.unwrap_or(e.sample.key))
                .collect(),
            crops: Vec::new(),
            view_crops: Vec::new(),
            substituted,
            fields,
            ready_at: Instant::now(),
            search: None,
        }
    }
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
                    "label is not an integer or not a class; sent as -1"
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

pub type BatchReceiver = mpsc::Receiver<Result<DecodedBatch, PipelineError>>;
pub type BatchSender = mpsc::Sender<Result<DecodedBatch, PipelineError>>;
