//! Encoded delivery: which samples of a batch the server decodes and which
//! it sends in a client form for the client to decode, and where each lies
//! in the batch's bytes.
//!
//! Which samples can go in a client form, and in which, is the mode's
//! (`modes/`, one file per mode, under the rules of `mode.rs`: baseline
//! JPEGs today). Of those, the server decodes `server_fraction`, chosen by
//! a hash of each sample's identity, and every sample whose own decisions
//! would take a client's decode past the tolerance (a threshold op:
//! [`OutputSpec::decoded_by_server_alone`]). Every rule reads the sample
//! alone, so
//! at a fixed share which side decodes a sample does not depend on its
//! batch, the world size or the resume point; and since no client form is
//! longer than a decoded slot, an encoded batch is never larger than a
//! decoded one: it fits the same ring slot and memory formula.
//!
//! Everything of the feature but its wire is here: the modes (`mode.rs`,
//! `modes/`), the placement (this file, of the [`Placement`] in
//! `placement.rs`), the share a stream decodes (`share.rs`) and its tuner
//! (`seek.rs`); the pipeline calls [`place`] for each batch, fills each
//! client slot by its [`ClientMode`], and hands [`ServerShare`] each
//! batch's pace. The server reads a request's delivery into a [`Delivery`]
//! and writes a batch's placements and search (`server/delivery.rs`).

mod delivery;
mod error;
pub mod loop_waits;
mod mode;
mod modes;
mod placement;
mod seek;
mod share;

use super::sample::EmittedSample;
use crate::decode::{OutputSpec, Views};
use crate::hash::fmix64;

pub use delivery::Delivery;
pub use error::DeliveryError;
pub use mode::{ClientForm, ClientSample};
pub use modes::ClientMode;
pub use placement::{ClientSlot, Placement};
pub use seek::SearchState;
pub use share::{BatchShare, ServerShare};

use mode::FormLimits;

/// Where every sample of a batch goes, and the batch's length in bytes.
/// `share`: the mode and server share of an encoded delivery (None:
/// decoded delivery).
pub(super) fn place(
    samples: &[EmittedSample],
    share: Option<BatchShare>,
    spec: &OutputSpec,
    scratch_limit: u64,
) -> (Vec<Placement>, usize) {
    let slot_bytes = spec.bytes();
    let Some(share) = share else {
        let placements = (0..samples.len())
            .map(|slot| Placement {
                offset: slot * slot_bytes,
                length: slot_bytes,
                client: None,
            })
            .collect();
        return (placements, samples.len() * slot_bytes);
    };
    let limits = FormLimits {
        slot_bytes,
        scratch_limit,
    };
    let mut offset = 0;
    let placements = samples
        .iter()
        .map(|emitted| {
            let client = chosen_client(emitted, share, limits, |key| {
                spec.decoded_by_server_alone(key)
            });
            let placement = Placement {
                offset,
                length: client.map_or(slot_bytes, |slot| slot.sample.length),
                client,
            };
            offset += placement.length;
            placement
        })
        .collect();
    (placements, offset)
}

/// Where every sample of a batch of views goes, by the same rules as
/// [`place`]: a sample the client decodes has its compressed bytes at the
/// start of `places[slot]` (one view's place, at most `place_bytes` long,
/// the client form bounded by it), its other views' places left for the
/// client to fill; a sample the server decodes points at that same place,
/// its views all final in the batch. A sample with any view whose
/// decisions are the server's alone ([`Views::decoded_by_server_alone`])
/// is the server's.
pub(super) fn place_views(
    samples: &[EmittedSample],
    share: BatchShare,
    views: &Views,
    places: impl Iterator<Item = usize>,
    place_bytes: usize,
    scratch_limit: u64,
) -> Vec<Placement> {
    let limits = FormLimits {
        slot_bytes: place_bytes,
        scratch_limit,
    };
    samples
        .iter()
        .zip(places)
        .map(|(emitted, offset)| {
            let client = chosen_client(emitted, share, limits, |key| {
                views.decoded_by_server_alone(key)
            });
            Placement {
                offset,
                length: client.map_or(place_bytes, |slot| slot.sample.length),
                client,
            }
        })
        .collect()
}

/// The sample in the share's client form when the client decodes it: not
/// drawn for the server by the share, not the server's by its own
/// decisions (`server_alone`), and taken by the mode.
fn chosen_client(
    emitted: &EmittedSample,
    share: BatchShare,
    limits: FormLimits,
    server_alone: impl FnOnce(&crate::decode::SampleKey) -> bool,
) -> Option<ClientSlot> {
    // The share's draw first: it is cheaper than the ops' draw and the
    // mode's checks.
    (!server_decodes(emitted.identity(), share.server_fraction)
        && !server_alone(&emitted.augment_key()))
    .then(|| client_slot(emitted, share.mode, limits))
    .flatten()
}

/// The sample in `mode`'s client form, else None: one that could not be
/// read, or that the mode leaves to the server.
fn client_slot(
    emitted: &EmittedSample,
    mode: ClientMode,
    limits: FormLimits,
) -> Option<ClientSlot> {
    if emitted.sample.unreadable.is_some() {
        return None;
    }
    let (format, data) = emitted.sample.image.as_ref()?;
    let sample = mode.client_form(*format, data, limits)?;
    // A mode's promise, kept whatever a mode says: a batch within a decoded
    // one. (A client slot is told from pixels by its form, which has no
    // pixels value.)
    (sample.length <= limits.slot_bytes).then_some(ClientSlot { mode, sample })
}

/// Salts a sample's identity for the share, so that which side decodes a
/// sample is uncorrelated with its augmentation (keyed by the same
/// identity). Frozen: changing it moves which samples the server decodes.
const SHARE_SALT: u64 = 0x5f0e_d1de_c0de_5a1e;

/// Whether the server decodes a sample the client could, at `fraction`: a
/// uniform draw from the sample's identity against the share, so the
/// choice is the sample's own (the same at any world size and resume
/// point) and a batch's server share is `fraction` on average.
fn server_decodes(identity: u64, fraction: f64) -> bool {
    let draw = (fmix64(identity ^ SHARE_SALT) >> 11) as f64 / (1u64 << 53) as f64;
    draw < fraction
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_is_drawn_per_sample_and_grows_with_the_fraction() {
        let identities: Vec<u64> = (0..20_000u64)
            .map(|n| crate::decode::augment::sample_identity("shard-000", &format!("k{n}")))
            .collect();
        let decoded_at = |fraction: f64| -> Vec<bool> {
            identities
                .iter()
                .map(|&identity| server_decodes(identity, fraction))
                .collect()
        };
        assert!(decoded_at(0.0).iter().all(|&d| !d), "share 0: none");
        assert!(decoded_at(1.0).iter().all(|&d| d), "share 1: all");
        let mut previous = decoded_at(0.0);
        for fraction in [0.1, 0.25, 0.5, 0.77, 0.9] {
            let now = decoded_at(fraction);
            let share = now.iter().filter(|&&d| d).count() as f64 / now.len() as f64;
            assert!((share - fraction).abs() < 0.015, "{fraction}: {share}");
            // A larger share keeps every sample a smaller one gave the server.
            assert!(previous.iter().zip(&now).all(|(&was, &is)| !was || is));
            previous = now;
        }
    }
}
