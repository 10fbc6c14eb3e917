//! What a stream hands the server: decoded (or encoded) batches, through a
//! bounded ready queue.

use std::time::Instant;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::encoded::{Placement, SearchState};
use super::error::PipelineError;
use super::shm;
use super::substitute::Substitution;
use crate::decode::CropBox;

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

pub type BatchReceiver = mpsc::Receiver<Result<DecodedBatch, PipelineError>>;
pub type BatchSender = mpsc::Sender<Result<DecodedBatch, PipelineError>>;
