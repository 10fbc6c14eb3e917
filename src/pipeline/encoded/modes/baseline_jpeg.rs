//! `DELIVERY_ENCODED`: baseline JPEGs go as their compressed bytes, for any
//! JPEG decoder (nvJPEG, libjpeg-turbo) to take.
//!
//! A sample goes compressed only when its headers say any JPEG decoder
//! takes it (baseline, 8-bit, grey or YCbCr: [`JpegFrame::is_baseline`]),
//! its scans are well-formed ([`decode::check_jpeg_complete`]: a decoder
//! that would take corrupt entropy-coded data the server's refuses must
//! not see it), it is within the server's pixel and scratch limits and it
//! is no longer than its decoded pixels.

use super::super::mode::{ClientDecodes, ClientForm, ClientSample, FormLimits};
use crate::decode::{self, JpegFrame};
use crate::shard::ImageFormat;

pub struct BaselineJpeg;

impl ClientDecodes for BaselineJpeg {
    fn client_form(format: ImageFormat, data: &[u8], limits: FormLimits) -> Option<ClientSample> {
        if format != ImageFormat::Jpeg || data.len() > limits.slot_bytes {
            return None;
        }
        let frame: JpegFrame = decode::jpeg_frame(data)?;
        let pixels = u64::from(frame.width) * u64::from(frame.height);
        let within = pixels <= decode::MAX_SOURCE_PIXELS
            && pixels * decode::SCRATCH_BYTES_PER_PIXEL <= limits.scratch_limit;
        (frame.is_baseline() && within && decode::check_jpeg_complete(data).is_ok()).then_some(
            ClientSample {
                form: ClientForm::Jpeg,
                source_width: frame.width,
                source_height: frame.height,
                length: data.len(),
            },
        )
    }
}
