//! Encoded delivery: which samples of a batch the server decodes and which
//! it sends compressed for the client to decode, and where each lies in
//! the batch's bytes.
//!
//! A sample goes compressed only when its headers say any JPEG decoder
//! takes it (baseline, 8-bit, grey or YCbCr: [`JpegFrame::is_baseline`])
//! and it is within the pixel limit. Of the rest of the batch, the server
//! decodes `server_fraction` (spread evenly over the slots, counting the
//! images it had to decode anyway), then every image that would take the
//! batch past its decoded size. So an encoded batch is never larger than
//! a decoded one: it fits the same ring slot and the same memory formula.

use std::time::Duration;

use super::sample::EmittedSample;
use super::seek::RateSeeker;
use crate::decode::{self, JpegFrame};
use crate::shard::ImageFormat;

/// How a stream's images reach the client: plain data a request carries.
/// The share a running stream decodes lives in its [`ServerShare`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Delivery {
    /// Every image decoded, cropped, resized and flipped here.
    #[default]
    Decoded,
    /// Baseline JPEGs compressed, with their box and flip, for the client
    /// to decode; `server_fraction` of each batch decoded here (unset: 0),
    /// or when `tuned`, sought as the stream runs from there (unset: from
    /// the middle, in coarse steps).
    Encoded {
        server_fraction: Option<f64>,
        tuned: bool,
    },
}

impl Delivery {
    /// A fixed share decoded by the server.
    pub fn encoded(server_fraction: f64) -> Self {
        Self::Encoded {
            server_fraction: Some(server_fraction),
            tuned: false,
        }
    }
}

/// The share of each batch a stream's server decodes: fixed by the request,
/// or (tuned) sought for the client's rate by a [`RateSeeker`]. One per
/// stream, owned by its dispatch: each batch is placed with the share at
/// its submission.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerShare {
    fixed: f64,
    seeker: Option<RateSeeker>,
}

impl ServerShare {
    /// The share a stream of `delivery` starts with (None: decoded delivery).
    pub fn of(delivery: Delivery) -> Option<Self> {
        match delivery {
            Delivery::Decoded => None,
            Delivery::Encoded {
                server_fraction,
                tuned,
            } => Some(Self {
                fixed: server_fraction.unwrap_or(0.0).clamp(0.0, 1.0),
                seeker: tuned.then(|| RateSeeker::new(server_fraction)),
            }),
        }
    }

    /// The share to place the next batch with.
    pub fn get(&self) -> f64 {
        self.seeker.as_ref().map_or(self.fixed, RateSeeker::share)
    }

    /// A tuned share's best so far (None: fixed).
    pub fn settled(&self) -> Option<f64> {
        self.seeker.as_ref().map(RateSeeker::settled)
    }

    /// After each batch handed on (see [`RateSeeker::handed`]).
    pub(super) fn handed(&mut self, samples: usize, interval: Duration, in_flight: usize) {
        if let Some(seeker) = &mut self.seeker {
            seeker.handed(samples, interval, in_flight);
        }
    }
}

/// Where one sample is in a batch's bytes, and in which form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub offset: usize,
    pub length: usize,
    /// Final pixels (`spec.bytes()` long); else the compressed JPEG.
    pub decoded: bool,
    /// The compressed image's size (0 for decoded slots).
    pub source_width: u32,
    pub source_height: u32,
}

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
    let mut frames: Vec<Option<JpegFrame>> = samples
        .iter()
        .map(|emitted| client_decodable(emitted, scratch_limit))
        .collect();
    server_share(&mut frames, server_fraction);
    // Compressed while the bytes so far stay within as many decoded slots.
    let (mut compressed, mut compressed_bytes) = (0usize, 0usize);
    let mut placements = Vec::with_capacity(samples.len());
    let mut offset = 0;
    for (emitted, frame) in samples.iter().zip(frames) {
        let data = frame.and_then(|_| emitted.sample.image.as_ref().map(|(_, data)| data.len()));
        let placement = match (frame, data) {
            (Some(frame), Some(length))
                if compressed_bytes + length <= (compressed + 1) * slot_bytes =>
            {
                compressed += 1;
                compressed_bytes += length;
                Placement {
                    offset,
                    length,
                    decoded: false,
                    source_width: frame.width,
                    source_height: frame.height,
                }
            }
            _ => Placement {
                offset,
                length: slot_bytes,
                decoded: true,
                source_width: 0,
                source_height: 0,
            },
        };
        offset += placement.length;
        placements.push(placement);
    }
    (placements, offset)
}

/// The frame of an image the client can decode, else None. An image the
/// server's own decode would refuse (too many pixels, more decode memory
/// than the server's scratch budget, cut short) is left to the server,
/// whose decode refuses it and substitutes it exactly as a decoded delivery
/// does: both deliveries substitute the same samples, and the client never
/// decodes more than the server would.
fn client_decodable(emitted: &EmittedSample, scratch_limit: u64) -> Option<JpegFrame> {
    if emitted.sample.unreadable.is_some() {
        return None;
    }
    let (ImageFormat::Jpeg, data) = emitted.sample.image.as_ref()? else {
        return None;
    };
    let frame = decode::jpeg_frame(data)?;
    let pixels = u64::from(frame.width) * u64::from(frame.height);
    let within = pixels <= decode::MAX_SOURCE_PIXELS
        && pixels * decode::SCRATCH_BYTES_PER_PIXEL <= scratch_limit;
    (frame.is_baseline() && within && decode::check_jpeg_complete(data).is_ok()).then_some(frame)
}

/// Takes slots from the client (sets them None) until the server decodes
/// `round(fraction * n)` of them, counting those it must; the slots taken
/// are spread evenly over the client's.
fn server_share(frames: &mut [Option<JpegFrame>], fraction: f64) {
    let wanted = (fraction.clamp(0.0, 1.0) * frames.len() as f64).round() as usize;
    let client: Vec<usize> = (0..frames.len())
        .filter(|&slot| frames[slot].is_some())
        .collect();
    let forced = frames.len() - client.len();
    let extra = wanted.saturating_sub(forced);
    if extra == 0 {
        return;
    }
    let candidates = client.len();
    for (rank, &slot) in client.iter().enumerate() {
        // The rank-th candidate is taken when it crosses a multiple of
        // candidates / extra: exactly `extra` of them, evenly apart.
        if (rank + 1) * extra / candidates > rank * extra / candidates {
            frames[slot] = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_share_stays_and_a_tuned_one_starts_where_asked() {
        let mut fixed = ServerShare::of(Delivery::encoded(0.3)).unwrap();
        for _ in 0..100 {
            fixed.handed(128, Duration::from_millis(100), 7);
        }
        assert_eq!(fixed.get(), 0.3);
        assert_eq!(fixed.settled(), None);
        let tuned = |server_fraction| {
            ServerShare::of(Delivery::Encoded {
                server_fraction,
                tuned: true,
            })
            .unwrap()
        };
        assert_eq!(tuned(Some(0.7)).get(), 0.7);
        assert_eq!(tuned(None).get(), 0.5, "no start: the middle");
        assert_eq!(ServerShare::of(Delivery::Decoded), None);
    }

    fn frame() -> Option<JpegFrame> {
        Some(JpegFrame {
            width: 8,
            height: 8,
            process: 0,
            precision: 8,
            components: 3,
        })
    }

    #[test]
    fn the_server_share_counts_forced_slots_and_spreads_the_rest() {
        let mut frames = vec![frame(); 8];
        server_share(&mut frames, 0.5);
        let taken: Vec<usize> = (0..8).filter(|&s| frames[s].is_none()).collect();
        assert_eq!(taken, [1, 3, 5, 7]);

        let mut frames = vec![frame(); 8];
        frames[0] = None;
        frames[1] = None;
        frames[2] = None;
        server_share(&mut frames, 0.25);
        assert_eq!(
            frames.iter().filter(|f| f.is_none()).count(),
            3,
            "forced slots already exceed the share"
        );

        for fraction in [0.0, 0.1, 0.3, 0.77, 1.0] {
            let mut frames = vec![frame(); 128];
            frames[5] = None;
            server_share(&mut frames, fraction);
            let server = frames.iter().filter(|f| f.is_none()).count();
            assert_eq!(
                server,
                ((fraction * 128.0).round() as usize).max(1),
                "fraction {fraction}"
            );
        }
    }
}
