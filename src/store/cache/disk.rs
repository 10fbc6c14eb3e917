//! The cache itself: entries of blocks on disk, their metadata, the lock
//! that orders them, and eviction.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::future::{BoxFuture, Shared};
use serde::{Deserialize, Serialize};

use super::hints::{self, PlanFollower, PlanHints};
use crate::metrics;
use crate::store::StoreError;

pub const DEFAULT_BLOCK_SIZE: u64 = 8 << 20;
pub const DEFAULT_MIN_FREE_PERCENT: f64 = 5.0;
pub const DEFAULT_MAX_BYTES: u64 = 100_000_000_000;
/// Listings longer than this are not kept in memory (a prefix of loose
/// images can hold millions of objects; shard datasets list far fewer).
pub(super) const MAX_CACHED_LISTING: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// Evict what the registered plans need furthest in the future.
    Planned,
    /// Evict the least recently used entry.
    Lru,
}

#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub dir: PathBuf,
    /// Bytes of cached data at most.
    pub max_bytes: u64,
    /// Free space always left on the cache's file system, in percent.
    pub min_free_percent: f64,
    pub block_size: u64,
    pub policy: EvictionPolicy,
    /// How long listings and object metadata are trusted (`None`: forever).
    pub metadata_ttl: Option<Duration>,
    /// Servers that may share `dir` (a node's disk, kept across pods): each
    /// takes the first slot no other process holds, a subdirectory of its
    /// own with its own `max_bytes`. 1: `dir` itself is the only slot.
    pub slots: u32,
    /// How long [`DiskCache::open_waiting`] waits while every slot is held.
    pub lock_wait: Duration,
}

impl CacheConfig {
    /// The defaults, in `dir`.
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            max_bytes: DEFAULT_MAX_BYTES,
            min_free_percent: DEFAULT_MIN_FREE_PERCENT,
            block_size: DEFAULT_BLOCK_SIZE,
            policy: EvictionPolicy::Planned,
            metadata_ttl: None,
            slots: 1,
            lock_wait: Duration::ZERO,
        }
    }

    /// This configuration once `dir` (one of its slots) is claimed.
    pub(super) fn claimed(self, dir: PathBuf) -> Self {
        Self {
            dir,
            slots: 1,
            ..self
        }
    }
}

/// Held (flock) by the process using a cache directory: two servers writing
/// one directory would overwrite each other's blocks and metadata. The
/// kernel drops the lock when the process exits, however it exits.
pub const LOCK_FILE: &str = ".lock";

/// Most slots one directory may have: each may fill `max_bytes`.
pub const MAX_SLOTS: u32 = 64;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cache directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cache directory {dir} is in use by another shardfeed process (it holds {dir}/{LOCK_FILE}); \
         give each server its own --cache-dir, or let servers share it with --cache-slots"
    )]
    Locked { dir: PathBuf },
    #[error(
        "every one of the {slots} slots of cache directory {dir} is held by another shardfeed \
         process (waited {waited_s} s); raise --cache-slots or --cache-lock-wait"
    )]
    SlotsHeld {
        dir: PathBuf,
        slots: u32,
        waited_s: u64,
    },
}

/// On-disk description of one entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct EntryMeta {
    pub(super) location: String,
    pub(super) etag: String,
    pub(super) size: u64,
    pub(super) block_size: u64,
    /// Present blocks and their CRC32.
    pub(super) blocks: BTreeMap<u64, u32>,
}

pub(super) type BlockFuture = Shared<BoxFuture<'static, Result<Bytes, StoreError>>>;

#[derive(Debug)]
pub(super) struct Entry {
    pub(super) meta: EntryMeta,
    pub(super) last_used: u64,
    pub(super) inflight: HashMap<u64, BlockFuture>,
}

impl Entry {
    fn bytes(&self) -> u64 {
        self.meta
            .blocks
            .keys()
            .map(|&b| block_len(&self.meta, b))
            .sum()
    }
}

pub(super) fn block_len(meta: &EntryMeta, block: u64) -> u64 {
    meta.block_size.min(meta.size - block * meta.block_size)
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) entries: HashMap<String, Entry>,
    /// Entry ids by last use (a clock value no two entries share), oldest
    /// first: eviction walks from the front.
    pub(super) recency: BTreeMap<u64, String>,
    pub(super) used: u64,
    pub(super) clock: u64,
    pub(super) hints: PlanHints,
}

impl State {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The entry `id`, created without blocks if missing, marked used now.
    pub(super) fn touch(&mut self, id: &str, meta: &EntryMeta) -> &mut Entry {
        let now = self.tick();
        let entry = self.entries.entry(id.to_string()).or_insert_with(|| Entry {
            meta: EntryMeta {
                blocks: BTreeMap::new(),
                ..meta.clone()
            },
            last_used: 0,
            inflight: HashMap::new(),
        });
        self.recency.remove(&entry.last_used);
        entry.last_used = now;
        self.recency.insert(now, id.to_string());
        entry
    }

    fn remove(&mut self, id: &str) -> Option<Entry> {
        let entry = self.entries.remove(id)?;
        self.recency.remove(&entry.last_used);
        self.used = self.used.saturating_sub(entry.bytes());
        Some(entry)
    }

    /// Removes `id` if it holds no block and downloads none (a download
    /// that failed or found no room): nothing is kept for objects not cached.
    pub(super) fn forget_if_empty(&mut self, id: &str) -> bool {
        let empty = self
            .entries
            .get(id)
            .is_some_and(|entry| entry.meta.blocks.is_empty() && entry.inflight.is_empty());
        if empty {
            self.remove(id);
        }
        empty
    }
}

#[derive(Debug, Default)]
pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub evictions: AtomicU64,
    pub corrupt: AtomicU64,
    pub write_failures: AtomicU64,
}

/// The cache shared by every stream on the host.
#[derive(Debug)]
pub struct DiskCache {
    pub(super) config: CacheConfig,
    pub(super) state: Mutex<State>,
    pub stats: CacheStats,
    /// The directory's lock, held for the cache's life.
    _lock: std::fs::File,
    /// Serializes metadata writes (see `persist_meta`).
    meta_writes: Mutex<()>,
    /// Whether a failed write was already logged at warning level (then
    /// the rest go to debug; the counter counts them all).
    write_failure_logged: std::sync::atomic::AtomicBool,
}

pub(super) fn entry_id(location: &str, etag: &str) -> String {
    // Two independent 64-bit hashes: collisions would serve wrong bytes.
    use std::hash::{Hash, Hasher};
    let mut first = std::collections::hash_map::DefaultHasher::new();
    (location, etag).hash(&mut first);
    let mut second = std::collections::hash_map::DefaultHasher::new();
    (etag, location, 0x5eed_u32).hash(&mut second);
    format!("{:016x}{:016x}", first.finish(), second.finish())
}

/// Whether `name` is one of an entry's files: `<id>.json`, `<id>.data`, a
/// leftover `<id>.json.tmp` of an interrupted write or `<id>.evicted` of an
/// interrupted eviction, `<id>` being what [`entry_id`] makes (32 lowercase
/// hex digits).
fn is_entry_file(name: &str) -> bool {
    let Some((id, extension)) = name.split_once('.') else {
        return false;
    };
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && matches!(extension, "json" | "data" | "json.tmp" | EVICTED)
}

/// The extension of an evicted entry's data file, renamed aside until it is
/// unlinked outside the state lock.
const EVICTED: &str = "evicted";

/// Unlinks data files renamed aside by evictions; called without the lock.
pub(super) fn remove_evicted(files: Vec<PathBuf>) {
    for file in files {
        let _ = std::fs::remove_file(file);
    }
}

pub(super) fn io_error(path: &Path, source: std::io::Error) -> CacheError {
    CacheError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl DiskCache {
    /// Opens the cache in `config.dir` (whose `lock` the caller holds) and
    /// adopts the entries a previous run left, oldest first by their data's
    /// last write (so least-recently-used order survives a restart). Reads every entry's metadata: with
    /// millions of entries this takes a while, so the server calls it after
    /// it listens (see `server::serve`'s startup).
    pub(super) fn open_locked(
        config: CacheConfig,
        lock: std::fs::File,
    ) -> Result<Arc<Self>, CacheError> {
        let started = std::time::Instant::now();
        let mut adopted = Vec::new();
        let mut healed = 0usize;
        for (scanned, item) in std::fs::read_dir(&config.dir)
            .map_err(|e| io_error(&config.dir, e))?
            .enumerate()
        {
            if scanned > 0 && scanned % 200_000 == 0 {
                tracing::info!(
                    dir = %config.dir.display(),
                    files = scanned,
                    entries = adopted.len(),
                    "opening the disk cache"
                );
            }
            let path = item.map_err(|e| io_error(&config.dir, e))?.path();
            // Only the cache's own files are adopted or removed: the
            // directory may hold anything else (a shared volume, a mistake).
            let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
                continue;
            };
            if !is_entry_file(&name) {
                continue;
            }
            let Some((id, extension)) = name.split_once('.') else {
                continue;
            };
            if extension != "json" {
                // Data files are adopted through their metadata; leftovers of
                // interrupted writes and evictions are removed.
                if extension != "data" {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            match adopt(&config, id, &path, &mut healed) {
                Some((written, meta)) => adopted.push((written, id.to_string(), meta)),
                None => {
                    let _ = std::fs::remove_file(&path);
                    let _ = std::fs::remove_file(config.dir.join(format!("{id}.data")));
                }
            }
        }
        adopted.sort_by_key(|(written, _, _)| *written);
        let mut state = State::default();
        for (_, id, meta) in adopted {
            let entry = state.touch(&id, &meta);
            entry.meta = meta;
            let bytes = entry.bytes();
            state.used += bytes;
        }
        if healed > 0 {
            tracing::warn!(
                dir = %config.dir.display(),
                blocks = healed,
                "cache data files were shorter than their metadata; dropped the missing blocks"
            );
        }
        tracing::info!(
            dir = %config.dir.display(),
            entries = state.entries.len(),
            bytes = state.used,
            seconds = started.elapsed().as_secs_f64(),
            "disk cache opened"
        );
        let cache = Arc::new(Self {
            config,
            state: Mutex::new(state),
            stats: CacheStats::default(),
            _lock: lock,
            meta_writes: Mutex::new(()),
            write_failure_logged: std::sync::atomic::AtomicBool::new(false),
        });
        cache.publish_usage();
        Ok(cache)
    }

    /// Entries held (each a cached object, some of its blocks present).
    pub fn entries(&self) -> usize {
        self.lock().entries.len()
    }

    /// The least recently used entry found the way eviction found it before
    /// it kept entries in order: a scan of every entry under the lock. For
    /// the cache-scale benchmark's baseline.
    #[cfg(feature = "dev")]
    pub fn oldest_by_full_scan(&self) -> Option<String> {
        let state = self.lock();
        state
            .entries
            .iter()
            .filter(|(_, entry)| entry.inflight.is_empty() && !entry.meta.blocks.is_empty())
            .min_by_key(|(_, entry)| entry.last_used)
            .map(|(id, _)| id.clone())
    }

    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Bytes of cached data.
    pub fn used_bytes(&self) -> u64 {
        self.lock().used
    }

    pub(super) fn publish_usage(&self) {
        ::metrics::gauge!(metrics::CACHE_BYTES).set(self.used_bytes() as f64);
    }

    /// Frees room for `bytes` more, evicting per policy; the victims' data
    /// files go to `evicted`, for the caller to unlink once it has let go of
    /// the lock. Returns false if nothing (else) can be evicted; the caller
    /// then does not cache.
    pub(super) fn make_room(
        &self,
        state: &mut State,
        keep: &str,
        bytes: u64,
        evicted: &mut Vec<PathBuf>,
    ) -> bool {
        loop {
            let over_limit = state.used + bytes > self.config.max_bytes;
            let low_disk = !self.disk_has_room(bytes);
            if !over_limit && !low_disk {
                return true;
            }
            let Some(victim) = self.pick_victim(state, keep) else {
                return false;
            };
            self.evict(state, &victim, evicted);
        }
    }

    fn evict(&self, state: &mut State, victim: &str, evicted: &mut Vec<PathBuf>) {
        if let Some(entry) = state.remove(victim) {
            evicted.extend(self.set_aside(victim));
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
            ::metrics::counter!(metrics::CACHE_EVICTIONS).increment(1);
            tracing::debug!(location = %entry.meta.location, "evicted from the disk cache");
        }
    }

    /// Takes a removed entry's files out of the cache, under the state lock
    /// so a new entry of the same id starts with none: the metadata is
    /// removed and the data renamed aside (both quick); the returned file is
    /// unlinked later, outside the lock (freeing a large file is not quick).
    pub(super) fn set_aside(&self, id: &str) -> Option<PathBuf> {
        let _ = std::fs::remove_file(self.config.dir.join(format!("{id}.json")));
        let aside = self.config.dir.join(format!("{id}.{EVICTED}"));
        std::fs::rename(self.config.dir.join(format!("{id}.data")), &aside)
            .ok()
            .map(|()| aside)
    }

    /// The entry to evict: the least recently used one, or under the planned
    /// policy the oldest no stream announced, else the one announced
    /// furthest ahead. Entries downloading, empty or `keep` are skipped.
    fn pick_victim(&self, state: &mut State, keep: &str) -> Option<String> {
        let next_use = match self.config.policy {
            EvictionPolicy::Lru => None,
            EvictionPolicy::Planned => Some(state.hints.next_use()),
        };
        let mut furthest: Option<(usize, &String)> = None;
        for id in state.recency.values() {
            let Some(entry) = state.entries.get(id) else {
                continue;
            };
            if id == keep || !entry.inflight.is_empty() || entry.meta.blocks.is_empty() {
                continue;
            }
            let Some(next_use) = next_use else {
                return Some(id.clone());
            };
            match next_use.get(&hints::location_id(&entry.meta.location)) {
                None => return Some(id.clone()),
                // Ties go to the older entry, met first.
                Some(&distance) if furthest.is_none_or(|(best, _)| distance > best) => {
                    furthest = Some((distance, id));
                }
                Some(_) => {}
            }
        }
        furthest.map(|(_, id)| id.clone())
    }

    fn disk_has_room(&self, bytes: u64) -> bool {
        let Some((free, total)) = disk_space(&self.config.dir) else {
            return true;
        };
        let floor = (total as f64 * self.config.min_free_percent / 100.0) as u64;
        free.saturating_sub(bytes) >= floor
    }

    /// Blocks cached, over all entries.
    pub fn blocks_cached(&self) -> u64 {
        self.lock()
            .entries
            .values()
            .map(|e| e.meta.blocks.len() as u64)
            .sum()
    }

    /// Bytes of `location` (at `etag`) already cached.
    pub fn cached_bytes(&self, location: &str, etag: &str) -> u64 {
        self.lock()
            .entries
            .get(&entry_id(location, etag))
            .map_or(0, Entry::bytes)
    }

    /// Whether an object of `size` bytes would fit next to what is cached,
    /// without evicting (for `shardfeed warm`).
    pub fn fits_without_eviction(&self, size: u64) -> bool {
        self.used_bytes() + size <= self.config.max_bytes && self.disk_has_room(size)
    }

    /// A recorded block from disk. A block that cannot be read back whole
    /// and intact (data file deleted, truncated, corrupted, replaced) is
    /// dropped from the entry, counted and logged: the caller fetches it
    /// again instead of trying the disk forever.
    pub(super) fn read_block_from_disk(
        &self,
        id: &str,
        meta: &EntryMeta,
        block: u64,
        expected: u32,
    ) -> Option<Bytes> {
        use std::os::unix::fs::FileExt;
        let len = block_len(meta, block) as usize;
        let path = self.config.dir.join(format!("{id}.data"));
        let read = std::fs::File::open(&path).and_then(|file| {
            let mut buf = vec![0u8; len];
            file.read_exact_at(&mut buf, block * meta.block_size)?;
            Ok(buf)
        });
        let problem = match read {
            Ok(buf) if crc32fast::hash(&buf) == expected => return Some(Bytes::from(buf)),
            Ok(_) => "failed its checksum".to_string(),
            Err(error) => format!("could not be read ({error})"),
        };
        self.stats.corrupt.fetch_add(1, Ordering::Relaxed);
        ::metrics::counter!(metrics::CACHE_CORRUPT).increment(1);
        tracing::warn!(location = %meta.location, block, file = %path.display(), "cache block {problem}; fetching it again");
        let mut guard = self.lock();
        let state = &mut *guard;
        let entry = state.entries.get_mut(id)?;
        if entry.meta.blocks.remove(&block).is_some() {
            state.used = state.used.saturating_sub(len as u64);
        }
        if state.forget_if_empty(id) {
            let aside = self.set_aside(id);
            drop(guard);
            remove_evicted(aside.into_iter().collect());
        } else {
            drop(guard);
            let _ = self.persist_meta(id);
        }
        None
    }

    pub(super) fn write_block(
        &self,
        id: &str,
        meta: &EntryMeta,
        block: u64,
        data: &[u8],
    ) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.config.dir.join(format!("{id}.data")))?;
        file.write_all_at(data, block * meta.block_size)
    }

    /// Writes an entry's metadata as it is now. Writers take turns and each
    /// takes its snapshot in its turn: two blocks of one entry recorded at
    /// once must not have the older snapshot land last (the newer block
    /// would be forgotten at the next start).
    pub(super) fn persist_meta(&self, id: &str) -> std::io::Result<()> {
        let _turn = self
            .meta_writes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(meta) = self.lock().entries.get(id).map(|e| e.meta.clone()) else {
            return Ok(());
        };
        write_meta_file(&self.config.dir, id, &meta).inspect_err(|error| self.write_failed(error))
    }

    /// Counts a failed cache write; the first is a warning (a full disk is
    /// an operator's problem), the rest are counted quietly.
    pub(super) fn write_failed(&self, error: &std::io::Error) {
        self.stats.write_failures.fetch_add(1, Ordering::Relaxed);
        metrics::cache_write_failed();
        if !self.write_failure_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                dir = %self.config.dir.display(),
                %error,
                "disk cache write failed; serving from S3 and evicting to make room \
                 (further failures are counted in shardfeed_cache_write_failures_total)"
            );
        } else {
            tracing::debug!(%error, "disk cache write failed");
        }
    }

    /// Evicts entries until `bytes` were freed (a write found the disk full
    /// before our own limits said so). False if nothing could be evicted.
    pub(super) fn evict_at_least(&self, keep: &str, bytes: u64) -> bool {
        let mut state = self.lock();
        let mut evicted = Vec::new();
        let mut freed = 0;
        while freed < bytes {
            let Some(victim) = self.pick_victim(&mut state, keep) else {
                break;
            };
            let before = state.used;
            self.evict(&mut state, &victim, &mut evicted);
            freed += before - state.used;
        }
        drop(state);
        remove_evicted(evicted);
        freed > 0 || bytes == 0
    }
}

/// One entry a previous run left: its metadata and when its data was last
/// written, with blocks past the data file's end dropped (a crash, a full
/// disk, someone else cut it short: forget them now rather than discover
/// them one failed read at a time). `None`: nothing worth keeping.
fn adopt(
    config: &CacheConfig,
    id: &str,
    meta_path: &Path,
    healed: &mut usize,
) -> Option<(std::time::SystemTime, EntryMeta)> {
    let mut meta = std::fs::read(meta_path)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<EntryMeta>(&bytes).ok())
        .filter(|meta| meta.block_size == config.block_size)?;
    let data = std::fs::metadata(config.dir.join(format!("{id}.data"))).ok()?;
    let (len, block_size, size) = (data.len(), meta.block_size, meta.size);
    let before = meta.blocks.len();
    meta.blocks.retain(|&block, _| {
        block * block_size + block_size.min(size.saturating_sub(block * block_size)) <= len
    });
    if meta.blocks.is_empty() {
        return None;
    }
    if meta.blocks.len() != before {
        *healed += before - meta.blocks.len();
        let _ = write_meta_file(&config.dir, id, &meta);
    }
    Some((data.modified().unwrap_or(std::time::UNIX_EPOCH), meta))
}

fn write_meta_file(dir: &Path, id: &str, meta: &EntryMeta) -> std::io::Result<()> {
    // Write then rename: a reader (or a restart) never sees half a file.
    let path = dir.join(format!("{id}.json"));
    let tmp = dir.join(format!("{id}.json.tmp"));
    std::fs::write(&tmp, serde_json::to_vec(meta).unwrap_or_default())?;
    std::fs::rename(&tmp, &path)
}

fn disk_space(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid NUL-terminated string and `stat` a valid
    // out-pointer for the duration of the call.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut stat) };
    if rc != 0 {
        return None;
    }
    let unit = stat.f_frsize as u64;
    Some((stat.f_bavail as u64 * unit, stat.f_blocks as u64 * unit))
}

impl PlanFollower for DiskCache {
    /// A shard's blocks are read when its reader runs, at the cursor (and
    /// downloads in progress are never evicted): nothing behind it is in use.
    fn announce(&self, stream: &str, sequence: &[String], _in_flight: usize) {
        self.lock().hints.announce(stream, sequence, 0);
    }

    fn reached(&self, stream: &str, location: &str) {
        self.lock().hints.reached(stream, location);
    }
}

/// A stream's name in the plan hints: the same across its epochs.
pub fn stream_key(dataset: &str, seed: u64, rank: u32, world_size: u32) -> String {
    format!("{dataset}#seed={seed}#rank={rank}/{world_size}")
}
