//! The tier as a host's engine holds it: one handle for the store once it
//! is open, its background fill (started with the first stream that uses
//! the tier) and the form a decoded stream gets when it names none. The
//! engine asks it three things: which form a stream uses, what a stream of
//! that form runs with, and who follows the stream's plan.

use std::sync::{Arc, OnceLock};

use super::fill::{FillBounds, TierFiller};
use super::output::{FillQueue, SourceStore, TierRequest};
use super::records::DecodedCache;
use crate::decode::source::SourceForm;
use crate::decode::Decoder;
use crate::store::cache::PlanFollower;

#[derive(Debug, Default)]
pub struct HostTier {
    /// Set once, when the tier is open (a server opens it after it listens,
    /// as the shard cache).
    store: Arc<OnceLock<Arc<DecodedCache>>>,
    /// Started with the first stream that uses the tier; `None` inside
    /// when it could not start (sources are then derived in their first
    /// stored epoch).
    filler: OnceLock<Option<Arc<TierFiller>>>,
    /// The form a decoded stream whose request names none uses, where the
    /// tier is open.
    default_form: Option<SourceForm>,
}

impl HostTier {
    pub fn new(default_form: Option<SourceForm>) -> Self {
        Self {
            default_form,
            ..Self::default()
        }
    }

    /// Keeps decoded sources in `store` from now on.
    pub fn open(&self, store: Arc<DecodedCache>) {
        let _ = self.store.set(store);
    }

    /// Where the store goes once it is open, for a server that opens it
    /// while already listening.
    pub fn slot(&self) -> Arc<OnceLock<Arc<DecodedCache>>> {
        self.store.clone()
    }

    pub fn is_open(&self) -> bool {
        self.store.get().is_some()
    }

    /// The form of a stream that asked for `asked`: that, or, for a
    /// decoded stream open to the default (`defaultable`), this host's
    /// default where the tier is open.
    pub fn form(&self, asked: Option<SourceForm>, defaultable: bool) -> Option<SourceForm> {
        asked.or(self.default_form.filter(|_| defaultable && self.is_open()))
    }

    /// What a stream of `form` runs with: the store, if open, and the
    /// background fill, started now if this is the first such stream.
    pub fn stream(
        &self,
        form: SourceForm,
        from_epoch: u64,
        decoder: &Arc<dyn Decoder>,
        fill_threads: usize,
    ) -> TierRequest {
        let store = self.store.get();
        let filler = store.and_then(|store| {
            self.filler
                .get_or_init(|| start_filler(store, decoder, fill_threads))
                .clone()
                .map(|filler| filler as Arc<dyn FillQueue>)
        });
        TierRequest {
            form,
            cache: store.map(|store| store.clone() as Arc<dyn SourceStore>),
            from_epoch,
            filler,
        }
    }

    /// The store as a follower of a stream's plan (it evicts by the plans),
    /// where it is open.
    pub fn follower(&self) -> Option<Arc<dyn PlanFollower>> {
        self.store
            .get()
            .map(|store| store.clone() as Arc<dyn PlanFollower>)
    }
}

fn start_filler(
    store: &DecodedCache,
    decoder: &Arc<dyn Decoder>,
    threads: usize,
) -> Option<Arc<TierFiller>> {
    TierFiller::start(
        decoder.clone(),
        threads,
        FillBounds::default(),
        Some(&store.fill_spill_dir()),
    )
    .map_err(|error| {
        tracing::warn!(
            %error,
            "decoded-source tier: no background fill; sources are derived in their first \
             stored epoch"
        )
    })
    .ok()
    .map(Arc::new)
}
