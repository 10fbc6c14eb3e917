//! The host's disk cache: a store that wraps another store.
//!
//! One [`DiskCache`] per host serves every stream and rank. Objects are cached
//! in fixed-size blocks, keyed by (location, ETag), so a changed object is a
//! different entry and is never served stale. Each block carries a CRC32; a
//! block that fails it is dropped, counted and fetched again. A block is
//! recorded as present only after its bytes are written, so a partially
//! written block is never read. Concurrent reads of a missing block share one
//! download. Entries are described by small JSON files next to their data, so
//! a restarted sidecar finds its warm cache.
//!
//! Eviction knows the future: streams register the shards they will read, in
//! order, for this epoch and the next (the plan makes both pure functions), and
//! the [`EvictionPolicy::Planned`] policy evicts the entry needed furthest in
//! the future (Belady's rule), falling back to least-recently-used for entries
//! no stream has announced. LRU alone re-downloads everything every epoch when
//! the cache is smaller than the dataset and the order changes per epoch.
//!
//! Eviction costs what it evicts, not what the cache holds: entries are kept
//! in order of last use, and a victim is found by walking from the oldest,
//! skipping only entries busy downloading and (for the planned policy) the
//! announced ones, which are bounded by the streams' shard sequences. A cache
//! of a million loose objects evicts one without looking at the rest. Files
//! are renamed aside under the lock and unlinked after it is released, so a
//! reader never waits for the file system to free a large file.
//!
//! Listings and object metadata are cached in memory for `metadata_ttl`
//! (default: the life of the process; datasets are static during training).

mod disk;
pub mod hints;
mod slots;
mod store;

pub use disk::{
    stream_key, CacheConfig, CacheError, CacheStats, DiskCache, EvictionPolicy, DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_BYTES, DEFAULT_MIN_FREE_PERCENT, LOCK_FILE, MAX_SLOTS,
};
pub use hints::{PlanFollower, PlanHints};
pub use slots::{claim_slot, prepare_dir, wait_for_slot, SlotWaitError};
pub use store::CacheStore;
