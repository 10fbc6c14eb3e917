//! A decoder that decodes nothing: it writes a fixed pseudo-random pattern
//! into each output image. With datasets of tiny images it turns the whole
//! server into a synthetic in-memory batch source, so a benchmark measures
//! the transport to the trainer (inline bytes or shared memory) and not the
//! JPEG kernel: producing a batch costs one write of its bytes, the least any
//! real decoder pays.

use std::sync::OnceLock;

use crate::decode::{CropBox, DecodeError, Decoder, OutputSpec};
use crate::plan::rng::Rng;
use crate::shard::ImageFormat;

/// Small enough to stay in L2, as a real decoder's output rows do.
const PATTERN_BYTES: usize = 256 << 10;

pub const COPY_DECODER: &str = "copy (synthetic: no decode)";

#[derive(Debug, Default, Clone, Copy)]
pub struct CopyDecoder;

fn pattern() -> &'static [u8] {
    static PATTERN: OnceLock<Vec<u8>> = OnceLock::new();
    PATTERN.get_or_init(|| {
        let mut rng = Rng::derive(&[PATTERN_BYTES as u64]);
        (0..PATTERN_BYTES).map(|_| rng.next_u64() as u8).collect()
    })
}

impl Decoder for CopyDecoder {
    fn name(&self) -> &'static str {
        COPY_DECODER
    }

    fn decode_into(
        &self,
        _format: ImageFormat,
        data: &[u8],
        _spec: &OutputSpec,
        _crop: &CropBox,
        out: &mut [u8],
    ) -> Result<(), DecodeError> {
        // Start where the sample's size says, so images differ from each other.
        let pattern = pattern();
        let mut start = data.len() % PATTERN_BYTES;
        for chunk in out.chunks_mut(PATTERN_BYTES) {
            let len = chunk.len();
            let take = len.min(PATTERN_BYTES - start);
            chunk[..take].copy_from_slice(&pattern[start..start + take]);
            chunk[take..].copy_from_slice(&pattern[..len - take]);
            start = 0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_every_byte_from_the_pattern_at_the_sample_offset() {
        let spec = OutputSpec::center(4, 4);
        let crop = CropBox {
            left: 0.0,
            top: 0.0,
            width: 4.0,
            height: 4.0,
            flipped: false,
        };
        let mut out = vec![0u8; PATTERN_BYTES + 100];
        CopyDecoder
            .decode_into(ImageFormat::Jpeg, &[0; 7], &spec, &crop, &mut out)
            .unwrap();
        let pattern = pattern();
        assert_eq!(out[..PATTERN_BYTES - 7], pattern[7..]);
        assert_eq!(out[PATTERN_BYTES - 7..PATTERN_BYTES], pattern[..7]);
        assert_eq!(out[PATTERN_BYTES..], pattern[..100]);
    }
}
