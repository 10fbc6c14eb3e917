//! Where a sample of an encoded batch lies, and in which form.

use super::mode::ClientSample;
use super::modes::ClientMode;

/// Where one sample is in a batch's bytes, and in which form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub offset: usize,
    pub length: usize,
    /// The sample in a client form, by the mode that fills it; None: its
    /// final pixels, `spec.bytes()` long.
    pub client: Option<ClientSlot>,
}

/// A sample a mode sends in the client's form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSlot {
    pub mode: ClientMode,
    pub sample: ClientSample,
}

impl Placement {
    /// Final pixels, decoded here.
    pub fn decoded(&self) -> bool {
        self.client.is_none()
    }
}
