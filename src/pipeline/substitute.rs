//! What a batch sends in place of a sample that could not be decoded: a
//! good sample of the same batch, chosen by a pure function of the key.

use bytes::Bytes;

use super::encoded::Placement;
use super::sample::EmittedSample;
use crate::metrics;

/// A sample that could not be decoded, and what was sent in its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Substitution {
    pub slot: u32,
    pub reason: String,
    /// The slot whose image and label were copied into this one; `None`
    /// when no sample of the batch decoded (then zeros and label -1).
    pub source: Option<u32>,
}

/// The slot that stands in for the failed sample `key` among the batch's
/// good slots: a pure function of the key and the batch (FNV-1a of the key,
/// then MurmurHash3's 64-bit finalizer so every bit counts), so a rerun
/// substitutes exactly the same way.
pub fn substitute_source(key: &str, good_slots: &[u32]) -> Option<u32> {
    if good_slots.is_empty() {
        return None;
    }
    let hash = crate::hash::fmix64(crate::hash::fnv1a(key.bytes()));
    Some(good_slots[(hash % good_slots.len() as u64) as usize])
}

/// The batch's extra fields, field by field, in slot order; a substituted
/// slot takes its source's, like its image and label.
pub(super) fn batch_fields(
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
pub(super) fn substitute_failures<Crops: Clone + Default>(
    failures: &[Option<(&'static str, String)>],
    samples: &[EmittedSample],
    labels: &mut [i64],
    crops: &mut [Crops],
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
                crops[slot] = crops[from as usize].clone();
            }
            None => {
                labels[slot] = -1;
                crops[slot] = Crops::default();
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
pub(super) fn copy_placed_image(
    images: &mut [u8],
    placements: &mut [Placement],
    slot: usize,
    from: Option<usize>,
) {
    let own = placements[slot];
    let target = own.offset..own.offset + own.length;
    match from.map(|from| placements[from]) {
        Some(source) if source.decoded() => {
            images.copy_within(source.offset..source.offset + source.length, target.start);
        }
        Some(source) => {
            images[target].fill(0);
            placements[slot] = source;
        }
        None => images[target].fill(0),
    }
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
