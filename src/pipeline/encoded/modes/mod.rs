//! The deliveries where the client decodes: one file per mode, declared
//! and given its row here. A mode ([`ClientDecodes`], in `../mode.rs`) says
//! which samples it sends in a client form (and in which form, how long),
//! and how such a sample's slot is filled. Everything else of an encoded
//! delivery is the same for every mode and written once in the parent
//! folder: the share and its tuner, the placement, the substitution of
//! failures and the metrics; the wire is the server's
//! (`server/delivery.rs`).
//!
//! A new mode touches its file here, its `mod` line and row below, its
//! `Delivery` value (and a `SampleForm` value if its bytes are a new form)
//! in `shardfeed.proto` and their rows in `server/delivery.rs` (a
//! [`super::ClientForm`] value too, for a new form), and its rows in the
//! Python client's `_modes.py` (its name, and its form's decoder).

mod baseline_jpeg;

use super::mode::{ClientDecodes, ClientSample, FormLimits};
use crate::shard::ImageFormat;

/// The table of modes: one row each, `Variant => its type`.
macro_rules! client_modes {
    ($($variant:ident => $mode:ty),+ $(,)?) => {
        /// A delivery where the client decodes, as a stream runs it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum ClientMode {
            $($variant),+
        }

        impl ClientMode {
            /// Every mode, in table order (the wire's table is checked
            /// against it).
            pub const ALL: &'static [ClientMode] = &[$(ClientMode::$variant),+];

            /// See [`ClientDecodes::client_form`].
            pub fn client_form(
                self,
                format: ImageFormat,
                data: &[u8],
                limits: FormLimits,
            ) -> Option<ClientSample> {
                match self {
                    $(Self::$variant => <$mode as ClientDecodes>::client_form(format, data, limits)),+
                }
            }

            /// See [`ClientDecodes::fill`].
            pub fn fill(self, data: &[u8], out: &mut [u8]) {
                match self {
                    $(Self::$variant => <$mode as ClientDecodes>::fill(data, out)),+
                }
            }
        }
    };
}

client_modes! {
    BaselineJpeg => baseline_jpeg::BaselineJpeg,
}
