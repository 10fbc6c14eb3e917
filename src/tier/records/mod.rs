//! The decoded-source tier's store: the host's decoded sources on local
//! disk, shared by every stream (what a source is and how an output is
//! made from it is [`crate::tier::output`]).
//!
//! One record per sample, in a bucket of its shard: `<dir>/<2 hex>/<shard
//! 16 hex>-<record 16 hex>.src`, written to a private temporary name and
//! renamed into place (a reader never sees half a record). A record holds
//! its full key (so neither a hash collision nor a changed object can serve
//! the wrong pixels: the key names the shard's ETag), the source's
//! geometry, the pixels and a CRC-32 of all of it ([`record`]); one that
//! fails its checks is deleted and counted, and the sample is derived
//! again. The index of the records ([`index`]) lives in process memory,
//! bounded per record; eviction follows the streams' plans. The directory
//! is one server's (locked; slots let several share a node's).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::decode::source::{SourceForm, StoredSource};
use crate::metrics;
use crate::metrics::log_gate::LogGate;
use crate::store::beneath::{is_link_refused, read_regular, Beneath, Links};
use index::{Index, Record, INDEX_BYTES_PER_RECORD};
use record::{encode_record, full_key, parse_record, record_name};

mod index;
mod record;

#[derive(Debug, thiserror::Error)]
pub enum TierError {
    #[error("decoded-source tier at {dir}: {source}")]
    Io {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("decoded-source tier: {0}")]
    Claim(#[from] crate::store::cache::CacheError),
    #[error(
        "every one of the {slots} slots of decoded-source tier {dir} is held by another \
         shardfeed process; give each server its own --decoded-cache-dir or raise --cache-slots"
    )]
    SlotsHeld { dir: PathBuf, slots: u32 },
}

use crate::store::cache::hints::location_id;
use crate::store::cache::PlanFollower;

/// The host's decoded sources on local disk, shared by every stream.
#[derive(Debug)]
pub struct DecodedCache {
    dir: PathBuf,
    /// `dir`, held open: records are read beneath it.
    beneath: Beneath,
    /// Held while the tier is open: a second server in the directory would
    /// evict records this one's index holds, and count the bytes twice.
    _lock: std::fs::File,
    max_bytes: u64,
    /// Most records the index may hold: its process memory is bounded by
    /// this times [`INDEX_BYTES_PER_RECORD`] (small sources would otherwise
    /// let a large directory grow it past the memory formula).
    max_records: AtomicU64,
    state: Mutex<Index>,
    /// Names temporary files uniquely: this run's prefix (a process id
    /// recurs across container restarts; the start time does not), then a
    /// count.
    temp_prefix: String,
    next_temp: AtomicU64,
    /// Records this process has stored.
    fills: AtomicU64,
    write_failures: LogGate,
}

impl crate::tier::output::SourceStore for DecodedCache {
    fn get(&self, key: &crate::tier::output::SourceKey) -> Option<StoredSource> {
        DecodedCache::get(self, key.record(), key.form())
    }

    fn put(&self, key: &crate::tier::output::SourceKey, source: &StoredSource) {
        DecodedCache::put(self, key.record(), key.form(), source)
    }
}

/// Records taken into the index per hold of its lock while adopting.
const ADOPT_CHUNK: usize = 4096;

impl DecodedCache {
    /// Opens (creating) the tier at `dir`, taking in the records already
    /// there (least recently used: those found first), evicting down to
    /// `max_bytes`. The directory is one server's (locked).
    pub fn open(dir: &Path, max_bytes: u64) -> Result<Self, TierError> {
        Self::open_slot(dir, max_bytes, 1)
    }

    /// [`Self::open`] in the first of `slots` slot directories of `dir`
    /// (`slot-N`, as the shard cache's) that no other process holds, so
    /// several servers can share a node's directory, each with its own
    /// records and `max_bytes`.
    pub fn open_slot(dir: &Path, max_bytes: u64, slots: u32) -> Result<Self, TierError> {
        let cache = Self::claim(dir, max_bytes, slots)?;
        cache.adopt_records()?;
        Ok(cache)
    }

    /// [`Self::open_slot`], returning once the slot is claimed and taking
    /// in the records an earlier run left on a thread of its own: a tier of
    /// millions of records does not hold up the server's start. Until the
    /// scan ends, a lookup the index cannot answer reads the file (a hit is
    /// a hit), and the bound is kept for this run's records; the scan's
    /// end evicts down to `max_bytes` over all of them.
    pub fn open_slot_in_background(
        dir: &Path,
        max_bytes: u64,
        slots: u32,
    ) -> Result<Arc<Self>, TierError> {
        let cache = Arc::new(Self::claim(dir, max_bytes, slots)?);
        cache.lock().adopting = true;
        let scanning = cache.clone();
        let spawned = std::thread::Builder::new()
            .name("decoded-tier-adopt".into())
            .spawn(move || {
                let started = std::time::Instant::now();
                match scanning.adopt_records() {
                    Ok(()) => tracing::info!(
                        dir = %scanning.dir.display(),
                        records = scanning.records(),
                        bytes = scanning.bytes(),
                        seconds = started.elapsed().as_secs_f64(),
                        "decoded-source tier: earlier records taken in"
                    ),
                    Err(error) => tracing::warn!(
                        %error,
                        "decoded-source tier: could not take in earlier records; they age out"
                    ),
                }
                scanning.lock().adopting = false;
            });
        if let Err(error) = spawned {
            cache.lock().adopting = false;
            return Err(TierError::Io {
                dir: cache.dir.clone(),
                source: error,
            });
        }
        Ok(cache)
    }

    /// Bounds the index's process memory to `bytes` (at most
    /// [`INDEX_BYTES_PER_RECORD`] a record), evicting what is over.
    pub fn limit_index_memory(&self, bytes: u64) {
        self.max_records
            .store((bytes / INDEX_BYTES_PER_RECORD).max(1), Ordering::Relaxed);
        self.evict_to(self.max_bytes);
    }

    /// Whether the records of an earlier run are still being taken in.
    pub fn adopting(&self) -> bool {
        self.lock().adopting
    }

    fn claim(dir: &Path, max_bytes: u64, slots: u32) -> Result<Self, TierError> {
        let Some((dir, lock)) = crate::store::cache::claim_slot(dir, slots)? else {
            return Err(TierError::SlotsHeld {
                dir: dir.to_path_buf(),
                slots: slots.max(1),
            });
        };
        let beneath = Beneath::open(&dir).map_err(|source| TierError::Io {
            dir: dir.clone(),
            source,
        })?;
        Ok(Self {
            _lock: lock,
            beneath,
            dir,
            max_bytes,
            max_records: AtomicU64::new(u64::MAX),
            state: Mutex::new(Index::default()),
            temp_prefix: format!(
                ".tmp-{}-{:x}-",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |t| t.as_nanos() as u64)
            ),
            next_temp: AtomicU64::new(0),
            fills: AtomicU64::new(0),
            write_failures: LogGate::new(std::time::Duration::from_secs(60)),
        })
    }

    /// Takes in the records on disk (the least recently written are the
    /// first to go), removes crash leftovers, evicts down to the bound.
    fn adopt_records(&self) -> Result<(), TierError> {
        let dir = self.dir.as_path();
        let io = |source| TierError::Io {
            dir: dir.to_path_buf(),
            source,
        };
        let mut found = Vec::new();
        for bucket in std::fs::read_dir(dir).map_err(io)? {
            let bucket = bucket.map_err(io)?.path();
            // Only the tier's own buckets (two hex digits), not slots.
            let is_bucket = bucket
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.len() == 2 && n.bytes().all(|b| b.is_ascii_hexdigit()));
            if !is_bucket || !bucket.is_dir() {
                continue;
            }
            for file in std::fs::read_dir(&bucket).map_err(io)? {
                let path = file.map_err(io)?.path();
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if let Some(stem) = name.strip_suffix(".src") {
                    match parse_file_name(stem) {
                        Some((shard, record)) => {
                            // Evicted since it was listed: nothing to adopt.
                            let Ok(meta) = std::fs::metadata(&path) else {
                                continue;
                            };
                            found.push((meta.modified().ok(), record, shard, meta.len()));
                        }
                        // Named by an older layout: unreachable, so removed.
                        None => {
                            let _ = std::fs::remove_file(&path);
                        }
                    }
                } else if name.starts_with(".tmp-") && !self.is_own_temp(name) {
                    // A temporary file left by a crash.
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        found.sort();
        // In chunks: readers take the same lock for every lookup, and a
        // large directory's millions of records would hold it for seconds.
        for chunk in found.chunks(ADOPT_CHUNK) {
            let mut state = self.lock();
            for &(_, name, shard, bytes) in chunk {
                state.adopt(name, Record { shard, bytes });
            }
        }
        self.evict_to(self.max_bytes);
        Ok(())
    }

    /// A temporary file this run is writing (adoption runs beside this
    /// run's stores).
    fn is_own_temp(&self, name: &str) -> bool {
        name.starts_with(&self.temp_prefix)
    }

    fn lock(&self) -> MutexGuard<'_, Index> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn bytes(&self) -> u64 {
        self.lock().bytes()
    }

    pub fn records(&self) -> usize {
        self.lock().len()
    }

    /// Where the background fill keeps the images its memory bound leaves
    /// out ([`crate::tier::fill`]): in this server's slot, so no other
    /// server's fill empties it, and not a bucket, so never taken for
    /// records.
    pub fn fill_spill_dir(&self) -> PathBuf {
        self.dir.join("fill-spill")
    }

    /// Records stored since this process opened the tier.
    pub fn fills(&self) -> u64 {
        self.fills.load(Ordering::Relaxed)
    }

    fn path(&self, shard: u64, name: u64) -> PathBuf {
        self.dir.join(record_path(shard, name))
    }

    /// The stored source of `record` in `form`, if the tier holds a sound one.
    pub fn get(&self, record: &str, form: &SourceForm) -> Option<StoredSource> {
        let key = full_key(record, form);
        let (shard, name) = (shard_of(record), record_name(&key));
        let (adopting, indexed) = {
            let state = self.lock();
            let indexed = state.get(name);
            if indexed.is_none() && !state.adopting {
                drop(state);
                metrics::decoded_tier("miss");
                return None;
            }
            (state.adopting, indexed)
        };
        // A record is read only as the regular file of the length the index
        // holds (or the tier's bound, for one not taken in yet), through no
        // symlink: whoever can write into the directory cannot make a decode
        // thread read /dev/zero or wait on a FIFO.
        let limit = indexed.map_or(self.max_bytes, |record| record.bytes);
        let relative = record_path(shard, name);
        let path = self.dir.join(&relative);
        let read = self
            .beneath
            .open_read(&relative, Links::None)
            .and_then(|mut file| read_regular(&mut file, limit));
        if adopting && matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::NotFound) {
            // Not on disk, whether or not the scan got to it: a plain miss.
            if self.lock().get(name).is_none() {
                metrics::decoded_tier("miss");
                return None;
            }
        }
        let length = read.as_ref().map_or(0, |data| data.len() as u64);
        let parsed = match read {
            Ok(data) => Ok(parse_record(&data, &key, form).map_err(str::to_string)),
            // Not a record the tier wrote: damaged, as a bad checksum is.
            Err(error)
                if is_link_refused(&error) || error.kind() == std::io::ErrorKind::InvalidData =>
            {
                Ok(Err(error.to_string()))
            }
            Err(error) => Err(error),
        };
        match parsed {
            Ok(Ok(source)) => {
                let mut state = self.lock();
                if state.get(name).is_some() {
                    state.touch(name);
                } else {
                    // Found before the scan took it in.
                    state.insert(
                        name,
                        Record {
                            shard,
                            bytes: length,
                        },
                    );
                }
                drop(state);
                metrics::decoded_tier("hit");
                Some(source)
            }
            Ok(Err(problem)) => {
                tracing::warn!(path = %path.display(), problem, "damaged decoded-source record; deriving it again");
                metrics::decoded_tier("corrupt");
                let _ = std::fs::remove_file(&path);
                self.forget(name);
                None
            }
            Err(error) => {
                // Deleted behind our back, or unreadable: derive again.
                if error.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), %error, "unreadable decoded-source record");
                }
                metrics::decoded_tier("missing");
                self.forget(name);
                None
            }
        }
    }

    fn forget(&self, name: u64) {
        let mut state = self.lock();
        state.remove(name);
        metrics::decoded_tier_bytes(state.bytes());
    }

    /// Stores `source` as `record`'s; a failure to write is logged and
    /// counted (the sample was served all the same).
    pub fn put(&self, record: &str, form: &SourceForm, source: &StoredSource) {
        let key = full_key(record, form);
        let (shard, name) = (shard_of(record), record_name(&key));
        let data = encode_record(&key, form, source);
        let bytes = data.len() as u64;
        if bytes > self.max_bytes {
            return;
        }
        if let Err(error) = self.write(&self.path(shard, name), &data) {
            // A full disk fails every write: one line a minute, the count
            // in the metric.
            if let Some(left_out) = self.write_failures.open() {
                tracing::warn!(
                    dir = %self.dir.display(),
                    %error,
                    left_out,
                    "could not store a decoded source (the sample is served all the same; \
                     failures counted in shardfeed_decoded_tier_total, event write_failed)"
                );
            }
            metrics::decoded_tier("write_failed");
            return;
        }
        metrics::decoded_tier("fill");
        self.fills.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(name, Record { shard, bytes });
        self.evict_to(self.max_bytes);
    }

    fn write(&self, path: &Path, data: &[u8]) -> std::io::Result<()> {
        let parent = path.parent().expect("records live in a bucket directory");
        std::fs::create_dir_all(parent)?;
        let temp = parent.join(format!(
            "{}{}",
            self.temp_prefix,
            self.next_temp.fetch_add(1, Ordering::Relaxed)
        ));
        let written = std::fs::File::create(&temp).and_then(|mut file| file.write_all(data));
        if let Err(error) = written.and_then(|()| std::fs::rename(&temp, path)) {
            let _ = std::fs::remove_file(&temp);
            return Err(error);
        }
        Ok(())
    }

    /// Evicts what the streams' plans need furthest ahead (see
    /// [`index`]) until the records fit in `limit` bytes and the
    /// index in its memory.
    fn evict_to(&self, limit: u64) {
        let max_records = self.max_records.load(Ordering::Relaxed);
        loop {
            let (name, record) = {
                let mut state = self.lock();
                if state.bytes() <= limit && state.len() as u64 <= max_records {
                    metrics::decoded_tier_bytes(state.bytes());
                    return;
                }
                let Some(victim) = state.evict_one() else {
                    return;
                };
                victim
            };
            let _ = std::fs::remove_file(self.path(record.shard, name));
            metrics::decoded_tier("eviction");
        }
    }
}

impl PlanFollower for DecodedCache {
    fn announce(&self, stream: &str, sequence: &[String], in_flight: usize) {
        self.lock().announce(stream, sequence, in_flight);
    }

    fn reached(&self, stream: &str, location: &str) {
        self.lock().reached(stream, location);
    }
}

/// The shard a record belongs to: the location its name starts with (see
/// `tier_record` in the pipeline), as the plan hints name it.
fn shard_of(record: &str) -> u64 {
    location_id(record.split('\n').next().unwrap_or(record))
}

/// A record's file, relative to the tier's directory.
fn record_path(shard: u64, name: u64) -> PathBuf {
    PathBuf::from(format!("{:02x}", shard >> 56)).join(format!("{shard:016x}-{name:016x}.src"))
}

/// `<shard 16 hex>-<record 16 hex>`.
fn parse_file_name(stem: &str) -> Option<(u64, u64)> {
    let (shard, name) = stem.split_once('-')?;
    if shard.len() != 16 || name.len() != 16 {
        return None;
    }
    Some((
        u64::from_str_radix(shard, 16).ok()?,
        u64::from_str_radix(name, 16).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::record::tests::{form, source};
    use super::*;

    fn record_path(cache: &DecodedCache, record: &str) -> PathBuf {
        cache.path(shard_of(record), record_name(&full_key(record, &form())))
    }

    #[test]
    fn the_least_recently_used_records_go_past_the_limit_and_a_reopen_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let one = encode_record(&full_key("r0", &form()), &form(), &source(0)).len() as u64;
        let cache = DecodedCache::open(dir.path(), 3 * one).unwrap();
        for i in 0..3u8 {
            cache.put(&format!("r{i}"), &form(), &source(i));
        }
        assert!(cache.get("r0", &form()).is_some()); // r1 is now the oldest
        cache.put("r3", &form(), &source(3));
        assert!(cache.get("r1", &form()).is_none());
        for i in [0u8, 2, 3] {
            assert_eq!(cache.get(&format!("r{i}"), &form()), Some(source(i)));
        }
        assert_eq!((cache.records(), cache.bytes()), (3, 3 * one));
        drop(cache);
        let reopened = DecodedCache::open(dir.path(), 2 * one).unwrap();
        assert_eq!(reopened.records(), 2);
    }

    #[test]
    fn a_directory_is_one_servers_and_slots_let_several_share_it() {
        let dir = tempfile::tempdir().unwrap();
        let first = DecodedCache::open(dir.path(), 1 << 20).unwrap();
        assert!(matches!(
            DecodedCache::open(dir.path(), 1 << 20),
            Err(TierError::SlotsHeld { slots: 1, .. })
        ));
        drop(first);
        let reopened = DecodedCache::open(dir.path(), 1 << 20).unwrap();
        drop(reopened);

        let shared = dir.path().join("node");
        let a = DecodedCache::open_slot(&shared, 1 << 20, 2).unwrap();
        let b = DecodedCache::open_slot(&shared, 1 << 20, 2).unwrap();
        assert_eq!(
            (a.dir.clone(), b.dir.clone()),
            (shared.join("slot-0"), shared.join("slot-1"))
        );
        assert!(DecodedCache::open_slot(&shared, 1 << 20, 2).is_err());
        // Each slot keeps its own records; a slot is not taken for a bucket.
        a.put("r", &form(), &source(1));
        assert_eq!(b.get("r", &form()), None);
        drop((a, b));
        let a = DecodedCache::open_slot(&shared, 1 << 20, 2).unwrap();
        assert_eq!(a.records(), 1);
    }

    #[test]
    fn a_damaged_or_deleted_record_is_a_miss_and_is_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DecodedCache::open(dir.path(), 1 << 20).unwrap();
        cache.put("a", &form(), &source(1));
        cache.put("b", &form(), &source(2));
        let path = |record: &str| record_path(&cache, record);
        let mut data = std::fs::read(path("a")).unwrap();
        data.truncate(data.len() - 3);
        std::fs::write(path("a"), data).unwrap();
        std::fs::remove_file(path("b")).unwrap();
        assert!(cache.get("a", &form()).is_none());
        assert!(cache.get("b", &form()).is_none());
        assert!(!path("a").exists());
        assert_eq!(cache.records(), 0);
        cache.put("a", &form(), &source(1));
        assert_eq!(cache.get("a", &form()), Some(source(1)));
    }

    #[test]
    fn links_fifos_and_grown_files_in_place_of_records_are_refused_without_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DecodedCache::open(dir.path(), 1 << 30).unwrap();
        for record in ["zero", "fifo", "grown", "bucket"] {
            cache.put(record, &form(), &source(1));
        }
        let path = |record: &str| record_path(&cache, record);
        std::fs::remove_file(path("zero")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", path("zero")).unwrap();
        std::fs::remove_file(path("fifo")).unwrap();
        let fifo =
            std::ffi::CString::new(path("fifo").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let mut grown = std::fs::read(path("grown")).unwrap();
        grown.extend_from_slice(&[0; 4096]);
        std::fs::write(path("grown"), grown).unwrap();
        // A bucket swapped for a link to a copy elsewhere.
        let elsewhere = tempfile::tempdir().unwrap();
        let bucket = path("bucket").parent().unwrap().to_path_buf();
        let copy = elsewhere.path().join("copy");
        std::fs::create_dir(&copy).unwrap();
        for entry in std::fs::read_dir(&bucket).unwrap() {
            let entry = entry.unwrap().path();
            if entry.is_file() {
                std::fs::copy(&entry, copy.join(entry.file_name().unwrap())).unwrap();
            }
        }
        for record in ["zero", "fifo", "grown"] {
            assert_eq!(cache.get(record, &form()), None, "{record}");
            assert!(
                std::fs::symlink_metadata(path(record)).is_err(),
                "{record} removed"
            );
        }
        std::fs::remove_dir_all(&bucket).unwrap();
        std::os::unix::fs::symlink(&copy, &bucket).unwrap();
        assert_eq!(cache.get("bucket", &form()), None, "not through a link");
    }

    #[test]
    fn while_adopting_a_record_on_disk_is_a_hit_and_joins_the_index() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DecodedCache::open(dir.path(), 1 << 20).unwrap();
        cache.put("a", &form(), &source(1));
        let one = cache.bytes();
        {
            // As if the scan had not reached it yet.
            let mut state = cache.lock();
            state.remove(record_name(&full_key("a", &form())));
            state.adopting = true;
        }
        assert_eq!(cache.get("a", &form()), Some(source(1)));
        assert_eq!((cache.records(), cache.bytes()), (1, one));
        assert_eq!(cache.get("b", &form()), None);
        assert_eq!(cache.records(), 1);
    }

    #[test]
    fn an_earlier_runs_records_are_taken_in_behind_a_running_server() {
        let dir = tempfile::tempdir().unwrap();
        let earlier = DecodedCache::open(dir.path(), 1 << 20).unwrap();
        for i in 0..3u8 {
            earlier.put(&format!("r{i}"), &form(), &source(i));
        }
        let one = earlier.bytes() / 3;
        // Written in that order, a second apart (file times may tie).
        let epoch = std::time::SystemTime::UNIX_EPOCH;
        for i in 0..3u64 {
            let path = record_path(&earlier, &format!("r{i}"));
            let file = std::fs::File::options().write(true).open(path).unwrap();
            file.set_modified(epoch + std::time::Duration::from_secs(1_000_000 + i))
                .unwrap();
        }
        let bucket = record_path(&earlier, "r0").parent().unwrap().to_path_buf();
        drop(earlier);
        // A crashed run's half-written record (same process id: containers
        // restart as the same pid).
        let leftover = bucket.join(format!(".tmp-{}-1-0", std::process::id()));
        std::fs::write(&leftover, b"half").unwrap();

        // Under a bound of two: the scan's end evicts the oldest.
        let cache = DecodedCache::open_slot_in_background(dir.path(), 2 * one, 1).unwrap();
        assert_eq!(cache.get("r2", &form()), Some(source(2)));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while cache.adopting() {
            assert!(std::time::Instant::now() < deadline, "adoption did not end");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!((cache.records(), cache.bytes()), (2, 2 * one));
        assert!(!leftover.exists());
        // r2 was used in this run: the earlier records go first.
        assert_eq!(cache.get("r2", &form()), Some(source(2)));
        assert_eq!(cache.get("r0", &form()), None);
        assert_eq!(cache.get("r1", &form()), Some(source(1)));
    }

    #[test]
    fn the_index_memory_bound_caps_the_records() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DecodedCache::open(dir.path(), 1 << 30).unwrap();
        for i in 0..5u8 {
            cache.put(&format!("r{i}"), &form(), &source(i));
        }
        cache.limit_index_memory(3 * INDEX_BYTES_PER_RECORD);
        assert_eq!(cache.records(), 3);
        cache.put("r5", &form(), &source(5));
        assert_eq!(cache.records(), 3);
        assert_eq!(cache.get("r5", &form()), Some(source(5)));
    }
}
