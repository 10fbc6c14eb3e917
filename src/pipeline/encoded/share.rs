//! The share of each batch a stream's server decodes, fixed or tuned.

use std::time::Duration;

use super::delivery::Delivery;
use super::loop_waits::Listener;
use super::modes::ClientMode;
use super::seek::{RateSeeker, SearchState};

/// What one batch is placed with: its stream's mode and the share the
/// server decodes at the batch's submission.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchShare {
    pub mode: ClientMode,
    pub server_fraction: f64,
}

/// The share of each batch a stream's server decodes: fixed by the request,
/// or (tuned) sought for the client's rate by a [`RateSeeker`]. One per
/// stream, owned by its dispatch: each batch is placed with the share at
/// its submission.
#[derive(Debug, PartialEq)]
pub struct ServerShare {
    mode: ClientMode,
    fixed: f64,
    seeker: Option<RateSeeker>,
    /// Where a tuned stream hears its client's loop (None: fixed, or too
    /// many streams listen: the search goes by the rate alone).
    listener: Option<Listener>,
}

impl ServerShare {
    /// The share a stream of `delivery` starts with (None: decoded delivery).
    pub fn of(delivery: Delivery) -> Option<Self> {
        match delivery {
            Delivery::Decoded => None,
            Delivery::Encoded {
                mode,
                server_fraction,
                tuned,
                search,
            } => Some(Self {
                mode,
                fixed: server_fraction.unwrap_or(0.0).clamp(0.0, 1.0),
                seeker: tuned.then(|| {
                    search.map_or_else(|| RateSeeker::new(server_fraction), RateSeeker::resume)
                }),
                listener: tuned.then(Listener::open).flatten(),
            }),
        }
    }

    /// The share to place the next batch with.
    pub fn get(&self) -> f64 {
        self.seeker.as_ref().map_or(self.fixed, RateSeeker::share)
    }

    /// The next batch's mode and share.
    pub fn batch(&self) -> BatchShare {
        BatchShare {
            mode: self.mode,
            server_fraction: self.get(),
        }
    }

    /// Where a tuned share's search stands (None: fixed).
    pub fn search(&self) -> Option<SearchState> {
        let loop_id = self.listener.as_ref().map_or(0, Listener::id);
        self.seeker.as_ref().map(|seeker| SearchState {
            loop_id,
            ..seeker.state()
        })
    }

    /// After each batch handed on (see [`RateSeeker::handed`]).
    pub(crate) fn handed(&mut self, samples: usize, interval: Duration, in_flight: usize) {
        if let Some(seeker) = &mut self.seeker {
            let loop_totals = self.listener.as_ref().and_then(Listener::totals);
            seeker.handed(samples, interval, in_flight, loop_totals);
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
        assert_eq!(fixed.search(), None, "a fixed share settles nowhere");
        let tuned = |server_fraction| {
            ServerShare::of(Delivery::Encoded {
                mode: ClientMode::BaselineJpeg,
                server_fraction,
                tuned: true,
                search: None,
            })
            .unwrap()
        };
        assert_eq!(tuned(Some(0.7)).get(), 0.7);
        assert_eq!(tuned(None).get(), 0.5, "no start: the middle");
        // A search carried from another stream wins over the start.
        let carried = SearchState {
            center: 0.25,
            step: 0.125,
            hold: 10,
            next_hold: 64,
            loop_id: 0,
            noise: Some(0.1),
        };
        let going_on = ServerShare::of(Delivery::Encoded {
            mode: ClientMode::BaselineJpeg,
            server_fraction: Some(0.9),
            tuned: true,
            search: Some(carried),
        })
        .unwrap();
        assert_eq!(going_on.get(), 0.25);
        let search = going_on.search().unwrap();
        assert_ne!(search.loop_id, 0, "a tuned stream listens for its loop");
        assert_eq!(
            SearchState {
                loop_id: 0,
                ..search
            },
            carried
        );
        assert_eq!(ServerShare::of(Delivery::Decoded), None);
    }
}
