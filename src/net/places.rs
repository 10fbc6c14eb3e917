//! A listener's places: the connections it holds at once, and which one
//! gives its place up to a newcomer when every place is taken.
//!
//! A place is held only while its connection is used. When the listener is
//! full, the held connection that has gone longest without progress (since
//! it was accepted, a request of it arrived whole, or a call of it ended)
//! and has no call in service (every open call still waiting for its
//! request) is told to close, and the newcomer takes its place. Connections
//! that only open calls and never finish their requests, or sit idle,
//! are what a flood holds; a trainer's stream, a scrape being answered or a
//! probe being checked is in service and never given up. Only when every
//! held connection is in service is a newcomer refused.
//!
//! An evicted connection closes on its next read (it is woken at once); its
//! HTTP/2 state lives until then, so the connections alive are the places
//! plus those closing, each closing within a poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What a place needs to know of the connection holding it.
pub trait Occupant {
    /// Whether a call of it is in service (its request arrived whole).
    fn in_service(&self) -> bool;
    /// When it last made progress, on a clock shared by all connections.
    fn progress_ms(&self) -> u64;
    /// Tells it to close: its place went to a newcomer.
    fn evict(&self);
}

/// The listener's held connections.
#[derive(Debug)]
pub struct Places<O> {
    max: usize,
    held: Mutex<Held<O>>,
}

#[derive(Debug)]
struct Held<O> {
    next_id: u64,
    connections: HashMap<u64, Arc<O>>,
}

/// How a newcomer was admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// A place was free.
    Free,
    /// A held connection gave its place up.
    Evicted,
}

impl<O: Occupant> Places<O> {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            held: Mutex::new(Held {
                next_id: 0,
                connections: HashMap::new(),
            }),
        })
    }

    /// A place for the connection doing `activity`: a free one, or the one
    /// of the held connection longest without progress and with no call
    /// in service, which is told to close; `None` when every held
    /// connection is in service.
    pub fn take(self: &Arc<Self>, activity: &Arc<O>) -> Option<(Place<O>, Admitted)> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let admitted = if held.connections.len() < self.max {
            Admitted::Free
        } else {
            let victim = held
                .connections
                .iter()
                .filter(|(_, held)| !held.in_service())
                .min_by_key(|(id, held)| (held.progress_ms(), **id))
                .map(|(id, _)| *id)?;
            if let Some(evicted) = held.connections.remove(&victim) {
                evicted.evict();
            }
            Admitted::Evicted
        };
        let id = held.next_id;
        held.next_id += 1;
        held.connections.insert(id, activity.clone());
        Some((
            Place {
                places: self.clone(),
                id,
            },
            admitted,
        ))
    }

    /// Connections holding a place now.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .connections
            .len()
    }
}

/// One connection's place, given back when it is dropped (unless it was
/// given to a newcomer already).
#[derive(Debug)]
pub struct Place<O> {
    places: Arc<Places<O>>,
    id: u64,
}

impl<O> Drop for Place<O> {
    fn drop(&mut self) {
        let mut held = self.places.held.lock().unwrap_or_else(|e| e.into_inner());
        held.connections.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::connections::{Activity, CallGuard};

    #[tokio::test(start_paused = true)]
    async fn the_connection_longest_without_progress_and_not_in_service_gives_its_place_up() {
        let places = Places::new(3);
        let step = || tokio::time::advance(std::time::Duration::from_millis(10));
        let serving = Arc::new(Activity::new());
        let (_a, how) = places.take(&serving).unwrap();
        assert_eq!(how, Admitted::Free);
        step().await;
        let waiting = Arc::new(Activity::new());
        let (_b, _) = places.take(&waiting).unwrap();
        step().await;
        let idle = Arc::new(Activity::new());
        let (_c, _) = places.take(&idle).unwrap();
        step().await;
        // The oldest is in service (its request arrived); the second has
        // only a call waiting for its request: it gives its place up.
        let call = serving.begin_call();
        call.arrived();
        let _held_open = waiting.begin_call();
        let newcomer = Arc::new(Activity::new());
        let (_d, how) = places.take(&newcomer).unwrap();
        assert_eq!(how, Admitted::Evicted);
        assert!(waiting.evicted() && !serving.evicted() && !idle.evicted());
        assert_eq!(places.held(), 3);
        // A call that ended after its request arrived is progress: the
        // idle one is now the longest without.
        step().await;
        drop(call);
        let (_e, _) = places.take(&Arc::new(Activity::new())).unwrap();
        assert!(idle.evicted() && !serving.evicted());
        // All in service: a newcomer is refused.
        let held: Vec<Arc<Activity>> = places
            .held
            .lock()
            .unwrap()
            .connections
            .values()
            .cloned()
            .collect();
        let calls: Vec<CallGuard> = held.iter().map(|held| held.begin_call()).collect();
        calls.iter().for_each(CallGuard::arrived);
        assert!(places.take(&Arc::new(Activity::new())).is_none());
        assert_eq!(places.held(), 3);
    }

    #[test]
    fn a_dropped_place_is_free_again_and_an_evicted_ones_drop_frees_nothing_twice() {
        let places = Places::new(1);
        let first = Arc::new(Activity::new());
        let (place, _) = places.take(&first).unwrap();
        let (second_place, how) = places.take(&Arc::new(Activity::new())).unwrap();
        assert_eq!(how, Admitted::Evicted);
        // The evicted connection closing later leaves the newcomer's place.
        drop(place);
        assert_eq!(places.held(), 1);
        drop(second_place);
        assert_eq!(places.held(), 0);
        let (_again, how) = places.take(&Arc::new(Activity::new())).unwrap();
        assert_eq!(how, Admitted::Free);
    }
}
