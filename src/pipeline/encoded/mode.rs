//! What a delivery where the client decodes must say: the rules each mode
//! of `modes/` follows.

use crate::shard::ImageFormat;

/// What bounds a client form: the server's own decode's, so that a batch
/// never outgrows a decoded one and the client never decodes what the
/// server would refuse.
#[derive(Debug, Clone, Copy)]
pub struct FormLimits {
    /// A decoded sample's bytes, the most a sample may take in any form.
    pub slot_bytes: usize,
    /// The server's decode scratch budget, in bytes.
    pub scratch_limit: u64,
}

/// The bytes a client-form sample is (its `SampleForm` on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientForm {
    /// A baseline JPEG, as read.
    Jpeg,
}

/// A sample as its mode sends it to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSample {
    pub form: ClientForm,
    /// The size the client decodes it to (the crop box is in these pixels).
    pub source_width: u32,
    pub source_height: u32,
    /// Its bytes in the batch, at most [`FormLimits::slot_bytes`].
    pub length: usize,
}

/// One delivery where the client decodes.
pub trait ClientDecodes {
    /// The sample in the client's form, or None when the server decodes it.
    /// Admits only what the server's own decode would take (an image it
    /// would refuse is left to it, to be substituted exactly as a decoded
    /// delivery substitutes it) and what [`fill`](Self::fill) cannot fail
    /// on: a failure is substituted from a pixel slot only.
    fn client_form(format: ImageFormat, data: &[u8], limits: FormLimits) -> Option<ClientSample>;

    /// Writes a sample [`client_form`](Self::client_form) admitted into its
    /// region, `length` bytes. By default its bytes as read.
    fn fill(data: &[u8], out: &mut [u8]) {
        out.copy_from_slice(data);
    }
}
