//! The deliveries where the client decodes: one file per mode, declared
//! and given its row here. A mode ([`ClientDecodes`], in `../mode.rs`) says
//! what its request asks beyond the share, which samples it sends in a
//! client form (and in which form, how long), and how such a sample's slot
//! is filled. Everything else of an encoded delivery is the same for every
//! mode and written once in the parent folder: the share and its tuner,
//! the placement, the wire, the substitution of failures and the metrics.
//!
//! A new mode touches its file here, its `mod` line and row below, its
//! `Delivery` value (and a `SampleForm` value if its bytes are a new form)
//! in `shardfeed.proto`, and its rows in the Python client's `_modes.py`
//! (its name, and its form's decoder).

mod baseline_jpeg;

use super::error::DeliveryError;
use super::mode::{ClientDecodes, ClientSample, FormLimits};
use crate::proto::v1 as pb;
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
            /// Every mode, in table order (the table's own test).
            #[cfg(test)]
            const ALL: &'static [ClientMode] = &[$(ClientMode::$variant),+];

            /// The mode a request's `delivery` asks for; None for decoded
            /// delivery.
            pub fn from_wire(delivery: pb::Delivery) -> Option<Self> {
                $(if delivery == <$mode as ClientDecodes>::WIRE {
                    return Some(Self::$variant);
                })+
                None
            }

            /// The request's `delivery` value (the table's own test).
            #[cfg(test)]
            fn wire(self) -> pb::Delivery {
                match self {
                    $(Self::$variant => <$mode as ClientDecodes>::WIRE),+
                }
            }

            /// See [`ClientDecodes::check`].
            pub fn check(self, request: &pb::StreamBatchesRequest) -> Result<(), DeliveryError> {
                match self {
                    $(Self::$variant => <$mode as ClientDecodes>::check(request)),+
                }
            }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_delivery_value_is_decoded_or_one_mode() {
        let mut seen = Vec::new();
        for value in 0..64 {
            let Ok(delivery) = pb::Delivery::try_from(value) else {
                continue;
            };
            match ClientMode::from_wire(delivery) {
                None => assert_eq!(delivery, pb::Delivery::Decoded, "{delivery:?} has no row"),
                Some(mode) => {
                    assert_eq!(mode.wire(), delivery);
                    seen.push(mode);
                }
            }
        }
        assert_eq!(seen, ClientMode::ALL, "each row has its own delivery value");
    }
}
