//! Encoded delivery: which samples of a batch the server decodes and which
//! it sends compressed for the client to decode, and where each lies in
//! the batch's bytes.
//!
//! A sample goes compressed only when its headers say any JPEG decoder
//! takes it (baseline, 8-bit, grey or YCbCr: [`JpegFrame::is_baseline`]),
//! its scans are well-formed ([`decode::check_jpeg_complete`]: a decoder
//! that would take corrupt entropy-coded data the server's refuses must
//! not see it), it is within the pixel limit and it is no longer than its
//! decoded pixels. Of those, the server decodes `server_fraction`, chosen
//! by a hash of each sample's identity. Every rule reads the sample alone,
//! so at a fixed share which side decodes a sample does not depend on its
//! batch, the world size or the resume point; and since no compressed
//! image is longer than a decoded slot, an encoded batch is never larger
//! than a decoded one: it fits the same ring slot and memory formula.
//!
//! Everything of the feature is here: the placement (this file, of the
//! [`Placement`] in `placement.rs`), the share a stream decodes
//! (`share.rs`) and its tuner (`seek.rs`), and its wire both ways
//! (`wire.rs`: a request's delivery checked, a batch's placements and
//! search written); the pipeline calls [`place`] for each batch and hands
//! [`ServerShare`] each batch's pace, the server calls `wire`.

mod delivery;
mod placement;
mod seek;
mod share;
pub mod wire;

use super::sample::EmittedSample;
use crate::decode::{self, JpegFrame};
use crate::hash::fmix64;
use crate::shard::ImageFormat;

pub use delivery::Delivery;
pub use placement::Placement;
pub use seek::SearchState;
pub use share::ServerShare;

/// Where every sample of a batch goes, and the batch's length in bytes.
/// `server_fraction`: the share the server decodes of an encoded delivery
/// (None: decoded delivery).
pub(super) fn place(
    samples: &[EmittedSample],
    server_fraction: Option<f64>,
    slot_bytes: usize,
    scratch_limit: u64,
) -> (Vec<Placement>, usize) {
    let server_fraction = match server_fraction {
        None => {
            let placements = (0..samples.len())
                .map(|slot| Placement {
                    offset: slot * slot_bytes,
                    length: slot_bytes,
                    decoded: true,
                    source_width: 0,
                    source_height: 0,
                })
                .collect();
            return (placements, samples.len() * slot_bytes);
        }
        Some(fraction) => fraction,
    };
    let mut offset = 0;
    let placements = samples
        .iter()
        .map(|emitted| {
            // The share's draw first: it is cheaper than the scan check.
            let compressed = (!server_decodes(emitted.identity(), server_fraction))
                .then(|| client_decodable(emitted, scratch_limit, slot_bytes))
                .flatten();
            let placement = match compressed {
                Some((frame, length)) => Placement {
                    offset,
                    length,
                    decoded: false,
                    source_width: frame.width,
                    source_height: frame.height,
                },
                None => Placement {
                    offset,
                    length: slot_bytes,
                    decoded: true,
                    source_width: 0,
                    source_height: 0,
                },
            };
            offset += placement.length;
            placement
        })
        .collect();
    (placements, offset)
}

/// The frame and length of an image the client can decode, else None. An
/// image the server's own decode would refuse (too many pixels, more decode
/// memory than the server's scratch budget, cut short, a malformed scan) is
/// left to the server, whose decode refuses it and substitutes it exactly
/// as a decoded delivery does: both deliveries substitute the same samples,
/// and the client never decodes more than the server would. One longer
/// than its decoded pixels (`slot_bytes`) is decoded here too, which keeps
/// every batch within a decoded one's size sample by sample.
fn client_decodable(
    emitted: &EmittedSample,
    scratch_limit: u64,
    slot_bytes: usize,
) -> Option<(JpegFrame, usize)> {
    if emitted.sample.unreadable.is_some() {
        return None;
    }
    let (ImageFormat::Jpeg, data) = emitted.sample.image.as_ref()? else {
        return None;
    };
    if data.len() > slot_bytes {
        return None;
    }
    let frame = decode::jpeg_frame(data)?;
    let pixels = u64::from(frame.width) * u64::from(frame.height);
    let within = pixels <= decode::MAX_SOURCE_PIXELS
        && pixels * decode::SCRATCH_BYTES_PER_PIXEL <= scratch_limit;
    (frame.is_baseline() && within && decode::check_jpeg_complete(data).is_ok())
        .then_some((frame, data.len()))
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
            .map(|n| decode::augment::sample_identity("shard-000", &format!("k{n}")))
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
