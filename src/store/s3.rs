//! Amazon S3 (and S3-compatible servers) through aws-sdk-s3.
//!
//! Credentials, region and endpoint come from the standard AWS chain
//! (`AWS_REGION`, `AWS_ENDPOINT_URL`, IRSA, instance profile, ...); the
//! overrides here are for S3-compatible servers. The SDK's own retries are
//! off: [`super::retry`] is the single retry layer, so attempts are counted
//! once and broken bodies resume from the right byte.

use std::ops::Range;
use std::time::Instant;

use async_trait::async_trait;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::Client;
use bytes::Bytes;
use futures::StreamExt;

use super::{ListPage, MultipartShape, ObjectMeta, ObjectStore, PartStream, StoreError};
use crate::metrics;

/// How to reach S3; everything unset comes from the AWS default chain.
#[derive(Clone, Default)]
pub struct S3Config {
    pub endpoint: Option<String>,
    pub force_path_style: bool,
    pub region: Option<String>,
    /// Static credentials (access key, secret key); for the demo's local server.
    pub static_credentials: Option<(String, String)>,
}

// Hand-written so that credentials can never reach a log line.
impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("force_path_style", &self.force_path_style)
            .field("region", &self.region)
            .field(
                "static_credentials",
                &self.static_credentials.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::S3Config;

    #[test]
    fn debug_output_never_shows_credentials() {
        let config = S3Config {
            static_credentials: Some(("AKIAEXAMPLE".into(), "very-secret".into())),
            ..S3Config::default()
        };
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("very-secret") && !shown.contains("AKIAEXAMPLE"),
            "{shown}"
        );
        assert!(shown.contains("<redacted>"));
    }
}

/// Builds one client per process; it is cheap to clone and pools connections.
pub async fn client(config: &S3Config) -> Client {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(endpoint) = &config.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    if let Some((access_key, secret_key)) = &config.static_credentials {
        loader = loader.credentials_provider(aws_sdk_s3::config::Credentials::new(
            access_key,
            secret_key,
            None,
            None,
            "shardfeed-static",
        ));
    }
    let region = aws_config::meta::region::RegionProviderChain::first_try(
        config.region.clone().map(aws_sdk_s3::config::Region::new),
    )
    .or_default_provider()
    .or_else("us-east-1");
    let shared = loader.region(region).load().await;
    let s3_config = aws_sdk_s3::config::Builder::from(&shared)
        .force_path_style(config.force_path_style)
        .retry_config(RetryConfig::disabled())
        .build();
    Client::from_conf(s3_config)
}

/// Objects larger than this are uploaded in parts (S3 takes at most 5 GB in
/// one PUT; parts upload in parallel and a failure costs one part).
pub const MULTIPART_THRESHOLD: u64 = 64 << 20;
/// Upload part size: 16 MiB (S3's minimum is 5 MiB, its maximum part count
/// 10,000: objects up to 160 GB).
pub const MULTIPART_PART_SIZE: usize = 16 << 20;
/// Parts uploaded at once.
const MULTIPART_PARTS_IN_FLIGHT: usize = 4;

#[derive(Debug, Clone)]
pub struct S3Store {
    client: Client,
    bucket: String,
}

impl S3Store {
    pub fn new(client: Client, bucket: impl Into<String>) -> Self {
        Self {
            client,
            bucket: bucket.into(),
        }
    }
}

fn classify<E>(
    location: String,
    error: SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match &error {
        SdkError::ServiceError(service) => {
            let status = service.raw().status().as_u16();
            let code = service.err().code().unwrap_or_default().to_string();
            let message = match service.err().message() {
                Some(text) => format!("{code} (HTTP {status}): {text}"),
                None => format!("{code} (HTTP {status})").trim_start().to_string(),
            };
            match (status, code.as_str()) {
                (
                    _,
                    "ExpiredToken" | "InvalidAccessKeyId" | "InvalidToken" | "TokenRefreshRequired",
                ) => StoreError::Credentials { location, message },
                (_, "NoSuchBucket") => StoreError::NotFound {
                    location: location.split('/').take(3).collect::<Vec<_>>().join("/"),
                    message: "no such bucket".into(),
                },
                (404, _) | (_, "NoSuchKey") => StoreError::NotFound { location, message },
                (401 | 403, _) => StoreError::PermissionDenied { location, message },
                (412, _) => StoreError::Changed { location },
                (416, _) | (_, "InvalidRange") => StoreError::Truncated { location, message },
                (429 | 503, _)
                | (
                    _,
                    "SlowDown"
                    | "Throttling"
                    | "ThrottlingException"
                    | "RequestLimitExceeded"
                    | "TooManyRequestsException",
                ) => StoreError::Throttled { location, message },
                (408 | 500..=599, _) | (_, "RequestTimeout" | "InternalError") => {
                    StoreError::Transient { location, message }
                }
                _ => StoreError::Other { location, message },
            }
        }
        // The credentials chain failed before anything was sent: a missing
        // role or profile is not a network hiccup.
        _ if caused_by_credentials(&error) => StoreError::Credentials {
            location,
            message: DisplayErrorContext(&error).to_string(),
        },
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            StoreError::Transient {
                location,
                message: DisplayErrorContext(&error).to_string(),
            }
        }
        _ => StoreError::Other {
            location,
            message: DisplayErrorContext(&error).to_string(),
        },
    }
}

fn caused_by_credentials(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(current) = next {
        if current.is::<aws_credential_types::provider::error::CredentialsError>() {
            return true;
        }
        next = current.source();
    }
    false
}

fn outcome<T>(result: &Result<T, StoreError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(StoreError::NotFound { .. }) => "not_found",
        Err(StoreError::PermissionDenied { .. }) => "denied",
        Err(StoreError::Credentials { .. }) => "credentials",
        Err(StoreError::Changed { .. } | StoreError::Truncated { .. }) => "changed",
        Err(StoreError::Transient { .. }) => "transient",
        Err(StoreError::Throttled { .. }) => "throttled",
        Err(_) => "error",
    }
}

impl S3Store {
    /// Awaits one S3 request, turning its error into a [`StoreError`] and
    /// recording its outcome and duration.
    async fn request<T, E>(
        &self,
        operation: &'static str,
        key: &str,
        sent: impl std::future::Future<Output = Result<T, SdkError<E, HttpResponse>>>,
    ) -> Result<T, StoreError>
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let started = Instant::now();
        let result = sent.await.map_err(|e| classify(self.location(key), e));
        metrics::s3_request(operation, outcome(&result), started.elapsed());
        result
    }
}

#[async_trait]
impl ObjectStore for S3Store {
    async fn list_page(&self, prefix: &str, token: Option<&str>) -> Result<ListPage, StoreError> {
        let result = self
            .request(
                "list",
                prefix,
                self.client
                    .list_objects_v2()
                    .bucket(&self.bucket)
                    .prefix(prefix)
                    .set_continuation_token(token.map(str::to_string))
                    .send(),
            )
            .await;
        let page = result?;
        let objects = page
            .contents()
            .iter()
            .filter_map(|object| {
                Some(ObjectMeta {
                    key: object.key()?.to_string(),
                    size: object.size().unwrap_or(0).max(0) as u64,
                    etag: object.e_tag().map(str::to_string),
                })
            })
            .collect();
        let next = page
            .next_continuation_token()
            .filter(|_| page.is_truncated() == Some(true))
            .map(str::to_string);
        Ok(ListPage { objects, next })
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        let result = self
            .request(
                "head",
                key,
                self.client
                    .head_object()
                    .bucket(&self.bucket)
                    .key(key)
                    .send(),
            )
            .await;
        let head = result?;
        Ok(ObjectMeta {
            key: key.to_string(),
            size: head.content_length().unwrap_or(0).max(0) as u64,
            etag: head.e_tag().map(str::to_string),
        })
    }

    async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<PartStream, StoreError> {
        if range.is_empty() {
            return Ok(futures::stream::empty().boxed());
        }
        let result = self
            .request(
                "get",
                key,
                self.client
                    .get_object()
                    .bucket(&self.bucket)
                    .key(key)
                    .range(format!("bytes={}-{}", range.start, range.end - 1))
                    .set_if_match(if_match.map(str::to_string))
                    .send(),
            )
            .await;
        let body = result?.body;
        let location = self.location(key);
        let stream = futures::stream::unfold(
            (body, range.start, location),
            |(mut body, offset, location)| async move {
                match body.next().await? {
                    Ok(bytes) => {
                        metrics::s3_bytes(bytes.len() as u64);
                        let len = bytes.len() as u64;
                        Some((Ok((offset, bytes)), (body, offset + len, location)))
                    }
                    Err(error) => {
                        let error = StoreError::Transient {
                            location: location.clone(),
                            message: format!(
                                "body broke at byte {offset}: {}",
                                DisplayErrorContext(&error)
                            ),
                        };
                        // End the stream after the error.
                        Some((Err(error), (ByteStream::from_static(b""), offset, location)))
                    }
                }
            },
        );
        Ok(stream.boxed())
    }

    /// One PUT. Objects over [`MULTIPART_THRESHOLD`] go up in parts through
    /// the part operations below, which the retrying store drives so that
    /// each part has its own time bound and retries, and a failed or
    /// abandoned upload is aborted.
    async fn put(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
        self.request(
            "put",
            key,
            self.client
                .put_object()
                .bucket(&self.bucket)
                .key(key)
                .body(ByteStream::from(data))
                .send(),
        )
        .await
        .map(|_| ())
    }

    fn multipart(&self) -> Option<MultipartShape> {
        Some(MultipartShape {
            threshold: MULTIPART_THRESHOLD,
            part_size: MULTIPART_PART_SIZE,
            in_flight: MULTIPART_PARTS_IN_FLIGHT,
        })
    }

    async fn create_upload(&self, key: &str) -> Result<String, StoreError> {
        let result = self
            .request(
                "put",
                key,
                self.client
                    .create_multipart_upload()
                    .bucket(&self.bucket)
                    .key(key)
                    .send(),
            )
            .await;
        result?
            .upload_id()
            .map(str::to_string)
            .ok_or_else(|| StoreError::Other {
                location: self.location(key),
                message: "CreateMultipartUpload returned no upload id".into(),
            })
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: i32,
        data: Bytes,
    ) -> Result<Option<String>, StoreError> {
        let result = self
            .request(
                "put",
                key,
                self.client
                    .upload_part()
                    .bucket(&self.bucket)
                    .key(key)
                    .upload_id(upload_id)
                    .part_number(number)
                    .body(ByteStream::from(data))
                    .send(),
            )
            .await;
        Ok(result?.e_tag().map(str::to_string))
    }

    async fn complete_upload(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<(i32, Option<String>)>,
    ) -> Result<(), StoreError> {
        use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
        let parts = parts
            .into_iter()
            .map(|(number, etag)| {
                CompletedPart::builder()
                    .part_number(number)
                    .set_e_tag(etag)
                    .build()
            })
            .collect();
        let completed = CompletedMultipartUpload::builder()
            .set_parts(Some(parts))
            .build();
        self.request(
            "put",
            key,
            self.client
                .complete_multipart_upload()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(upload_id)
                .multipart_upload(completed)
                .send(),
        )
        .await
        .map(|_| ())
    }

    async fn abort_upload(&self, key: &str, upload_id: &str) -> Result<(), StoreError> {
        self.request(
            "put",
            key,
            self.client
                .abort_multipart_upload()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(upload_id)
                .send(),
        )
        .await
        .map(|_| ())
    }

    fn location(&self, key: &str) -> String {
        format!("s3://{}/{}", self.bucket, key)
    }
}
