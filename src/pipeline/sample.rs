//! A sample on its way from the shuffle buffer to the decoder, and where it
//! came from.

use std::sync::Arc;

use bytes::Bytes;

use crate::dataset::Dataset;
use crate::shard::{ImageFormat, RawSample};
use crate::tier::output::SampleVersion;

/// Where emitted samples come from, and what keys their augmentation: one
/// per stream, or per part of a source of a mixed stream.
#[derive(Debug)]
pub(crate) struct SampleOrigin {
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
pub(crate) struct EmittedSample {
    pub shard: u32,
    /// A repeat that pads the epoch.
    pub padding: bool,
    /// Which copy of the sample this is (repeated augmentation; else 0).
    pub copy: u32,
    pub origin: Arc<SampleOrigin>,
    pub sample: RawSample,
}

impl EmittedSample {
    /// The sample's stable identity (its shard's name and its key): what
    /// keys its augmentation and which side decodes it when delivered
    /// encoded.
    pub fn identity(&self) -> u64 {
        crate::decode::augment::sample_identity(
            &self.origin.dataset.index.shards[self.shard as usize].name,
            &self.sample.key,
        )
    }

    /// What the sample's decisions are keyed by: its stream's seed and epoch
    /// (its source's, mixed), its identity and its copy.
    pub fn augment_key(&self) -> crate::decode::augment::SampleKey {
        crate::decode::augment::SampleKey {
            seed: self.origin.seed,
            epoch: self.origin.epoch,
            sample: self.identity(),
            copy: self.copy,
        }
    }

    /// The sample's compressed image, or why there is none to decode (its
    /// reader's reason, or no image member): a substitution's reason and
    /// message.
    pub fn image(&self) -> Result<(ImageFormat, &Bytes), (&'static str, String)> {
        match (&self.sample.unreadable, &self.sample.image) {
            (Some(unreadable), _) => Err((unreadable.reason, unreadable.message.clone())),
            (None, Some((format, data))) => Ok((*format, data)),
            (None, None) => Err((
                "no_image",
                "sample has no .jpg/.jpeg/.png/.webp member".to_string(),
            )),
        }
    }

    /// Runs `with` given the sample's namer for the decoded-source tier:
    /// its shard's location and version (ETag, or a loose group's digest
    /// of its members' ETags) and its key, so a changed object is derived
    /// anew; `None` (not kept) when the shard has no version to tell a
    /// change by. The location is made once, and only when the tier asks.
    pub fn with_tier_name<R>(
        &self,
        with: impl for<'n> FnOnce(&'n dyn Fn() -> Option<SampleVersion<'n>>) -> R,
    ) -> R {
        let dataset: &Dataset = &self.origin.dataset;
        let location = std::cell::OnceCell::new();
        let name = || {
            let location =
                location.get_or_init(|| dataset.store.location(&dataset.shard_key(self.shard)));
            let shard = &dataset.index.shards[self.shard as usize];
            Some(SampleVersion {
                location,
                version: shard.version()?,
                size: shard.size,
                key: &self.sample.key,
            })
        };
        with(&name)
    }
}
