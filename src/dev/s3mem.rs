//! An S3-compatible HTTP server held in memory, on loopback.
//!
//! Built on the s3s crate (the S3 wire protocol, SigV4 auth); this module is
//! only the storage backend. `shardfeed demo` serves its synthetic dataset from
//! it, tests write fixtures into it through aws-sdk-s3 and read them back
//! through shardfeed, and [`Faults`] scripts failures per request (throttling,
//! slow first byte, bodies cut short) the way a real S3 produces them.
//! It also counts requests at the server side, so tests can check what
//! shardfeed really asked for.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use s3s::dto::{self, ETag, StreamingBlob, Timestamp};
use s3s::{s3_error, S3Request, S3Response, S3Result, S3};

pub const DEMO_ACCESS_KEY: &str = "shardfeed-demo";
pub const DEMO_SECRET_KEY: &str = "shardfeed-demo-secret";

#[derive(Debug, Clone)]
struct Object {
    data: Bytes,
    etag: String,
    modified: SystemTime,
}

/// The S3 operations shardfeed makes, for scripting faults per operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Get,
    Head,
    List,
    Put,
}

/// A failure a scripted request answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injected {
    /// 503 SlowDown: throttling, transient.
    SlowDown,
    /// 500 InternalError: transient.
    InternalError,
    /// 403 AccessDenied: permanent.
    AccessDenied,
    /// 404 NoSuchKey: permanent.
    NoSuchKey,
}

/// Failures to inject. The GET-only knobs are consumed one per matching GET;
/// [`Faults::fail_next`] scripts any operation.
#[derive(Debug, Default)]
pub struct Faults {
    script: Mutex<HashMap<Operation, std::collections::VecDeque<Injected>>>,
    /// Delay before every GET's response (simulates S3's time to first byte).
    pub get_delay: Mutex<Duration>,
    /// Delay before every LIST page's response.
    pub list_delay: Mutex<Duration>,
    /// Delay before every multipart part's response (a slow uplink).
    pub part_delay: Mutex<Duration>,
    /// While closed, every GET waits here before it answers: a test holds
    /// fetches in flight for exactly as long as it needs, with no sleep.
    pub get_gate: Gate,
    /// The same for every multipart part.
    pub part_gate: Gate,
    /// The next N GETs fail with 503 SlowDown.
    pub slow_down: AtomicU64,
    /// The next N GET bodies stop after this many bytes.
    pub cut_bodies: AtomicU64,
    pub cut_after: AtomicU64,
    /// The next N GETs answer 500 InternalError (for tests of exhausted retries).
    pub internal_errors: AtomicU64,
    /// The next N GETs send no response headers for two minutes (a request
    /// accepted and then forgotten).
    pub stall_headers: AtomicU64,
    /// The next N GET bodies stop after `cut_after` bytes and then send
    /// nothing for two minutes, the connection left open.
    pub stall_bodies: AtomicU64,
    /// Every Nth GET fails with 503 SlowDown (0: never).
    pub slow_down_every: AtomicU64,
    gets_seen: AtomicU64,
    /// Every request until this instant answers 503 (a regional outage).
    outage_until: Mutex<Option<std::time::Instant>>,
    /// ListObjectsV2 answers without ETags (some S3-compatible servers
    /// do; HEAD and GET still carry them).
    pub list_without_etags: std::sync::atomic::AtomicBool,
    /// HEAD answers without an ETag too: no version to be had but the GET's.
    pub head_without_etags: std::sync::atomic::AtomicBool,
    /// Percent of all requests (0-100) that fail, alternating 500
    /// InternalError and 503 SlowDown, at pseudo-random (a fixed sequence).
    pub fail_percent: AtomicU64,
    /// Bytes a second each GET's body is sent at (0: as fast as it goes),
    /// as one connection to S3 carries tens of MB/s, not a loopback's GB/s.
    pub get_bytes_per_second: AtomicU64,
    requests_seen: AtomicU64,
}

/// A gate requests wait at while it is closed (open at first).
#[derive(Debug)]
pub struct Gate {
    open: tokio::sync::watch::Sender<bool>,
    held: std::sync::atomic::AtomicUsize,
    arrived: tokio::sync::Notify,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            open: tokio::sync::watch::Sender::new(true),
            held: Default::default(),
            arrived: Default::default(),
        }
    }
}

impl Gate {
    /// Requests arriving from now on wait until [`Gate::open`].
    pub fn close(&self) {
        self.open.send_replace(false);
    }

    /// Lets every waiting request, and those to come, through.
    pub fn open(&self) {
        self.open.send_replace(true);
    }

    /// Requests waiting at the gate now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Waits until at least `count` requests wait at the gate; false if
    /// `within` passed first.
    pub async fn wait_held(&self, count: usize, within: Duration) -> bool {
        tokio::time::timeout(within, async {
            loop {
                // Registered before the check: an arrival in between wakes it.
                let arrived = self.arrived.notified();
                if self.held() >= count {
                    return;
                }
                arrived.await;
            }
        })
        .await
        .is_ok()
    }

    /// Passes the gate, waiting while it is closed.
    async fn pass(&self) {
        let mut open = self.open.subscribe();
        if *open.borrow_and_update() {
            return;
        }
        self.held.fetch_add(1, Ordering::SeqCst);
        // Counted out also when the request is dropped while it waits.
        let _held = CountedOut(&self.held);
        self.arrived.notify_waiters();
        // The sender lives as long as the server: `wait_for` ends when opened.
        let _ = open.wait_for(|open| *open).await;
    }
}

struct CountedOut<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for CountedOut<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Faults {
    pub fn set_get_delay(&self, delay: Duration) {
        *self
            .get_delay
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = delay;
    }

    pub fn set_list_delay(&self, delay: Duration) {
        set(&self.list_delay, delay);
    }

    pub fn set_part_delay(&self, delay: Duration) {
        set(&self.part_delay, delay);
    }

    /// The next `count` requests of `operation` fail with `fault`, after
    /// whatever was scripted before.
    pub fn fail_next(&self, operation: Operation, count: usize, fault: Injected) {
        self.lock_script()
            .entry(operation)
            .or_default()
            .extend(std::iter::repeat_n(fault, count));
    }

    /// Every request fails with 503 for `duration` from now.
    pub fn outage(&self, duration: Duration) {
        *self
            .outage_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(std::time::Instant::now() + duration);
    }

    /// Answers a request of `operation` with its next scripted failure, if any.
    fn scripted(&self, operation: Operation) -> S3Result<()> {
        let in_outage = self
            .outage_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some_and(|until| std::time::Instant::now() < until);
        if in_outage {
            return Err(s3_error!(ServiceUnavailable, "injected outage"));
        }
        let percent = self.fail_percent.load(Ordering::Relaxed);
        if percent > 0 {
            let n = self.requests_seen.fetch_add(1, Ordering::Relaxed);
            // A fixed scramble of the request number: the same run of
            // failures every time, spread over the requests.
            let draw = n.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17) % 100;
            if draw < percent {
                return Err(if n.is_multiple_of(2) {
                    s3_error!(InternalError, "injected random failure")
                } else {
                    s3_error!(SlowDown, "injected random throttling")
                });
            }
        }
        let fault = self
            .lock_script()
            .get_mut(&operation)
            .and_then(|queue| queue.pop_front());
        match fault {
            None => Ok(()),
            Some(Injected::SlowDown) => Err(s3_error!(SlowDown, "injected throttling")),
            Some(Injected::InternalError) => Err(s3_error!(InternalError, "injected failure")),
            Some(Injected::AccessDenied) => Err(s3_error!(AccessDenied, "injected denial")),
            Some(Injected::NoSuchKey) => Err(s3_error!(NoSuchKey, "injected: no such key")),
        }
    }

    fn lock_script(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<Operation, std::collections::VecDeque<Injected>>> {
        self.script
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn take(counter: &AtomicU64) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// Requests served, by operation, counted at the server.
#[derive(Debug, Default)]
pub struct RequestCounts {
    pub get: AtomicU64,
    pub head: AtomicU64,
    pub list: AtomicU64,
    pub put: AtomicU64,
    pub get_bytes: AtomicU64,
    /// Multipart uploads completed.
    pub multipart_uploads: AtomicU64,
}

/// A multipart upload in progress: bucket, key, parts by number.
type Upload = (String, String, BTreeMap<i32, Bytes>);

#[derive(Debug, Default)]
pub struct MemoryS3 {
    buckets: RwLock<HashMap<String, BTreeMap<String, Object>>>,
    /// Multipart uploads in progress: id -> (bucket, key, parts by number).
    uploads: Mutex<HashMap<String, Upload>>,
    next_upload: AtomicU64,
    pub faults: Faults,
    pub counts: RequestCounts,
}

fn etag_of(data: &[u8]) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    data.hash(&mut hasher);
    format!("{:016x}{:08x}", hasher.finish(), data.len())
}

impl MemoryS3 {
    pub fn create_bucket(&self, bucket: &str) {
        self.write().entry(bucket.to_string()).or_default();
    }

    /// Stores an object directly (fixtures that need no SDK round trip).
    pub fn insert(&self, bucket: &str, key: &str, data: Bytes) {
        let object = Object {
            etag: etag_of(&data),
            data,
            modified: SystemTime::now(),
        };
        self.write()
            .entry(bucket.to_string())
            .or_default()
            .insert(key.to_string(), object);
    }

    /// Deletes an object directly: a key that is gone answers NoSuchKey to
    /// every request, unlike an injected fault that lands on whichever
    /// request arrives next.
    pub fn remove(&self, bucket: &str, key: &str) -> bool {
        self.write()
            .get_mut(bucket)
            .is_some_and(|objects| objects.remove(key).is_some())
    }

    pub fn object(&self, bucket: &str, key: &str) -> Option<Bytes> {
        self.read().get(bucket)?.get(key).map(|o| o.data.clone())
    }

    fn lock_uploads(&self) -> std::sync::MutexGuard<'_, HashMap<String, Upload>> {
        self.uploads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Multipart uploads started and neither completed nor aborted.
    pub fn open_uploads(&self) -> usize {
        self.lock_uploads().len()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, BTreeMap<String, Object>>> {
        self.buckets
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, BTreeMap<String, Object>>> {
        self.buckets
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn get(&self, bucket: &str, key: &str) -> S3Result<Object> {
        let buckets = self.read();
        let objects = buckets
            .get(bucket)
            .ok_or_else(|| s3_error!(NoSuchBucket, "bucket {bucket} does not exist"))?;
        objects
            .get(key)
            .cloned()
            .ok_or_else(|| s3_error!(NoSuchKey, "key {key} does not exist"))
    }
}

/// The s3s backend; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Backend(pub Arc<MemoryS3>);

#[async_trait::async_trait]
impl S3 for Backend {
    async fn create_bucket(
        &self,
        req: S3Request<dto::CreateBucketInput>,
    ) -> S3Result<S3Response<dto::CreateBucketOutput>> {
        self.0.create_bucket(&req.input.bucket);
        Ok(S3Response::new(dto::CreateBucketOutput::default()))
    }

    async fn head_bucket(
        &self,
        req: S3Request<dto::HeadBucketInput>,
    ) -> S3Result<S3Response<dto::HeadBucketOutput>> {
        if !self.0.read().contains_key(&req.input.bucket) {
            return Err(s3_error!(NoSuchBucket));
        }
        Ok(S3Response::new(dto::HeadBucketOutput::default()))
    }

    async fn put_object(
        &self,
        req: S3Request<dto::PutObjectInput>,
    ) -> S3Result<S3Response<dto::PutObjectOutput>> {
        self.0.counts.put.fetch_add(1, Ordering::Relaxed);
        self.0.faults.scripted(Operation::Put)?;
        let input = req.input;
        if !self.0.read().contains_key(&input.bucket) {
            return Err(s3_error!(NoSuchBucket));
        }
        let data = read_body(input.body).await?;
        let etag = etag_of(&data);
        self.0.insert(&input.bucket, &input.key, data);
        Ok(S3Response::new(dto::PutObjectOutput {
            e_tag: Some(ETag::Strong(etag)),
            ..Default::default()
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<dto::CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<dto::CreateMultipartUploadOutput>> {
        self.0.counts.put.fetch_add(1, Ordering::Relaxed);
        self.0.faults.scripted(Operation::Put)?;
        let input = req.input;
        if !self.0.read().contains_key(&input.bucket) {
            return Err(s3_error!(NoSuchBucket));
        }
        let id = format!(
            "upload-{}",
            self.0.next_upload.fetch_add(1, Ordering::SeqCst)
        );
        self.0.lock_uploads().insert(
            id.clone(),
            (input.bucket.clone(), input.key.clone(), BTreeMap::new()),
        );
        Ok(S3Response::new(dto::CreateMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(id),
            ..Default::default()
        }))
    }

    async fn upload_part(
        &self,
        req: S3Request<dto::UploadPartInput>,
    ) -> S3Result<S3Response<dto::UploadPartOutput>> {
        self.0.counts.put.fetch_add(1, Ordering::Relaxed);
        self.0.faults.scripted(Operation::Put)?;
        self.0.faults.part_gate.pass().await;
        pause(&self.0.faults.part_delay).await;
        let input = req.input;
        let data = read_body(input.body).await?;
        let etag = etag_of(&data);
        let mut uploads = self.0.lock_uploads();
        let (_, _, parts) = uploads
            .get_mut(&input.upload_id)
            .ok_or_else(|| s3_error!(NoSuchUpload))?;
        parts.insert(input.part_number, data);
        Ok(S3Response::new(dto::UploadPartOutput {
            e_tag: Some(ETag::Strong(etag)),
            ..Default::default()
        }))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<dto::CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<dto::CompleteMultipartUploadOutput>> {
        self.0.counts.put.fetch_add(1, Ordering::Relaxed);
        self.0.faults.scripted(Operation::Put)?;
        let input = req.input;
        let (bucket, key, parts) = self
            .0
            .lock_uploads()
            .remove(&input.upload_id)
            .ok_or_else(|| s3_error!(NoSuchUpload))?;
        let listed: Vec<i32> = input
            .multipart_upload
            .and_then(|upload| upload.parts)
            .unwrap_or_default()
            .iter()
            .filter_map(|part| part.part_number)
            .collect();
        if listed.is_empty() || listed != parts.keys().copied().collect::<Vec<_>>() {
            return Err(s3_error!(
                InvalidPart,
                "parts listed {listed:?} are not the parts uploaded"
            ));
        }
        let mut data = BytesMut::new();
        for part in parts.values() {
            data.extend_from_slice(part);
        }
        let data = data.freeze();
        let etag = etag_of(&data);
        self.0.insert(&bucket, &key, data);
        self.0
            .counts
            .multipart_uploads
            .fetch_add(1, Ordering::Relaxed);
        Ok(S3Response::new(dto::CompleteMultipartUploadOutput {
            bucket: Some(bucket),
            key: Some(key),
            e_tag: Some(ETag::Strong(etag)),
            ..Default::default()
        }))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<dto::AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<dto::AbortMultipartUploadOutput>> {
        self.0.lock_uploads().remove(&req.input.upload_id);
        Ok(S3Response::new(dto::AbortMultipartUploadOutput::default()))
    }

    async fn head_object(
        &self,
        req: S3Request<dto::HeadObjectInput>,
    ) -> S3Result<S3Response<dto::HeadObjectOutput>> {
        self.0.counts.head.fetch_add(1, Ordering::Relaxed);
        self.0.faults.scripted(Operation::Head)?;
        let object = self.0.get(&req.input.bucket, &req.input.key)?;
        let e_tag = (!self.0.faults.head_without_etags.load(Ordering::Relaxed))
            .then_some(ETag::Strong(object.etag));
        Ok(S3Response::new(dto::HeadObjectOutput {
            content_length: Some(object.data.len() as i64),
            e_tag,
            last_modified: Some(Timestamp::from(object.modified)),
            ..Default::default()
        }))
    }

    async fn get_object(
        &self,
        req: S3Request<dto::GetObjectInput>,
    ) -> S3Result<S3Response<dto::GetObjectOutput>> {
        let server = &self.0;
        server.counts.get.fetch_add(1, Ordering::Relaxed);
        server.faults.get_gate.pass().await;
        let delay = *server
            .faults
            .get_delay
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if Faults::take(&server.faults.stall_headers) {
            tokio::time::sleep(STALL).await;
        }
        let every = server.faults.slow_down_every.load(Ordering::Relaxed);
        let seen = server.faults.gets_seen.fetch_add(1, Ordering::Relaxed) + 1;
        if Faults::take(&server.faults.slow_down) || (every > 0 && seen.is_multiple_of(every)) {
            return Err(s3_error!(SlowDown, "injected throttling"));
        }
        if Faults::take(&server.faults.internal_errors) {
            return Err(s3_error!(InternalError, "injected failure"));
        }
        server.faults.scripted(Operation::Get)?;
        let input = req.input;
        let object = server.get(&input.bucket, &input.key)?;
        if let Some(condition) = &input.if_match {
            if let Some(expected) = condition.as_etag() {
                if expected.value() != object.etag {
                    return Err(s3_error!(PreconditionFailed));
                }
            }
        }
        let len = object.data.len() as u64;
        let range = match input.range {
            Some(range) => range
                .check(len)
                .map_err(|_| s3_error!(InvalidRange, "range not satisfiable for {len} bytes"))?,
            None => 0..len,
        };
        let body = object.data.slice(range.start as usize..range.end as usize);
        server
            .counts
            .get_bytes
            .fetch_add(body.len() as u64, Ordering::Relaxed);
        let content_length = body.len() as i64;
        let cut_after = server.faults.cut_after.load(Ordering::SeqCst) as usize;
        let end = if Faults::take(&server.faults.stall_bodies) {
            BodyEnd::StallAfter(cut_after)
        } else if Faults::take(&server.faults.cut_bodies) {
            BodyEnd::CutAfter(cut_after)
        } else {
            BodyEnd::Whole
        };
        let pace = server.faults.get_bytes_per_second.load(Ordering::Relaxed);
        let stream = body_stream(body, end, pace);
        Ok(S3Response::new(dto::GetObjectOutput {
            body: Some(StreamingBlob::wrap(stream)),
            content_length: Some(content_length),
            content_range: input.range.map(|_| {
                format!(
                    "bytes {}-{}/{len}",
                    range.start,
                    range.end.saturating_sub(1)
                )
            }),
            e_tag: Some(ETag::Strong(object.etag)),
            last_modified: Some(Timestamp::from(object.modified)),
            accept_ranges: Some("bytes".into()),
            ..Default::default()
        }))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<dto::ListObjectsV2Input>,
    ) -> S3Result<S3Response<dto::ListObjectsV2Output>> {
        self.0.counts.list.fetch_add(1, Ordering::Relaxed);
        self.0.faults.scripted(Operation::List)?;
        pause(&self.0.faults.list_delay).await;
        let input = req.input;
        let prefix = input.prefix.clone().unwrap_or_default();
        let max_keys = input.max_keys.unwrap_or(1000).clamp(1, 1000) as usize;
        let after = input
            .continuation_token
            .clone()
            .or(input.start_after.clone())
            .unwrap_or_default();
        let buckets = self.0.read();
        let objects = buckets
            .get(&input.bucket)
            .ok_or_else(|| s3_error!(NoSuchBucket, "bucket {} does not exist", input.bucket))?;
        let mut contents = Vec::new();
        let mut truncated = false;
        for (key, object) in objects.range(after.clone()..) {
            if key == &after || !key.starts_with(&prefix) {
                continue;
            }
            if contents.len() == max_keys {
                truncated = true;
                break;
            }
            contents.push(dto::Object {
                key: Some(key.clone()),
                size: Some(object.data.len() as i64),
                e_tag: (!self.0.faults.list_without_etags.load(Ordering::Relaxed))
                    .then(|| ETag::Strong(object.etag.clone())),
                last_modified: Some(Timestamp::from(object.modified)),
                ..Default::default()
            });
        }
        let next = truncated
            .then(|| contents.last().and_then(|o: &dto::Object| o.key.clone()))
            .flatten();
        Ok(S3Response::new(dto::ListObjectsV2Output {
            name: Some(input.bucket),
            prefix: input.prefix,
            key_count: Some(contents.len() as i32),
            max_keys: Some(max_keys as i32),
            is_truncated: Some(truncated),
            continuation_token: input.continuation_token,
            next_continuation_token: next,
            contents: Some(contents),
            ..Default::default()
        }))
    }
}

fn set(knob: &Mutex<Duration>, delay: Duration) {
    *knob
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = delay;
}

/// Waits as long as `knob` says (not holding its lock meanwhile).
async fn pause(knob: &Mutex<Duration>) {
    let delay = *knob
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

/// A request body, whole.
async fn read_body(body: Option<StreamingBlob>) -> S3Result<Bytes> {
    let mut data = BytesMut::new();
    if let Some(mut body) = body {
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| s3_error!(IncompleteBody, "{e}"))?;
            data.extend_from_slice(&chunk);
        }
    }
    Ok(data.freeze())
}

/// How long a stalled response waits: far longer than any client timeout.
const STALL: Duration = Duration::from_secs(120);

/// How a GET body ends.
#[derive(Debug, Clone, Copy)]
enum BodyEnd {
    Whole,
    /// The connection breaks after this many bytes.
    CutAfter(usize),
    /// Nothing more is sent after this many bytes, the connection kept open.
    StallAfter(usize),
}

/// The body in 64 KiB frames, ending as `end` says. The bytes before a cut
/// or stall reach the client, as when a connection breaks mid-body: the
/// failure waits until they are written out.
fn body_stream(
    body: Bytes,
    end: BodyEnd,
    bytes_per_second: u64,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + Sync + 'static {
    const FRAME: usize = 64 << 10;
    let (limit, pause) = match end {
        BodyEnd::Whole => (body.len(), None),
        BodyEnd::CutAfter(at) => (at.min(body.len()), Some(Duration::from_millis(50))),
        BodyEnd::StallAfter(at) => (at.min(body.len()), Some(STALL)),
    };
    let frames: Vec<Result<Bytes, std::io::Error>> = (0..limit)
        .step_by(FRAME)
        .map(|start| Ok(body.slice(start..(start + FRAME).min(limit))))
        .collect();
    let failure = pause.filter(|_| limit < body.len()).map(|pause| {
        let error = std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            format!("injected: body cut after {limit} bytes"),
        );
        (pause, error)
    });
    // Each frame leaves no sooner than the bytes before it allow at the
    // pace (from the first frame: the first-byte delay is the GET's own).
    let started = tokio::time::Instant::now();
    let mut sent = 0u64;
    let due: Vec<Duration> = frames
        .iter()
        .map(|frame| {
            let at = sent;
            sent += frame.as_ref().map_or(0, |bytes| bytes.len() as u64);
            match bytes_per_second {
                0 => Duration::ZERO,
                pace => Duration::from_secs_f64(at as f64 / pace as f64),
            }
        })
        .collect();
    let paced =
        futures::stream::iter(frames.into_iter().zip(due)).then(move |(frame, due)| async move {
            if !due.is_zero() {
                tokio::time::sleep_until(started + due).await;
            }
            frame
        });
    paced.chain(futures::stream::unfold(failure, |failure| async move {
        let (pause, error) = failure?;
        // Let the server flush what was sent before the connection breaks.
        tokio::time::sleep(pause).await;
        Some((Err(error), None))
    }))
}

/// A running server. Dropping it stops accepting connections.
pub struct RunningS3 {
    pub addr: SocketAddr,
    pub state: Arc<MemoryS3>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningS3 {
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A store config that reaches this server with its credentials.
    pub fn s3_config(&self) -> crate::store::s3::S3Config {
        crate::store::s3::S3Config {
            endpoint: Some(self.endpoint()),
            force_path_style: true,
            region: Some("us-east-1".into()),
            static_credentials: Some((DEMO_ACCESS_KEY.into(), DEMO_SECRET_KEY.into())),
        }
    }
}

impl Drop for RunningS3 {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the server on `127.0.0.1:port` (0 picks a free port).
pub async fn start(port: u16) -> std::io::Result<RunningS3> {
    start_on(SocketAddr::from(([127, 0, 0, 1], port))).await
}

/// Starts the server on `addr`.
pub async fn start_on(addr: SocketAddr) -> std::io::Result<RunningS3> {
    let state = Arc::new(MemoryS3::default());
    let service = {
        let mut builder = s3s::service::S3ServiceBuilder::new(Backend(state.clone()));
        builder.set_auth(s3s::auth::SimpleAuth::from_single(
            DEMO_ACCESS_KEY,
            DEMO_SECRET_KEY,
        ));
        builder.build()
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            // Without it small responses wait ~40 ms for delayed ACKs.
            let _ = stream.set_nodelay(true);
            let service = service.clone();
            connections.spawn(async move {
                let io = hyper_util::rt::TokioIo::new(stream);
                let builder = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                );
                let _ = builder.serve_connection(io, service).await;
            });
            while connections.try_join_next().is_some() {}
        }
    });
    Ok(RunningS3 { addr, state, task })
}
