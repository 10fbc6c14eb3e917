//! The decoded-source tier: each image brought once to a stored source form
//! ([`super::source`]) and kept on the host's local disk, so later epochs
//! crop and resize from it instead of decoding the JPEG again.
//!
//! A stream that asks for the tier has its outputs *defined* from the
//! stored source: a miss derives the source, stores it and crops from it
//! exactly as a hit does, so a batch is the same bytes whatever the tier
//! holds (or when the server keeps no tier directory at all: then every
//! sample is derived and nothing is stored).
//!
//! This module defines a sample's output from its source; where sources
//! are kept (records on disk, their index, eviction by the plans) is
//! [`crate::store::decoded`], beside the shard cache.

use std::sync::Arc;

use super::source::{derive_source_with, output_from_source, SourceForm, StoredSource};
use super::{full_size_bounded, Crop, CropBox, DecodeError, ImageFormat, OutputSpec, SampleKey};
use super::{Decoder, ScratchBudget, MAX_SIZE};

use crate::store::decoded::DecodedCache;
/// Smallest and largest stored shorter side a request may ask for.
pub const MIN_SHORTER_SIDE: u32 = 64;
pub const MAX_SHORTER_SIDE: u32 = MAX_SIZE;

/// What a stream asks of the tier.
#[derive(Clone, Debug)]
pub struct TierRequest {
    pub form: SourceForm,
    /// Where sources are kept; `None`: derived for every sample, not kept.
    pub cache: Option<Arc<DecodedCache>>,
}

impl TierRequest {
    /// One sample's output, defined from its stored source. `record` names
    /// the sample for the cache (`None`: not cached, e.g. a loose object
    /// without an ETag to tell a changed one by).
    #[allow(clippy::too_many_arguments)]
    pub fn output(
        &self,
        decoder: &dyn Decoder,
        budget: &ScratchBudget,
        format: ImageFormat,
        data: &[u8],
        spec: &OutputSpec,
        key: &SampleKey,
        record: Option<&str>,
        out: &mut [u8],
    ) -> Result<CropBox, DecodeError> {
        let cache = self.cache.as_ref().zip(record);
        // A transform with no randomness (center crop or stretch, no flip)
        // makes the same output every epoch: it is kept too, and later
        // epochs are a copy.
        let output_record = cache
            .filter(|_| is_deterministic(spec))
            .map(|(cache, record)| (cache, output_record(record, spec)));
        if let Some((cache, name)) = &output_record {
            if let Some(kept) = cache.get(name, &self.form) {
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
            let source = match cache.and_then(|(cache, record)| cache.get(record, &self.form)) {
                Some(source) => source,
                None => {
                    let source = derive_source_with(decoder, format, data, &self.form)?;
                    if let Some((cache, record)) = cache {
                        cache.put(record, &self.form, &source);
                    }
                    source
                }
            };
            let crop = spec.crop_box(source.original_width, source.original_height, key);
            output_from_source(&source, spec, &crop, out)?;
            Ok((crop, source.original_width, source.original_height))
        })?;
        let (crop, original_width, original_height) = crop;
        if let Some((cache, name)) = &output_record {
            let kept = StoredSource {
                kind: self.form.kind,
                width: spec.width,
                height: spec.height,
                original_width,
                original_height,
                bytes: out.to_vec(),
            };
            cache.put(name, &self.form, &kept);
        }
        Ok(crop)
    }
}

/// Whether `spec` gives a sample the same output every epoch.
fn is_deterministic(spec: &OutputSpec) -> bool {
    spec.flip == 0.0 && matches!(spec.crop, Crop::Center { .. } | Crop::Stretch)
}

/// The record of a sample's final output under `spec` (see
/// [`TierRequest::output`]).
fn output_record(record: &str, spec: &OutputSpec) -> String {
    format!(
        "{record}\noutput {}x{} {:?}",
        spec.width, spec.height, spec.crop
    )
}
