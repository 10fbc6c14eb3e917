//! The retrying store, through aws-sdk-s3 against the loopback S3 server
//! with faults scripted per request: every operation kind retries transient
//! failures and gives up at once on permanent ones.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures::StreamExt;
use shardfeed::dev::s3mem::{self, Injected, Operation, RunningS3};
use shardfeed::store::read::{get_all, read_range};
use shardfeed::store::retry::{RetryPolicy, RetryingStore};
use shardfeed::store::s3::S3Store;
use shardfeed::store::{ObjectStore, StoreError};

const OBJECT: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";

async fn setup() -> (RunningS3, RetryingStore) {
    let s3 = s3mem::start(0).await.unwrap();
    s3.state.create_bucket("retries");
    s3.state
        .insert("retries", "data/object", Bytes::from_static(OBJECT));
    let client = shardfeed::store::s3::client(&s3.s3_config()).await;
    let store = RetryingStore::new(Arc::new(S3Store::new(client, "retries")), fast_retries());
    (s3, store)
}

fn requests(s3: &RunningS3, operation: Operation) -> u64 {
    let counts = &s3.state.counts;
    match operation {
        Operation::Get => counts.get.load(Ordering::SeqCst),
        Operation::Head => counts.head.load(Ordering::SeqCst),
        Operation::List => counts.list.load(Ordering::SeqCst),
        Operation::Put => counts.put.load(Ordering::SeqCst),
    }
}

/// Runs `operation` once through the retrying store.
async fn exercise(store: &RetryingStore, operation: Operation) -> Result<(), StoreError> {
    match operation {
        Operation::Get => {
            let bytes = read_range(store, "data/object", 3..20, None).await?;
            assert_eq!(&bytes[..], &OBJECT[3..20]);
        }
        Operation::Head => assert_eq!(store.head("data/object").await?.size, 36),
        Operation::List => assert_eq!(store.list("data/").await?.len(), 1),
        Operation::Put => store.put("data/new", Bytes::from_static(b"new")).await?,
    }
    Ok(())
}

const OPERATIONS: [Operation; 4] = [
    Operation::Get,
    Operation::Head,
    Operation::List,
    Operation::Put,
];

#[tokio::test]
async fn transient_failures_of_every_operation_are_retried() {
    for operation in OPERATIONS {
        for fault in [Injected::SlowDown, Injected::InternalError] {
            let (s3, store) = setup().await;
            s3.state.faults.fail_next(operation, 2, fault);
            exercise(&store, operation)
                .await
                .unwrap_or_else(|e| panic!("{operation:?} after two {fault:?}: {e}"));
            assert_eq!(
                requests(&s3, operation),
                3,
                "{operation:?}: two failures and the success"
            );
        }
    }
}

#[tokio::test]
async fn permanent_failures_are_not_retried() {
    for operation in OPERATIONS {
        let (s3, store) = setup().await;
        s3.state
            .faults
            .fail_next(operation, 1, Injected::AccessDenied);
        let error = exercise(&store, operation).await.unwrap_err();
        assert!(
            matches!(error, StoreError::PermissionDenied { .. }),
            "{operation:?}: {error:?}"
        );
        assert_eq!(requests(&s3, operation), 1, "{operation:?}: one request");
    }
    for operation in [Operation::Get, Operation::Head] {
        let (s3, store) = setup().await;
        s3.state.faults.fail_next(operation, 1, Injected::NoSuchKey);
        let error = exercise(&store, operation).await.unwrap_err();
        assert!(
            matches!(error, StoreError::NotFound { .. }),
            "{operation:?}: {error:?}"
        );
        assert_eq!(requests(&s3, operation), 1, "{operation:?}: one request");
    }
}

#[tokio::test]
async fn exhausted_retries_say_how_often_they_tried() {
    let (s3, store) = setup().await;
    let attempts = fast_retries().max_attempts;
    s3.state
        .faults
        .fail_next(Operation::Head, attempts as usize, Injected::SlowDown);
    let error = store.head("data/object").await.unwrap_err();
    assert!(
        matches!(&error, StoreError::Exhausted { attempts: a, .. } if *a == attempts),
        "{error:?}"
    );
    assert_eq!(requests(&s3, Operation::Head), u64::from(attempts));
}

#[tokio::test]
async fn a_broken_body_resumes_from_the_byte_where_it_broke() {
    let (s3, store) = setup().await;
    // Large enough that the server sends whole frames before each cut.
    let object: Vec<u8> = (0..400_000u32).map(|i| (i * 7 % 251) as u8).collect();
    s3.state
        .insert("retries", "data/large", Bytes::from(object.clone()));
    let faults = &s3.state.faults;
    faults.cut_after.store(150_000, Ordering::SeqCst);
    faults.cut_bodies.store(2, Ordering::SeqCst);
    let len = object.len() as u64;
    let mut body = store.get_range("data/large", 0..len, None).await.unwrap();
    let mut bytes = Vec::new();
    while let Some(piece) = body.next().await {
        let (offset, piece) = piece.unwrap();
        assert_eq!(offset as usize, bytes.len(), "pieces are contiguous");
        bytes.extend_from_slice(&piece);
    }
    assert!(bytes == object, "the bytes delivered are the object's");
    assert_eq!(requests(&s3, Operation::Get), 3);
    // The server counts each response's whole range: had a retry started
    // over from byte 0, it would count 3 x the object.
    let served = s3.state.counts.get_bytes.load(Ordering::SeqCst);
    assert!(
        served < 3 * len - 100_000,
        "each retry asked only for what had not arrived: {served} bytes served for {len}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_headers_and_stalled_bodies_are_cut_off_and_resumed() {
    let s3 = s3mem::start(0).await.unwrap();
    s3.state.create_bucket("retries");
    let object: Vec<u8> = (0..400_000u32).map(|i| (i * 13 % 251) as u8).collect();
    s3.state
        .insert("retries", "data/large", Bytes::from(object.clone()));
    let client = shardfeed::store::s3::client(&s3.s3_config()).await;
    let store = RetryingStore::new(
        Arc::new(S3Store::new(client, "retries")),
        RetryPolicy {
            idle_timeout: Duration::from_millis(500),
            ..fast_retries()
        },
    );
    let faults = &s3.state.faults;
    // The first GET never answers; the second stops sending mid-body with
    // the connection open. Both would hang for two minutes.
    faults.stall_headers.store(1, Ordering::SeqCst);
    faults.cut_after.store(150_000, Ordering::SeqCst);
    faults.stall_bodies.store(1, Ordering::SeqCst);
    let started = std::time::Instant::now();
    let bytes = get_all(&store, "data/large", u64::MAX).await.unwrap();
    assert!(bytes == object, "the bytes delivered are the object's");
    assert_eq!(requests(&s3, Operation::Get), 3);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "each stall cost one idle timeout: {:?}",
        started.elapsed()
    );
    // The server counts each response's whole range: the stalled body's
    // 400,000, then only the 250,000 that had not arrived.
    let served = s3.state.counts.get_bytes.load(Ordering::SeqCst);
    assert_eq!(
        served,
        2 * object.len() as u64 - 150_000,
        "the retry after the stalled body asked only for the rest"
    );
}

#[tokio::test]
async fn index_files_are_read_through_retries() {
    let (s3, store) = setup().await;
    s3.state
        .faults
        .fail_next(Operation::Head, 1, Injected::SlowDown);
    s3.state
        .faults
        .fail_next(Operation::Get, 1, Injected::SlowDown);
    assert_eq!(
        &get_all(&store, "data/object", u64::MAX).await.unwrap()[..],
        OBJECT
    );
}

#[tokio::test]
async fn retries_ride_out_an_outage_shorter_than_the_budget_and_stop_at_it() {
    let (s3, _) = setup().await;
    let client = shardfeed::store::s3::client(&s3.s3_config()).await;
    let policy = shardfeed::store::retry::RetryPolicy {
        max_attempts: 10_000,
        budget: std::time::Duration::from_millis(600),
        base_delay: std::time::Duration::from_millis(2),
        max_delay: std::time::Duration::from_millis(20),
        idle_timeout: std::time::Duration::from_secs(10),
    };
    let store = RetryingStore::new(Arc::new(S3Store::new(client, "retries")), policy);

    // Twelve throttled answers in a row fit well inside the budget.
    s3.state
        .faults
        .fail_next(Operation::Head, 12, Injected::SlowDown);
    assert_eq!(store.head("data/object").await.unwrap().size, 36);
    assert_eq!(requests(&s3, Operation::Head), 13);

    // An outage longer than the budget ends after about the budget, with
    // many attempts but far from the attempt limit.
    s3.state
        .faults
        .fail_next(Operation::Head, 100_000, Injected::InternalError);
    let started = std::time::Instant::now();
    let error = store.head("data/object").await.unwrap_err();
    let elapsed = started.elapsed();
    assert!(matches!(error, StoreError::Exhausted { .. }), "{error:?}");
    assert!(
        elapsed >= std::time::Duration::from_millis(500)
            && elapsed < std::time::Duration::from_secs(5),
        "gave up after {elapsed:?}"
    );
    assert!(requests(&s3, Operation::Head) > 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_lowers_the_requests_in_flight_and_recovery_raises_them() {
    use shardfeed::store::throttle::RequestLimiter;
    let (s3, _) = setup().await;
    let client = shardfeed::store::s3::client(&s3.s3_config()).await;
    let limiter = RequestLimiter::new(32.0);
    let store = Arc::new(
        RetryingStore::new(Arc::new(S3Store::new(client, "retries")), fast_retries())
            .with_limiter(limiter.clone()),
    );

    // A storm of SlowDown answers to 16 concurrent requests, spread over
    // several retry rounds: the limit halves per round, not per answer.
    s3.state
        .faults
        .fail_next(Operation::Head, 30, Injected::SlowDown);
    let heads: Vec<_> = (0..16)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.head("data/object").await })
        })
        .collect();
    for head in heads {
        // With 4 attempts some requests give up; what matters is the limit.
        let _ = head.await.unwrap();
    }
    let throttled = limiter.limit();
    assert!(
        (2..32).contains(&throttled),
        "limit {throttled} after the storm"
    );

    // When the throttling stops, successes raise the limit again.
    for _ in 0..300 {
        store.head("data/object").await.unwrap();
    }
    assert!(
        limiter.limit() > throttled + 5,
        "limit {} after 300 successes (was {throttled})",
        limiter.limit()
    );
}

/// A credentials chain that finds nothing, as on a host with no role.
#[derive(Debug)]
struct NoCredentials;

impl aws_sdk_s3::config::ProvideCredentials for NoCredentials {
    fn provide_credentials<'a>(
        &'a self,
    ) -> aws_credential_types::provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        aws_credential_types::provider::future::ProvideCredentials::ready(Err(
            aws_credential_types::provider::error::CredentialsError::not_loaded(
                "no credentials in the chain (test)",
            ),
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_credentials_are_not_retried_and_say_so() {
    let s3 = s3mem::start(0).await.unwrap();
    let config = aws_sdk_s3::config::Builder::new()
        .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
        .region(aws_sdk_s3::config::Region::new("us-east-1"))
        .endpoint_url(s3.endpoint())
        .force_path_style(true)
        .credentials_provider(NoCredentials)
        .retry_config(aws_sdk_s3::config::retry::RetryConfig::disabled())
        .build();
    let client = aws_sdk_s3::Client::from_conf(config);
    let store = RetryingStore::new(
        Arc::new(S3Store::new(client, "data")),
        RetryPolicy {
            max_attempts: 10,
            ..fast_retries()
        },
    );
    let started = std::time::Instant::now();
    let error = store.head("k").await.unwrap_err();
    println!("{error:?}");
    assert!(matches!(error, StoreError::Credentials { .. }), "{error:?}");
    assert!(error.to_string().contains("credentials"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(2), "not retried");
    assert_eq!(
        shardfeed::server::status_code(&error),
        tonic::Code::Unauthenticated
    );
}

/// A real minute of S3 outage through the whole stack. The budget's own
/// arithmetic is tested on a paused clock (`store::retry`'s unit tests);
/// this one takes a minute of wall time, so it runs on request:
/// `cargo test --test store_retries -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a minute of wall time; the retry budget is unit-tested on a paused clock"]
async fn a_stream_rides_out_a_minute_long_outage_with_identical_batches() {
    let retry = RetryPolicy {
        max_attempts: 1_000,
        budget: Duration::from_secs(120),
        base_delay: Duration::from_millis(50),
        max_delay: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(10),
    };
    let harness = Harness::start(Options {
        retry,
        ..Options::default()
    })
    .await;
    let uri = upload(&harness.s3, "data", "", &simple_dataset(24, 16)).await;
    write_index(&harness.s3, "data", "").await;
    let mut client = harness.client().await;
    let clean = collect(&mut client, unshuffled(&uri)).await.unwrap();

    // S3 goes away for a minute just after the stream's first batch (read
    // in order, three shards ahead: most GETs are still to come).
    let mut stream = client
        .stream_batches(unshuffled(&uri))
        .await
        .unwrap()
        .into_inner();
    let mut batches = vec![stream.message().await.unwrap().unwrap()];
    let outage = Duration::from_secs(60);
    harness.s3.state.faults.outage(outage);
    let started = std::time::Instant::now();
    while let Some(batch) = stream.message().await.unwrap() {
        batches.push(batch);
    }
    let took = started.elapsed();
    println!("stream finished {took:?} after a {outage:?} outage began");
    assert_eq!(
        digest(&batches),
        digest(&clean),
        "byte-identical to a fault-free run"
    );
    assert!(took >= outage, "the outage was felt: {took:?}");
    assert!(took < outage + Duration::from_secs(15), "bounded: {took:?}");
    harness.shutdown().await;
}

/// A 70 MB object (over the multipart threshold: five 16 MiB parts) put
/// from a task of its own; returns once its first part waits at the
/// server's closed part gate (so the caller holds the upload's id). Open
/// the gate to let the parts through.
async fn held_multipart_put(
    s3: &RunningS3,
    store: Arc<RetryingStore>,
) -> tokio::task::JoinHandle<Result<(), StoreError>> {
    s3.state.faults.part_gate.close();
    let data = Bytes::from(vec![7u8; 70 << 20]);
    let put = tokio::spawn(async move { store.put("data/big", data).await });
    assert!(
        s3.state
            .faults
            .part_gate
            .wait_held(1, Duration::from_secs(10))
            .await,
        "no part reached the server"
    );
    put
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multipart_upload_that_fails_midway_is_aborted() {
    let (s3, store) = setup().await;
    let store = Arc::new(store);
    let put = held_multipart_put(&s3, store.clone()).await;
    // The link is refused from here on: the parts still to go fail for good.
    s3.state
        .faults
        .fail_next(Operation::Put, 16, Injected::AccessDenied);
    s3.state.faults.part_gate.open();
    let error = put.await.unwrap().unwrap_err();
    assert!(
        matches!(error, StoreError::PermissionDenied { .. }),
        "{error}"
    );
    assert_eq!(s3.state.open_uploads(), 0, "the failed upload was aborted");
    assert!(s3.state.object("retries", "data/big").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multipart_upload_whose_caller_gives_up_is_aborted() {
    let (s3, store) = setup().await;
    let put = held_multipart_put(&s3, Arc::new(store)).await;
    put.abort(); // a timeout or a cancelled pack drops the future
    s3.state.faults.part_gate.open();
    // The abort runs on a task of its own, after the caller has gone.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s3.state.open_uploads() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the abandoned upload was left open"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_part_of_a_slow_upload_has_its_own_time_bound() {
    // Thirteen 16 MiB parts that take 500 ms each to answer, four in
    // flight, with an idle timeout of 1.2 s: the whole upload outlasts it
    // (at least 13/4 x 500 ms), no part does.
    let s3 = s3mem::start(0).await.unwrap();
    s3.state.create_bucket("retries");
    let client = shardfeed::store::s3::client(&s3.s3_config()).await;
    let idle_timeout = Duration::from_millis(1200);
    let policy = RetryPolicy {
        idle_timeout,
        ..fast_retries()
    };
    let store = RetryingStore::new(Arc::new(S3Store::new(client, "retries")), policy);
    s3.state.faults.set_part_delay(Duration::from_millis(500));
    let started = std::time::Instant::now();
    store
        .put("data/big", Bytes::from(vec![3u8; 200 << 20]))
        .await
        .unwrap();
    assert!(started.elapsed() > idle_timeout, "{:?}", started.elapsed());
    assert_eq!(
        s3.state.object("retries", "data/big").unwrap().len(),
        200 << 20
    );
    assert_eq!(s3.state.open_uploads(), 0);
}
