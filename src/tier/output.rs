//! The decoded-source tier: each image brought once to a stored source form
//! ([`crate::decode::source`]) and kept on the host's local disk, so later epochs
//! crop and resize from it instead of decoding the JPEG again.
//!
//! A stream that asks for the tier has the outputs of its epochs from
//! `from_epoch` on *defined* from the stored source: a miss derives the
//! source, stores it and crops from it exactly as a hit does, so a batch is
//! the same bytes whatever the tier holds (or when the server keeps no tier
//! directory at all: then every sample is derived and nothing is stored).
//! The epochs before `from_epoch` are defined from the original, exactly as
//! with no tier, while the tier fills off the critical path
//! ([`super::fill`]).
//!
//! This module defines a sample's output from its source, and what it
//! needs of a store of sources ([`SourceStore`]: get and put by a
//! [`SourceKey`]); where sources are kept (records on disk, their index,
//! eviction by the plans) is the store's business, `tier::records` beside
//! the shard cache, which decode does not import.

use std::sync::Arc;

use crate::decode::source::{
    derive_source_with, output_from_source, views_from_source, SourceForm, StoredSource,
};
use crate::decode::{
    decode_bounded, decode_views_bounded, full_size_bounded, CropBox, DecodeError, OutputSpec,
    SampleKey, Views,
};
use crate::decode::{Decoder, ScratchBudget, MAX_SIZE};
use crate::metrics;
use crate::shard::ImageFormat;

/// A store of decoded sources, as decode needs it. Its calls read and write
/// the host's local disk: they run on the decode threads, each within the
/// decode scratch budget (see [`TierRequest::output`]), never on the async
/// runtime. A record that is missing, damaged or of another version is a
/// miss; a write that fails is dropped (the source is derived again).
pub trait SourceStore: Send + Sync + std::fmt::Debug {
    fn get(&self, key: &SourceKey) -> Option<StoredSource>;
    fn put(&self, key: &SourceKey, source: &StoredSource);
    /// Whether a record of `key` is kept, without reading it (a damaged
    /// one is found, and derived again, when it is read).
    fn holds(&self, key: &SourceKey) -> bool {
        self.get(key).is_some()
    }
}

/// The identity of a sample's object, the part of a [`SourceKey`] that
/// tells a changed object from the one stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleVersion<'a> {
    /// Where the shard (or loose object group) is: its store location.
    pub location: &'a str,
    /// Its version: an ETag, or a loose group's digest of its members'.
    pub version: &'a str,
    /// Its size in bytes.
    pub size: u64,
    /// The sample's key within it.
    pub key: &'a str,
}

/// The key a source is got and put by: the sample's versioned identity and
/// the form it is stored in. Built here only, so every store names a
/// sample alike; a changed object has another key, so it is derived anew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceKey {
    /// The sample: location, version, size and key, one per line (the
    /// first line, the location, groups a shard's records).
    record: String,
    form: SourceForm,
}

impl SourceKey {
    pub fn new(sample: &SampleVersion<'_>, form: SourceForm) -> Self {
        let SampleVersion {
            location,
            version,
            size,
            key,
        } = sample;
        Self {
            record: format!("{location}\n{version}\n{size}\n{key}"),
            form,
        }
    }

    /// The sample's record: what the store names and groups records by.
    pub fn record(&self) -> &str {
        &self.record
    }

    pub fn form(&self) -> &SourceForm {
        &self.form
    }

    /// The key of the sample's final output under `spec` (kept where the
    /// transform is the same every epoch; see [`TierRequest::output`]).
    fn output(&self, spec: &OutputSpec) -> Self {
        Self {
            record: format!(
                "{}\noutput {}x{} {:?}",
                self.record, spec.width, spec.height, spec.crop
            ),
            form: self.form,
        }
    }
}

/// Smallest and largest stored shorter side a request may ask for.
pub const MIN_SHORTER_SIDE: u32 = 64;
pub const MAX_SHORTER_SIDE: u32 = MAX_SIZE;

/// What a stream asks of the tier.
#[derive(Clone, Debug)]
pub struct TierRequest {
    pub form: SourceForm,
    /// Where sources are kept; `None`: derived for every sample, not kept.
    pub cache: Option<Arc<dyn SourceStore>>,
    /// The first epoch defined from the stored source; the epochs before it
    /// are defined from the original (the same bytes as the tier off).
    pub from_epoch: u64,
    /// Where the epochs before `from_epoch` offer the samples the tier does
    /// not hold yet (`None`: not filled ahead).
    pub filler: Option<Arc<dyn FillQueue>>,
}

/// Where samples are offered to be stored ahead of their first stored
/// epoch ([`super::fill`]). An offer never waits on the fill: a full queue
/// drops it.
pub trait FillQueue: Send + Sync + std::fmt::Debug {
    /// Queues `job` with `data`, the sample's compressed bytes (copied: they
    /// are a slice of a shard part that would otherwise be kept whole).
    fn offer(&self, job: FillJob, data: &[u8]);
}

/// One sample to store ahead: what a miss in a stored epoch would store.
pub struct FillJob {
    tier: TierRequest,
    source_key: SourceKey,
    format: ImageFormat,
    /// The stream's one output (kept too where it is the same every
    /// epoch); `None` for a stream of views, which keeps the source alone.
    spec: Option<OutputSpec>,
    key: SampleKey,
}

impl FillJob {
    /// Derives and stores the sample's source, and its output where the
    /// transform is the same every epoch, unless kept already: what a miss
    /// in a stored epoch would store, made ahead. Whether anything was
    /// stored. `data` is the sample's compressed bytes, as offered.
    pub fn run(
        &self,
        decoder: &dyn Decoder,
        budget: &ScratchBudget,
        data: &[u8],
    ) -> Result<bool, DecodeError> {
        let (tier, source_key) = (&self.tier, &self.source_key);
        let Some(cache) = &tier.cache else {
            return Ok(false);
        };
        let output_missing = self
            .spec
            .as_ref()
            .filter(|spec| is_deterministic(spec))
            .map(|spec| (spec, source_key.output(spec)))
            .filter(|(_, name)| !cache.holds(name));
        let source_held = cache.holds(source_key);
        if source_held && output_missing.is_none() {
            return Ok(false);
        }
        full_size_bounded(budget, self.format, data, |_, _| {
            let kept = source_held.then(|| cache.get(source_key)).flatten();
            let source = match kept {
                Some(source) => source,
                None => tier.derive(decoder, self.format, data, Some((cache, source_key)))?,
            };
            if let Some((spec, name)) = output_missing {
                let crop = spec.crop_box(source.original_width, source.original_height, &self.key);
                let mut out = vec![0u8; spec.bytes()];
                output_from_source(&source, spec, &crop, &mut out)?;
                let original = (source.original_width, source.original_height);
                cache.put(&name, &tier.output_record(spec, original, out));
            }
            Ok(true)
        })
    }
}

/// The first stored epoch where a request does not say: the first epoch
/// costs what the tier off does, and fills the tier in the slack.
pub const DEFAULT_FROM_EPOCH: u64 = 1;

impl TierRequest {
    /// Whether `epoch`'s outputs are defined from the stored source.
    fn defines(&self, epoch: u64) -> bool {
        epoch >= self.from_epoch
    }

    /// One sample's output with the tier on, the one call a batch's
    /// assembly makes. In the epochs before `from_epoch` it is decoded from
    /// the original (the same bytes as the tier off) and offered to the
    /// background fill; from then on it is defined from the stored source.
    /// `name` gives the sample's versioned identity, asked only where the
    /// tier keeps something (`None`: not kept, counted as unversioned).
    #[allow(clippy::too_many_arguments)]
    pub fn sample_output<'v>(
        &self,
        decoder: &dyn Decoder,
        budget: &ScratchBudget,
        format: ImageFormat,
        data: &[u8],
        spec: &OutputSpec,
        key: &SampleKey,
        name: impl Fn() -> Option<SampleVersion<'v>>,
        out: &mut [u8],
    ) -> Result<CropBox, DecodeError> {
        let named = || counted(name());
        if !self.defines(key.epoch) {
            let decoded = decode_bounded(decoder, budget, format, data, spec, key, out);
            if decoded.is_ok() && self.filler.is_some() {
                if let Some(sample) = named() {
                    self.offer(format, data, Some(spec), key, &sample);
                }
            }
            return decoded;
        }
        let sample = self.cache.as_ref().and_then(|_| named());
        self.stored_output(
            decoder,
            budget,
            format,
            data,
            spec,
            key,
            sample.as_ref(),
            out,
        )
    }

    /// A sample's views with the tier on, as [`Self::sample_output`] is
    /// one output: before `from_epoch` decoded from the original (once for
    /// all views) and offered to the fill; from then on every view defined
    /// from the one stored source, read (or derived and stored) once. A
    /// stream of views keeps no outputs, only the source.
    #[allow(clippy::too_many_arguments)]
    pub fn sample_views<'v>(
        &self,
        decoder: &dyn Decoder,
        budget: &ScratchBudget,
        format: ImageFormat,
        data: &[u8],
        views: &Views,
        key: &SampleKey,
        name: impl Fn() -> Option<SampleVersion<'v>>,
        outs: &mut [&mut [u8]],
    ) -> Result<Vec<CropBox>, DecodeError> {
        let named = || counted(name());
        if !self.defines(key.epoch) {
            let decoded = decode_views_bounded(decoder, budget, format, data, views, key, outs);
            if decoded.is_ok() && self.filler.is_some() {
                if let Some(sample) = named() {
                    self.offer(format, data, None, key, &sample);
                }
            }
            return decoded.map(|plan| plan.boxes);
        }
        let sample = self.cache.as_ref().and_then(|_| named());
        let source_key = sample.map(|sample| SourceKey::new(&sample, self.form));
        let cache = self.cache.as_ref().zip(source_key.as_ref());
        // Within the scratch budget a decode of the original takes, as a
        // stored output is read (see `stored_output`).
        full_size_bounded(budget, format, data, |_, _| {
            let source = self.source(decoder, format, data, cache)?;
            let boxes = views
                .plan(source.original_width, source.original_height, key)
                .boxes;
            views_from_source(&source, views, &boxes, outs)?;
            Ok(boxes)
        })
    }

    /// A sample of an epoch before `from_epoch`, decoded from the original:
    /// offers it to the background fill unless the tier holds it already
    /// (its source, and its output where `spec` is the same every epoch).
    pub(super) fn offer(
        &self,
        format: ImageFormat,
        data: &[u8],
        spec: Option<&OutputSpec>,
        key: &SampleKey,
        sample: &SampleVersion<'_>,
    ) {
        let (Some(filler), Some(cache)) = (&self.filler, &self.cache) else {
            return;
        };
        let source_key = SourceKey::new(sample, self.form);
        let output_held = spec
            .is_none_or(|spec| !is_deterministic(spec) || cache.holds(&source_key.output(spec)));
        if output_held && cache.holds(&source_key) {
            return;
        }
        metrics::decoded_tier("fill_offered");
        let job = FillJob {
            // A job must not hold the queue that holds the job.
            tier: Self {
                filler: None,
                ..self.clone()
            },
            source_key,
            format,
            spec: spec.copied(),
            key: *key,
        };
        filler.offer(job, data);
    }

    /// One sample's output, defined from its stored source. `sample` names
    /// it for the store (`None`: not kept, e.g. a loose object without an
    /// ETag to tell a changed one by).
    #[allow(clippy::too_many_arguments)]
    fn stored_output(
        &self,
        decoder: &dyn Decoder,
        budget: &ScratchBudget,
        format: ImageFormat,
        data: &[u8],
        spec: &OutputSpec,
        key: &SampleKey,
        sample: Option<&SampleVersion<'_>>,
        out: &mut [u8],
    ) -> Result<CropBox, DecodeError> {
        let source_key = sample.map(|sample| SourceKey::new(sample, self.form));
        let cache = self.cache.as_ref().zip(source_key.as_ref());
        // A transform with no randomness (center crop or stretch, no flip)
        // makes the same output every epoch: it is kept too, and later
        // epochs are a copy.
        let output_record = cache
            .filter(|_| is_deterministic(spec))
            .map(|(cache, source_key)| (cache, source_key.output(spec)));
        if let Some((cache, name)) = &output_record {
            if let Some(kept) = cache.get(name) {
                if kept.bytes.len() == out.len() {
                    out.copy_from_slice(&kept.bytes);
                    return Ok(spec.crop_box(kept.original_width, kept.original_height, key));
                }
            }
        }
        // A stored source is read, and a missing one derived, within the
        // decode scratch budget (sized by the original, which a stored form
        // never exceeds): a hit holds as much memory as a decode would.
        let crop = full_size_bounded(budget, format, data, |_, _| {
            let source = self.source(decoder, format, data, cache)?;
            let crop = spec.crop_box(source.original_width, source.original_height, key);
            output_from_source(&source, spec, &crop, out)?;
            Ok((crop, source.original_width, source.original_height))
        })?;
        let (crop, original_width, original_height) = crop;
        if let Some((cache, name)) = &output_record {
            let original = (original_width, original_height);
            cache.put(name, &self.output_record(spec, original, out.to_vec()));
        }
        Ok(crop)
    }

    /// The sample's stored source, or, missing, derived from the original
    /// and stored where `cache` names a store.
    fn source(
        &self,
        decoder: &dyn Decoder,
        format: ImageFormat,
        data: &[u8],
        cache: Option<(&Arc<dyn SourceStore>, &SourceKey)>,
    ) -> Result<StoredSource, DecodeError> {
        match cache.and_then(|(cache, source_key)| cache.get(source_key)) {
            Some(source) => Ok(source),
            None => self.derive(decoder, format, data, cache),
        }
    }

    /// The sample's source derived from the original, and stored where
    /// `cache` names a store.
    fn derive(
        &self,
        decoder: &dyn Decoder,
        format: ImageFormat,
        data: &[u8],
        cache: Option<(&Arc<dyn SourceStore>, &SourceKey)>,
    ) -> Result<StoredSource, DecodeError> {
        let source = derive_source_with(decoder, format, data, &self.form)?;
        if let Some((cache, source_key)) = cache {
            cache.put(source_key, &source);
        }
        Ok(source)
    }

    /// A final output as the tier keeps it (for a transform that is the
    /// same every epoch).
    fn output_record(
        &self,
        spec: &OutputSpec,
        (original_width, original_height): (u32, u32),
        bytes: Vec<u8>,
    ) -> StoredSource {
        StoredSource {
            kind: self.form.kind,
            width: spec.width,
            height: spec.height,
            original_width,
            original_height,
            bytes,
        }
    }
}

/// A sample's versioned identity as named, counted where it has none (the
/// tier then keeps nothing of it).
fn counted<'v>(sample: Option<SampleVersion<'v>>) -> Option<SampleVersion<'v>> {
    if sample.is_none() {
        metrics::decoded_tier("unversioned");
    }
    sample
}

/// Whether `spec` gives a sample the same output every epoch.
fn is_deterministic(spec: &OutputSpec) -> bool {
    !spec.is_random()
}
