//! Reading ranges of objects: large ranges as several ranged GETs in flight,
//! small objects whole. These helpers never retry; the store they are given
//! does (see [`super::retry::RetryingStore`]).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};

use super::{ObjectMeta, ObjectStore, PartStream, StoreError};

pub const DEFAULT_PART_SIZE: u64 = 8 << 20;
/// Ranged GETs in flight per shard reader where a flag sets no count and
/// the sized count would be fewer (parts of 16 MiB or more).
pub const DEFAULT_PARTS_IN_FLIGHT: usize = 2;
/// Sized tar reads: the bytes of parts a reader keeps in flight, whatever
/// the part size. 32 MiB is 4 parts of 8 MiB: at 25 MiB/s a connection
/// and 20 ms to first byte, ~100 MB/s a reader. The memory formula counts
/// them either way, so a reader uses them from its first part: a stream's
/// start (filling its shuffle buffer) is when it waits on S3 most.
pub const SIZED_PART_BYTES_IN_FLIGHT: u64 = 32 << 20;
/// Sized tar reads: the most parts a reader keeps in flight however small
/// they are (each is a request S3 counts against the prefix's rate).
pub const MAX_SIZED_PARTS_IN_FLIGHT: usize = 16;
/// GETs in flight per reader of a loose-object dataset: one sample each, so
/// it takes dozens to hide S3's first-byte latency (at 20 ms, 16 in flight
/// carry 800 samples/s per reader). Where no flag sets the count, a reader
/// starts at this and grows while its consumer drains it (see
/// [`ReadConfig::object_requests_ceiling`]).
pub const DEFAULT_OBJECT_REQUESTS_IN_FLIGHT: usize = 16;
/// Sized loose reads: the bytes of objects one reader may have in flight,
/// and the most GETs. 32 MiB is 300 of the ~110 KB photos, 128 GETs of
/// them cover 20 ms of first-byte latency up to 6,400 samples/s a reader.
pub const SIZED_OBJECT_BYTES_IN_FLIGHT: u64 = 32 << 20;
pub const MAX_SIZED_OBJECT_REQUESTS: usize = 128;

/// How a large range is split into concurrent ranged GETs ("parts").
#[derive(Debug, Clone)]
pub struct ReadConfig {
    pub part_size: u64,
    /// Parts fetched concurrently per reader where a flag set the count
    /// (see [`Self::parts_per_reader`]).
    pub parts_in_flight: usize,
    /// No flag set it: the server sizes the count from the part size.
    pub parts_sized: bool,
    /// Whole objects fetched concurrently per reader of loose objects: all
    /// the time (a flag set it), or to start with (`object_requests_sized`).
    pub object_requests_in_flight: usize,
    /// The server sizes the loose readers' GETs in flight.
    pub object_requests_sized: bool,
}

impl Default for ReadConfig {
    fn default() -> Self {
        Self {
            part_size: DEFAULT_PART_SIZE,
            parts_in_flight: DEFAULT_PARTS_IN_FLIGHT,
            parts_sized: true,
            object_requests_in_flight: DEFAULT_OBJECT_REQUESTS_IN_FLIGHT,
            object_requests_sized: true,
        }
    }
}

impl ReadConfig {
    /// The ranged GETs a shard reader keeps in flight: the flag's count, or
    /// sized: as many parts as `SIZED_PART_BYTES_IN_FLIGHT` holds, from
    /// [`DEFAULT_PARTS_IN_FLIGHT`] to [`MAX_SIZED_PARTS_IN_FLIGHT`]. The
    /// stream's memory formula counts this many (`engine::budget`).
    pub fn parts_per_reader(&self) -> usize {
        if !self.parts_sized {
            return self.parts_in_flight.max(1);
        }
        ((SIZED_PART_BYTES_IN_FLIGHT / self.part_size.max(1)) as usize)
            .clamp(DEFAULT_PARTS_IN_FLIGHT, MAX_SIZED_PARTS_IN_FLIGHT)
    }

    /// The most GETs a loose reader may have in flight, for objects of
    /// `mean_bytes` on average: the flag's count, or sized: as many as
    /// `SIZED_OBJECT_BYTES_IN_FLIGHT` holds, from the starting count to
    /// `MAX_SIZED_OBJECT_REQUESTS`. The stream's memory formula counts
    /// this many (`engine::budget`).
    pub fn object_requests_ceiling(&self, mean_bytes: u64) -> usize {
        let start = self.object_requests_in_flight.max(1);
        if !self.object_requests_sized {
            return start;
        }
        let fit = (SIZED_OBJECT_BYTES_IN_FLIGHT / mean_bytes.max(1)) as usize;
        fit.clamp(start, MAX_SIZED_OBJECT_REQUESTS.max(start))
    }
}

/// Reads `range` of `key` into one buffer.
pub async fn read_range(
    store: &dyn ObjectStore,
    key: &str,
    range: Range<u64>,
    if_match: Option<&str>,
) -> Result<Bytes, StoreError> {
    let body = store.get_range(key, range.clone(), if_match).await?;
    collect(store, key, body, range).await
}

/// Reads a whole object whose size and ETag an index gave, into one buffer.
pub async fn read_object(
    store: &dyn ObjectStore,
    object: &ObjectMeta,
) -> Result<Bytes, StoreError> {
    let body = store.get_object(object).await?;
    collect(store, &object.key, body, 0..object.size).await
}

async fn collect(
    store: &dyn ObjectStore,
    key: &str,
    mut body: PartStream,
    range: Range<u64>,
) -> Result<Bytes, StoreError> {
    let expected = range.end - range.start;
    // Reserved as the bytes arrive past a first slice: an object's claimed
    // size is not memory to take before it has been read.
    let mut buf = BytesMut::with_capacity(expected.min(COLLECT_RESERVE_BYTES) as usize);
    while let Some(piece) = body.next().await {
        buf.extend_from_slice(&piece?.1);
        if buf.len() as u64 > expected {
            break;
        }
    }
    if buf.len() as u64 != expected {
        return Err(StoreError::Truncated {
            location: store.location(key),
            message: format!(
                "read {} bytes of range {range:?} ({} expected)",
                buf.len(),
                range.end - range.start
            ),
        });
    }
    Ok(buf.freeze())
}

/// The most [`collect`] reserves before the bytes arrive.
const COLLECT_RESERVE_BYTES: u64 = 64 << 20;

/// Reads a whole small object into memory (index files, class lists),
/// refusing one larger than `limit` before reading or reserving any of it:
/// a file in a dataset folder may claim any size (a sparse terabyte).
pub async fn get_all(store: &dyn ObjectStore, key: &str, limit: u64) -> Result<Bytes, StoreError> {
    let meta = store.head(key).await?;
    if meta.size > limit {
        return Err(StoreError::TooLarge {
            location: store.location(key),
            size: meta.size,
            limit,
        });
    }
    read_range(store, key, 0..meta.size, meta.etag.as_deref()).await
}

/// Reads `range` front to back as `part_size` ranged GETs,
/// [`ReadConfig::parts_per_reader`] at a time, yielding parts in order.
/// Memory: at most that many parts are held (plus the consumer's part).
///
/// Each GET runs as a task of its own: a part in flight keeps receiving
/// while the reader parses and hands on samples, not only while it waits
/// for the next part (a future polled only then would leave S3's bytes in
/// the socket, and "in flight" would be a request sent, not bytes coming).
/// Dropping the stream aborts them.
pub fn read_parts(
    store: Arc<dyn ObjectStore>,
    key: String,
    range: Range<u64>,
    if_match: Option<String>,
    config: &ReadConfig,
) -> impl Stream<Item = Result<(u64, Bytes), StoreError>> + Send + 'static {
    let part_size = config.part_size.max(1);
    let location = store.location(&key);
    let state = Fetching {
        starts: (range.start..range.end).step_by(part_size as usize),
        end: range.end,
        pending: VecDeque::new(),
        store,
        key: Arc::from(key),
        if_match: if_match.map(Arc::from),
        part_size,
        in_flight: config.parts_per_reader(),
    };
    futures::stream::unfold(state, move |mut state| {
        let location = location.clone();
        async move {
            state.fill();
            let mut fetch = state.pending.pop_front()?;
            let part = match (&mut fetch.task).await {
                Ok(part) => part,
                Err(error) => Err(StoreError::Other {
                    location,
                    message: format!("ranged GET task ended: {error}"),
                }),
            };
            // The part leaves the gauge once it is handed to the consumer.
            drop(fetch);
            Some((part, state))
        }
    })
}

struct Fetching {
    starts: std::iter::StepBy<Range<u64>>,
    end: u64,
    pending: VecDeque<PartFetch>,
    store: Arc<dyn ObjectStore>,
    key: Arc<str>,
    if_match: Option<Arc<str>>,
    part_size: u64,
    in_flight: usize,
}

impl Fetching {
    /// Starts GETs until the reader's count is in flight.
    fn fill(&mut self) {
        while self.pending.len() < self.in_flight.max(1) {
            let Some(start) = self.starts.next() else {
                return;
            };
            let (store, key) = (self.store.clone(), self.key.clone());
            let if_match = self.if_match.clone();
            let end = (start + self.part_size).min(self.end);
            let task = tokio::spawn(async move {
                read_range(store.as_ref(), &key, start..end, if_match.as_deref())
                    .await
                    .map(|bytes| (start, bytes))
            });
            self.pending.push_back(PartFetch {
                task,
                _in_flight: crate::metrics::GaugeGuard::new(crate::metrics::PARTS_IN_FLIGHT, 1.0),
            });
        }
    }
}

/// One ranged GET in flight, aborted if the reader goes away first.
struct PartFetch {
    task: tokio::task::JoinHandle<Result<(u64, Bytes), StoreError>>,
    _in_flight: crate::metrics::GaugeGuard,
}

impl Drop for PartFetch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::local::LocalStore;

    fn parts(size: u64, in_flight: usize) -> ReadConfig {
        ReadConfig {
            part_size: size,
            parts_in_flight: in_flight,
            parts_sized: false,
            ..ReadConfig::default()
        }
    }

    #[tokio::test]
    async fn parts_arrive_whole_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(dir.path().join("shard.tar"), &data).unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(LocalStore::new(dir.path()));
        let parts = read_parts(
            store,
            "shard.tar".into(),
            1_000..99_001,
            None,
            &parts(4_096, 3),
        );
        let mut parts = std::pin::pin!(parts);
        let mut read = Vec::new();
        let mut expected_start = 1_000;
        while let Some(part) = parts.next().await {
            let (start, bytes) = part.unwrap();
            assert_eq!(start, expected_start, "in order");
            expected_start += bytes.len() as u64;
            read.extend_from_slice(&bytes);
        }
        assert_eq!(read, data[1_000..99_001]);
    }

    #[tokio::test]
    async fn a_failed_part_is_an_error_in_its_place() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("short"), vec![1u8; 10_000]).unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(LocalStore::new(dir.path()));
        // The range runs past the object's end: the last part is short.
        let parts = read_parts(store, "short".into(), 0..20_000, None, &parts(8_192, 4));
        let results: Vec<_> = parts.collect().await;
        assert!(results[0].is_ok());
        assert!(results.iter().skip(1).any(Result::is_err));
    }

    #[test]
    fn a_reader_keeps_the_flags_count_or_32_mib_of_parts() {
        assert_eq!(ReadConfig::default().parts_per_reader(), 4);
        assert_eq!(parts(8 << 20, 3).parts_per_reader(), 3);
        let sized = |size| ReadConfig {
            part_size: size,
            ..ReadConfig::default()
        };
        assert_eq!(sized(4 << 20).parts_per_reader(), 8);
        assert_eq!(sized(64 << 20).parts_per_reader(), 2, "never below 2");
        assert_eq!(sized(64 << 10).parts_per_reader(), 16, "nor above 16");
    }
}
