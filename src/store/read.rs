//! Reading ranges of objects: large ranges as several ranged GETs in flight,
//! small objects whole. These helpers never retry; the store they are given
//! does (see [`super::retry::RetryingStore`]).

use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};

use super::{ObjectMeta, ObjectStore, PartStream, StoreError};

pub const DEFAULT_PART_SIZE: u64 = 8 << 20;
pub const DEFAULT_PARTS_IN_FLIGHT: usize = 2;
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
    /// Parts fetched concurrently per reader.
    pub parts_in_flight: usize,
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
            object_requests_in_flight: DEFAULT_OBJECT_REQUESTS_IN_FLIGHT,
            object_requests_sized: true,
        }
    }
}

impl ReadConfig {
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
    let mut buf = BytesMut::with_capacity((range.end - range.start) as usize);
    while let Some(piece) = body.next().await {
        buf.extend_from_slice(&piece?.1);
    }
    if buf.len() as u64 != range.end - range.start {
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

/// Reads a whole small object into memory (index files).
pub async fn get_all(store: &dyn ObjectStore, key: &str) -> Result<Bytes, StoreError> {
    let meta = store.head(key).await?;
    read_range(store, key, 0..meta.size, meta.etag.as_deref()).await
}

/// Reads `range` front to back as `part_size` ranged GETs, `parts_in_flight`
/// at a time, yielding parts in order. Memory: at most
/// `parts_in_flight * part_size` bytes are held (plus the consumer's part).
pub fn read_parts(
    store: Arc<dyn ObjectStore>,
    key: String,
    range: Range<u64>,
    if_match: Option<String>,
    config: &ReadConfig,
) -> impl Stream<Item = Result<(u64, Bytes), StoreError>> + Send + 'static {
    let part_size = config.part_size.max(1);
    let starts = (range.start..range.end).step_by(part_size as usize);
    futures::stream::iter(starts)
        .map(move |start| {
            let store = store.clone();
            let key = key.clone();
            let if_match = if_match.clone();
            let end = (start + part_size).min(range.end);
            async move {
                // Counted until the part is handed to the consumer.
                let in_flight =
                    crate::metrics::GaugeGuard::new(crate::metrics::PARTS_IN_FLIGHT, 1.0);
                let bytes =
                    read_range(store.as_ref(), &key, start..end, if_match.as_deref()).await?;
                Ok::<_, StoreError>((start, bytes, in_flight))
            }
        })
        .buffered(config.parts_in_flight.max(1))
        .map(|part| part.map(|(start, bytes, _in_flight)| (start, bytes)))
}
