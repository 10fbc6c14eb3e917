//! Encoded delivery on the wire, both ways: a request's delivery, share
//! and search checked into the pipeline's [`Delivery`], and a batch's
//! placements and search state written into its message. The delivery
//! values' table ([`mode_of`]) is here: a new mode is a row of it and of
//! [`form_to_wire`] when its bytes are a new form.

use super::pb;
use crate::pipeline::encoded::{ClientForm, ClientMode, Delivery, DeliveryError};
use crate::pipeline::encoded::{Placement, SearchState};

/// The mode a request's `delivery` asks for; None for decoded delivery.
fn mode_of(delivery: pb::Delivery) -> Option<ClientMode> {
    match delivery {
        pb::Delivery::Decoded => None,
        pb::Delivery::Encoded => Some(ClientMode::BaselineJpeg),
    }
}

fn form_to_wire(form: ClientForm) -> pb::SampleForm {
    match form {
        ClientForm::Jpeg => pb::SampleForm::Jpeg,
    }
}

/// The request's delivery, checked.
pub fn delivery_from_wire(request: &pb::StreamBatchesRequest) -> Result<Delivery, DeliveryError> {
    let invalid = |field: &'static str, message: String| Err(DeliveryError { field, message });
    let server_fraction = request.server_decode_fraction;
    let Ok(delivery) = pb::Delivery::try_from(request.delivery) else {
        return invalid("delivery", format!("unknown delivery {}", request.delivery));
    };
    let Some(mode) = mode_of(delivery) else {
        if server_fraction.is_some()
            || request.tune_server_decode
            || request.server_decode_search.is_some()
        {
            let field = if server_fraction.is_some() {
                "server_decode_fraction"
            } else if request.tune_server_decode {
                "tune_server_decode"
            } else {
                "server_decode_search"
            };
            return invalid(
                field,
                "server_decode_fraction and tune_server_decode are for a delivery the client \
                 decodes (DELIVERY_ENCODED); leave them unset"
                    .into(),
            );
        }
        return Ok(Delivery::Decoded);
    };
    if let Some(fraction) = server_fraction.filter(|f| !(0.0..=1.0).contains(f)) {
        return invalid(
            "server_decode_fraction",
            format!("server_decode_fraction {fraction} is outside 0..=1"),
        );
    }
    if request
        .decoded_source
        .as_ref()
        .is_some_and(|tier| tier.shorter_side != 0)
    {
        return invalid(
            "decoded_source",
            format!(
                "decoded_source and delivery = {} conflict: the client decodes from the \
                 original images; set one of them",
                delivery.as_str_name()
            ),
        );
    }
    let search = request.server_decode_search.as_ref().map(search_from_wire);
    if let Some(search) = search {
        if !request.tune_server_decode {
            return invalid(
                "server_decode_search",
                "server_decode_search goes on with a tuned share's search: set \
                 tune_server_decode, or leave it unset"
                    .into(),
            );
        }
        if let Some(why) = search.invalid() {
            return invalid(
                "server_decode_search",
                format!("server_decode_search: {why}"),
            );
        }
    }
    Ok(Delivery::Encoded {
        mode,
        server_fraction,
        tuned: request.tune_server_decode,
        search,
    })
}

/// Where each sample lies in an encoded batch's bytes, on the wire.
pub fn placements_to_wire(placements: &[Placement]) -> Vec<pb::EncodedSample> {
    placements
        .iter()
        .map(|placement| {
            let (form, source_width, source_height) = match placement.client {
                Some(slot) => (
                    form_to_wire(slot.sample.form),
                    slot.sample.source_width,
                    slot.sample.source_height,
                ),
                None => (pb::SampleForm::Pixels, 0, 0),
            };
            pb::EncodedSample {
                offset: placement.offset as u64,
                length: placement.length as u64,
                decoded: placement.decoded(),
                source_width,
                source_height,
                form: form as i32,
            }
        })
        .collect()
}

/// A tuned share's search, as the batch reports it for a next stream to
/// go on from.
pub fn search_to_wire(search: &SearchState) -> pb::ShareSearch {
    pb::ShareSearch {
        center: search.center,
        step: search.step,
        hold: search.hold,
        next_hold: search.next_hold,
        loop_id: search.loop_id,
        noise: search.noise,
    }
}

/// A search a request hands back, not yet checked.
fn search_from_wire(search: &pb::ShareSearch) -> SearchState {
    SearchState {
        center: search.center,
        step: search.step,
        hold: search.hold,
        next_hold: search.next_hold,
        // A new stream listens anew.
        loop_id: 0,
        noise: search.noise,
    }
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
            match mode_of(delivery) {
                None => assert_eq!(delivery, pb::Delivery::Decoded, "{delivery:?} has no row"),
                Some(mode) => seen.push(mode),
            }
        }
        assert_eq!(
            seen,
            ClientMode::ALL,
            "each mode has its own delivery value"
        );
    }
}
