//! The decoded-source tier: each image brought once to a stored source form
//! ([`super::source`]) and kept on the host's local disk, so later epochs
//! crop and resize from it instead of decoding the JPEG again.
//!
//! A stream that asks for the tier has its outputs *defined* from the
//! stored source: a miss derives the source, stores it and crops from it
//! exactly as a hit does, so a batch is the same bytes whatever the tier
//! holds (or when the server keeps no tier directory at all: then every
//! sample is derived and nothing is stored).
//!
//! # Records
//!
//! One file per sample, `<dir>/<2 hex>/<16 hex>.src`, written to a private
//! temporary name and renamed into place (a reader never sees half a
//! record). A record holds its full key (so neither a hash collision nor a
//! changed object can serve the wrong pixels: the key names the shard's
//! ETag), the source's geometry, the pixels, and a CRC-32 of all of it. A
//! record that fails its checks is deleted and counted, and the sample is
//! derived again: the batch does not change.
//!
//! # Bounds
//!
//! `max_bytes` of records on disk; the least recently used go first. The
//! tier holds no pixels in process memory beyond the record being read
//! (the page cache keeps hot records, outside the sidecar's own memory).

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::source::{derive_source_with, output_from_source, SourceForm, SourceKind, StoredSource};
use super::{full_size_bounded, Crop, CropBox, DecodeError, ImageFormat, OutputSpec, SampleKey};
use super::{Decoder, ScratchBudget, MAX_SIZE};
use crate::metrics;

const MAGIC: &[u8; 8] = b"SFDSRC01";
/// Most bytes a record's key may have.
const MAX_KEY_BYTES: usize = 4096;
/// Smallest and largest stored shorter side a request may ask for.
pub const MIN_SHORTER_SIDE: u32 = 64;
pub const MAX_SHORTER_SIDE: u32 = MAX_SIZE;

#[derive(Debug, thiserror::Error)]
pub enum TierError {
    #[error("decoded-source tier at {dir}: {source}")]
    Io {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What a stream asks of the tier.
#[derive(Clone, Debug)]
pub struct TierRequest {
    pub form: SourceForm,
    /// Where sources are kept; `None`: derived for every sample, not kept.
    pub cache: Option<Arc<DecodedCache>>,
}

impl TierRequest {
    /// One sample's output, defined from its stored source. `record` names
    /// the sample for the cache (`None`: not cached, e.g. a loose object
    /// without an ETag to tell a changed one by).
    #[allow(clippy::too_many_arguments)]
    pub fn output(
        &self,
        decoder: &dyn Decoder,
        budget: &ScratchBudget,
        format: ImageFormat,
        data: &[u8],
        spec: &OutputSpec,
        key: &SampleKey,
        record: Option<&str>,
        out: &mut [u8],
    ) -> Result<CropBox, DecodeError> {
        let cache = self.cache.as_ref().zip(record);
        // A transform with no randomness (center crop or stretch, no flip)
        // makes the same output every epoch: it is kept too, and later
        // epochs are a copy.
        let output_record = cache
            .filter(|_| is_deterministic(spec))
            .map(|(cache, record)| (cache, output_record(record, spec)));
        if let Some((cache, name)) = &output_record {
            if let Some(kept) = cache.get(name, &self.form) {
                if kept.bytes.len() == out.len() {
                    out.copy_from_slice(&kept.bytes);
                    return Ok(spec.crop_box(kept.original_width, kept.original_height, key));
                }
            }
        }
        let source = match cache.and_then(|(cache, record)| cache.get(record, &self.form)) {
            Some(source) => source,
            None => {
                let source = full_size_bounded(budget, format, data, |_, _| {
                    derive_source_with(decoder, format, data, &self.form)
                })?;
                if let Some((cache, record)) = cache {
                    cache.put(record, &self.form, &source);
                }
                source
            }
        };
        let crop = spec.crop_box(source.original_width, source.original_height, key);
        output_from_source(&source, spec, &crop, out)?;
        if let Some((cache, name)) = &output_record {
            let kept = StoredSource {
                kind: self.form.kind,
                width: spec.width,
                height: spec.height,
                original_width: source.original_width,
                original_height: source.original_height,
                bytes: out.to_vec(),
            };
            cache.put(name, &self.form, &kept);
        }
        Ok(crop)
    }
}

/// Whether `spec` gives a sample the same output every epoch.
fn is_deterministic(spec: &OutputSpec) -> bool {
    spec.flip == 0.0 && matches!(spec.crop, Crop::Center { .. } | Crop::Stretch)
}

/// The record of a sample's final output under `spec` (see
/// [`TierRequest::output`]).
fn output_record(record: &str, spec: &OutputSpec) -> String {
    format!(
        "{record}\noutput {}x{} {:?}",
        spec.width, spec.height, spec.crop
    )
}

/// The host's decoded sources on local disk, shared by every stream.
#[derive(Debug)]
pub struct DecodedCache {
    dir: PathBuf,
    max_bytes: u64,
    state: Mutex<State>,
    /// Names temporary files uniquely within the process.
    next_temp: AtomicU64,
    /// Records this process has stored.
    fills: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// Record name → its size and last use.
    entries: HashMap<u64, Entry>,
    /// (last use, record name): the eviction order.
    by_use: BTreeSet<(u64, u64)>,
    bytes: u64,
    clock: u64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    bytes: u64,
    used: u64,
}

impl State {
    fn touch(&mut self, name: u64) {
        self.clock += 1;
        if let Some(entry) = self.entries.get_mut(&name) {
            self.by_use.remove(&(entry.used, name));
            entry.used = self.clock;
            self.by_use.insert((entry.used, name));
        }
    }

    fn insert(&mut self, name: u64, bytes: u64) {
        self.remove(name);
        self.clock += 1;
        self.entries.insert(
            name,
            Entry {
                bytes,
                used: self.clock,
            },
        );
        self.by_use.insert((self.clock, name));
        self.bytes += bytes;
    }

    fn remove(&mut self, name: u64) -> Option<Entry> {
        let entry = self.entries.remove(&name)?;
        self.by_use.remove(&(entry.used, name));
        self.bytes -= entry.bytes;
        Some(entry)
    }
}

impl DecodedCache {
    /// Opens (creating) the tier at `dir`, taking in the records already
    /// there (least recently used: those found first), evicting down to
    /// `max_bytes`.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<Self, TierError> {
        let io = |source| TierError::Io {
            dir: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let cache = Self {
            dir: dir.to_path_buf(),
            max_bytes,
            state: Mutex::new(State::default()),
            next_temp: AtomicU64::new(0),
            fills: AtomicU64::new(0),
        };
        let mut found = Vec::new();
        for bucket in std::fs::read_dir(dir).map_err(io)? {
            let bucket = bucket.map_err(io)?.path();
            if !bucket.is_dir() {
                continue;
            }
            for file in std::fs::read_dir(&bucket).map_err(io)? {
                let path = file.map_err(io)?.path();
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                match name
                    .strip_suffix(".src")
                    .map(|hex| u64::from_str_radix(hex, 16))
                {
                    Some(Ok(record)) => {
                        let meta = std::fs::metadata(&path).map_err(io)?;
                        let modified = meta.modified().ok();
                        found.push((modified, record, meta.len()));
                    }
                    // A temporary file left by a crash.
                    _ if name.starts_with(".tmp-") => {
                        let _ = std::fs::remove_file(&path);
                    }
                    _ => {}
                }
            }
        }
        found.sort();
        {
            let mut state = cache.lock();
            for (_, record, bytes) in found {
                state.insert(record, bytes);
            }
        }
        cache.evict_to(cache.max_bytes);
        Ok(cache)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    pub fn records(&self) -> usize {
        self.lock().entries.len()
    }

    /// Records stored since this process opened the tier.
    pub fn fills(&self) -> u64 {
        self.fills.load(Ordering::Relaxed)
    }

    fn path(&self, name: u64) -> PathBuf {
        self.dir
            .join(format!("{:02x}", name >> 56))
            .join(format!("{name:016x}.src"))
    }

    /// The stored source of `record` in `form`, if the tier holds a sound one.
    pub fn get(&self, record: &str, form: &SourceForm) -> Option<StoredSource> {
        let key = full_key(record, form);
        let name = record_name(&key);
        if !self.lock().entries.contains_key(&name) {
            metrics::decoded_tier("miss");
            return None;
        }
        let path = self.path(name);
        match std::fs::read(&path).map(|data| parse_record(&data, &key, form)) {
            Ok(Ok(source)) => {
                self.lock().touch(name);
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
        metrics::decoded_tier_bytes(state.bytes);
    }

    /// Stores `source` as `record`'s; a failure to write is logged and
    /// counted (the sample was served all the same).
    pub fn put(&self, record: &str, form: &SourceForm, source: &StoredSource) {
        let key = full_key(record, form);
        let name = record_name(&key);
        let data = encode_record(&key, form, source);
        let bytes = data.len() as u64;
        if bytes > self.max_bytes {
            return;
        }
        if let Err(error) = self.write(name, &data) {
            tracing::warn!(dir = %self.dir.display(), %error, "could not store a decoded source");
            metrics::decoded_tier("write_failed");
            return;
        }
        metrics::decoded_tier("fill");
        self.fills.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(name, bytes);
        self.evict_to(self.max_bytes);
    }

    fn write(&self, name: u64, data: &[u8]) -> std::io::Result<()> {
        let path = self.path(name);
        let parent = path.parent().expect("records live in a bucket directory");
        std::fs::create_dir_all(parent)?;
        let temp = parent.join(format!(
            ".tmp-{}-{}",
            std::process::id(),
            self.next_temp.fetch_add(1, Ordering::Relaxed)
        ));
        let written = std::fs::File::create(&temp).and_then(|mut file| file.write_all(data));
        if let Err(error) = written.and_then(|()| std::fs::rename(&temp, &path)) {
            let _ = std::fs::remove_file(&temp);
            return Err(error);
        }
        Ok(())
    }

    fn evict_to(&self, limit: u64) {
        loop {
            let victim = {
                let mut state = self.lock();
                if state.bytes <= limit {
                    metrics::decoded_tier_bytes(state.bytes);
                    return;
                }
                let Some(&(_, name)) = state.by_use.iter().next() else {
                    return;
                };
                state.remove(name);
                name
            };
            let _ = std::fs::remove_file(self.path(victim));
            metrics::decoded_tier("eviction");
        }
    }
}

/// A record's full key: the sample (its shard's location and ETag, its
/// key) and the form.
fn full_key(record: &str, form: &SourceForm) -> String {
    format!("{record}\n{form}")
}

fn record_name(key: &str) -> u64 {
    super::augment::fmix64(super::augment::fnv1a(key.bytes()))
}

fn kind_code(kind: SourceKind) -> (u8, u8) {
    match kind {
        SourceKind::Raw => (0, 0),
        SourceKind::Yuv420 => (1, 0),
        SourceKind::Jpeg { quality } => (2, quality),
    }
}

/// `MAGIC, key length u32, key, kind u8, quality u8, width, height, original
/// width, original height (u32 each), payload length u64, payload, CRC-32 of
/// all before it` (little endian).
fn encode_record(key: &str, form: &SourceForm, source: &StoredSource) -> Vec<u8> {
    let (kind, quality) = kind_code(form.kind);
    let mut out = Vec::with_capacity(64 + key.len() + source.bytes.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&[kind, quality]);
    for side in [
        source.width,
        source.height,
        source.original_width,
        source.original_height,
    ] {
        out.extend_from_slice(&side.to_le_bytes());
    }
    out.extend_from_slice(&(source.bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(&source.bytes);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn parse_record(data: &[u8], key: &str, form: &SourceForm) -> Result<StoredSource, &'static str> {
    let body_len = data.len().checked_sub(4).ok_or("truncated")?;
    let (body, crc) = data.split_at(body_len);
    if crc32fast::hash(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
        return Err("checksum mismatch");
    }
    let mut reader = Reader { data: body, at: 0 };
    if reader.take(MAGIC.len())? != MAGIC {
        return Err("not a decoded-source record");
    }
    let key_len = reader.u32()? as usize;
    if key_len > MAX_KEY_BYTES || reader.take(key_len)? != key.as_bytes() {
        return Err("another sample's record");
    }
    let (kind, quality) = kind_code(form.kind);
    if reader.take(2)? != [kind, quality] {
        return Err("another form's record");
    }
    let kind = form.kind;
    let (width, height) = (reader.u32()?, reader.u32()?);
    let (original_width, original_height) = (reader.u32()?, reader.u32()?);
    let payload = reader.u64()? as usize;
    let bytes = reader.take(payload)?.to_vec();
    if reader.at != body.len() {
        return Err("trailing bytes");
    }
    Ok(StoredSource {
        kind,
        width,
        height,
        original_width,
        original_height,
        bytes,
    })
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        let end = self.at.checked_add(n).ok_or("truncated")?;
        let slice = self.data.get(self.at..end).ok_or("truncated")?;
        self.at = end;
        Ok(slice)
    }

    fn u32(&mut self) -> Result<u32, &'static str> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, &'static str> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form() -> SourceForm {
        SourceForm {
            shorter_side: 64,
            kind: SourceKind::Raw,
        }
    }

    fn source(seed: u8) -> StoredSource {
        StoredSource {
            kind: SourceKind::Raw,
            width: 8,
            height: 4,
            original_width: 16,
            original_height: 8,
            bytes: vec![seed; 8 * 4 * 3],
        }
    }

    #[test]
    fn a_record_round_trips_and_any_damage_is_caught() {
        let key = full_key("s3://b/shard-0.tar\netag\nk1", &form());
        let record = encode_record(&key, &form(), &source(7));
        assert_eq!(parse_record(&record, &key, &form()).unwrap(), source(7));
        for at in [0, 12, record.len() / 2, record.len() - 1] {
            let mut damaged = record.clone();
            damaged[at] ^= 1;
            assert!(parse_record(&damaged, &key, &form()).is_err(), "byte {at}");
        }
        assert_eq!(
            parse_record(&record[..record.len() - 9], &key, &form()),
            Err("checksum mismatch")
        );
        let other = full_key("s3://b/shard-0.tar\nnew-etag\nk1", &form());
        assert_eq!(
            parse_record(&record, &other, &form()),
            Err("another sample's record")
        );
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
    fn a_damaged_or_deleted_record_is_a_miss_and_is_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DecodedCache::open(dir.path(), 1 << 20).unwrap();
        cache.put("a", &form(), &source(1));
        cache.put("b", &form(), &source(2));
        let path = |record: &str| cache.path(record_name(&full_key(record, &form())));
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
}
