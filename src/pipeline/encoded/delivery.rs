//! What a request asks of a stream's delivery.

use super::modes::ClientMode;
use super::seek::SearchState;

/// How a stream's images reach the client: plain data a request carries.
/// The share a running stream decodes lives in its [`ServerShare`](super::ServerShare).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Delivery {
    /// Every image decoded, cropped, resized and flipped here.
    #[default]
    Decoded,
    /// The samples `mode` takes sent in the client's form, with their box
    /// and flip, for the client to decode; `server_fraction` of each batch
    /// decoded here (unset: 0), or when `tuned`, sought as the stream runs
    /// from there (unset: from the middle, in coarse steps).
    Encoded {
        mode: ClientMode,
        server_fraction: Option<f64>,
        tuned: bool,
        /// Tuned: a search another stream of the client left, to go on
        /// from in place of starting at `server_fraction`.
        search: Option<SearchState>,
    },
}

impl Delivery {
    /// Baseline JPEGs sent compressed, a fixed share decoded by the server.
    pub fn encoded(server_fraction: f64) -> Self {
        Self::Encoded {
            mode: ClientMode::BaselineJpeg,
            server_fraction: Some(server_fraction),
            tuned: false,
            search: None,
        }
    }

    /// This delivery for a stream whose ops a client decoder may not all
    /// apply (`client_replays` false): then the server decodes every
    /// sample, still sent as an encoded batch, and no share is sought.
    pub fn for_ops(self, client_replays: bool) -> Self {
        match self {
            Self::Encoded { mode, .. } if !client_replays => Self::Encoded {
                mode,
                server_fraction: Some(1.0),
                tuned: false,
                search: None,
            },
            other => other,
        }
    }
}
