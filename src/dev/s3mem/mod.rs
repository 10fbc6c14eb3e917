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
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use s3s::dto::{self, ETag, StreamingBlob, Timestamp};
use s3s::{s3_error, S3Request, S3Response, S3Result, S3};

mod faults;
use faults::{body_stream, pause, BodyEnd, STALL};
pub use faults::{Faults, Gate, Injected, Operation};

pub const DEMO_ACCESS_KEY: &str = "shardfeed-demo";
pub const DEMO_SECRET_KEY: &str = "shardfeed-demo-secret";

#[derive(Debug, Clone)]
struct Object {
    data: Bytes,
    etag: String,
    modified: SystemTime,
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
        let input = req.input;
        if let Err(error) = self.0.faults.scripted(Operation::Put) {
            return Err(after_body(input.body, error).await);
        }
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
        let input = req.input;
        if let Err(error) = self.0.faults.scripted(Operation::Put) {
            return Err(after_body(input.body, error).await);
        }
        self.0.faults.part_gate.pass().await;
        pause(&self.0.faults.part_delay).await;
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

/// `error`, sent once the request's body is read: S3 answers an upload
/// after its body, and an answer sent while the client still writes 16 MiB
/// reaches it as a broken pipe, not as the error the test scripted.
async fn after_body(body: Option<StreamingBlob>, error: s3s::S3Error) -> s3s::S3Error {
    let _ = read_body(body).await;
    error
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
