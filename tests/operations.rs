//! Operational behaviour: draining on shutdown, health, limits, access control.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use shardfeed::server::pb::shardfeed_client::ShardfeedClient;
use shardfeed::server::{self, pb};
use tonic::transport::Channel;
use tonic_types::StatusExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_mid_stream_drains_cleanly() {
    let mut harness = Harness::start(Options::default()).await;
    let uri = upload(&harness.s3, "data", "", &simple_dataset(4, 16)).await;
    let mut client = harness.client().await;
    assert!(server::check_health(&harness.addr).await.unwrap());

    // A stream that finishes before shutdown ends whole.
    let whole = collect(&mut client, request(&uri)).await.unwrap();
    assert_eq!(whole.len(), 8);

    // A stream whose first batch is still being fetched when shutdown starts.
    let gate = &harness.s3.state.faults.get_gate;
    gate.close();
    let mut open = client
        .stream_batches(pb::StreamBatchesRequest {
            epoch: 1,
            ..request(&uri)
        })
        .await
        .unwrap()
        .into_inner();
    assert!(gate.wait_held(1, Duration::from_secs(10)).await);
    let started = Instant::now();
    harness.begin_shutdown();
    wait_not_serving(&harness.addr).await;

    // Draining: probes see NOT_SERVING, new streams are refused clearly.
    assert!(
        !server::check_health(&harness.addr).await.unwrap(),
        "health must report NOT_SERVING while draining"
    );
    let mut late = harness.client().await;
    let refused = collect(&mut late, request(&uri)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert!(
        refused.message().contains("draining"),
        "{}",
        refused.message()
    );
    harness.s3.state.faults.get_gate.open();

    // The open stream gets its batch in flight, then a status saying where to resume.
    let first = open
        .message()
        .await
        .unwrap()
        .expect("the in-flight batch is delivered");
    assert_eq!(first.index, 0);
    let ended = open.message().await.unwrap_err();
    assert_eq!(ended.code(), tonic::Code::Unavailable);
    assert!(
        ended.message().contains("start_batch=1"),
        "{}",
        ended.message()
    );
    // The same, for any client, in the status details (gRPC's rich error model).
    let info = ended
        .get_details_error_info()
        .expect("ErrorInfo in the details");
    assert_eq!(
        (info.reason.as_str(), info.domain.as_str()),
        ("SERVER_DRAINING", "shardfeed")
    );
    assert_eq!(info.metadata["start_batch"], "1");
    assert_eq!(info.metadata["epoch"], "1");
    assert_eq!(
        info.metadata["position"], "1:1",
        "one batch done at world size 1"
    );
    assert_eq!(
        info.metadata["dataset"],
        first.position.as_ref().unwrap().dataset
    );
    let retry = ended
        .get_details_retry_info()
        .expect("RetryInfo in the details");
    assert!(retry.retry_delay.is_some_and(|d| d > Duration::ZERO));
    let refused_info = refused
        .get_details_error_info()
        .expect("ErrorInfo on refusal");
    assert_eq!(refused_info.reason, "SERVER_DRAINING");

    harness.server.stop().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "drained well within the grace period"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grace_expiry_ends_open_streams_with_a_status() {
    let mut harness = Harness::start(Options {
        grace: Duration::from_millis(300),
        ..Options::default()
    })
    .await;
    let uri = upload(&harness.s3, "data", "", &simple_dataset(2, 8)).await;
    let mut client = harness.client().await;
    // Opened (and held by the registry) before the gate closes: opening the
    // stream reads nothing more.
    open_dataset(&mut client, &uri).await;
    // The stream's fetches never answer: it has no batch in flight to finish.
    let gate = &harness.s3.state.faults.get_gate;
    gate.close();
    let mut open = client
        .stream_batches(request(&uri))
        .await
        .unwrap()
        .into_inner();
    assert!(gate.wait_held(1, Duration::from_secs(10)).await);
    harness.begin_shutdown();
    let ended = open.message().await.unwrap_err();
    assert_eq!(ended.code(), tonic::Code::Unavailable);
    assert!(
        ended.message().contains("start_batch=0"),
        "{}",
        ended.message()
    );
    let info = ended
        .get_details_error_info()
        .expect("ErrorInfo in the details");
    assert_eq!(info.metadata["start_batch"], "0");
    assert_eq!(info.metadata["position"], "", "nothing done yet");
    harness.s3.state.faults.get_gate.open();
    harness.server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_over_the_limit_are_refused() {
    let harness = Harness::start(Options {
        max_streams: 1,
        ..Options::default()
    })
    .await;
    let uri = upload(&harness.s3, "data", "", &simple_dataset(2, 8)).await;
    let mut client = harness.client().await;
    open_dataset(&mut client, &uri).await;
    // The first stream's fetches wait: it holds its slot while the second asks.
    harness.s3.state.faults.get_gate.close();
    let _held = client
        .stream_batches(request(&uri))
        .await
        .unwrap()
        .into_inner();
    let refused = collect(&mut client, request(&uri)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(
        refused.message().contains("--max-streams"),
        "{}",
        refused.message()
    );
    drop(_held);
    harness.s3.state.faults.get_gate.open();
    // The permit is released when the client goes away.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match collect(&mut client, request(&uri)).await {
            Ok(batches) => {
                assert_eq!(batches.len(), 2);
                break;
            }
            Err(status)
                if status.code() == tonic::Code::ResourceExhausted && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => panic!("{status:?}"),
        }
    }
    harness.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_allowed_datasets_are_served() {
    let harness = Harness::start(Options {
        allow: vec!["s3://data/train".into()],
        ..Options::default()
    })
    .await;
    let allowed = upload(&harness.s3, "data", "train/", &simple_dataset(1, 8)).await;
    let denied = upload(
        &harness.s3,
        "data",
        "training-secret/",
        &simple_dataset(1, 8),
    )
    .await;
    let mut client = harness.client().await;
    assert_eq!(
        collect(&mut client, request(&allowed)).await.unwrap().len(),
        1
    );
    let gets = harness.s3.state.counts.get.load(Ordering::SeqCst);
    for uri in [denied.clone(), "s3://other/train/".to_string()] {
        let status = collect(&mut client, request(&uri)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::PermissionDenied, "{uri}");
        assert!(
            status.message().contains("s3://data/train"),
            "names the rule: {}",
            status.message()
        );
        let described = client
            .describe(pb::DescribeRequest {
                dataset: uri,
                world_size: 1,
                batch_size: Some(8),
                partition: 0,
                repeats: 0,
            })
            .await
            .unwrap_err();
        assert_eq!(described.code(), tonic::Code::PermissionDenied);
    }
    assert_eq!(
        harness.s3.state.counts.get.load(Ordering::SeqCst),
        gets,
        "denied requests never reach S3"
    );
    harness.shutdown().await;
}

#[test]
fn allow_rules_end_at_path_boundaries() {
    use shardfeed::server::rule_allows;
    assert!(rule_allows("s3://b/train", "s3://b/train/"));
    assert!(rule_allows("s3://b/train/", "s3://b/train/part1/"));
    assert!(!rule_allows("s3://b/train", "s3://b/training/"));
    assert!(!rule_allows("s3://b/train/", "s3://c/train/"));
    assert!(rule_allows("s3://b", "s3://b/anything/"));
    assert!(rule_allows("s3://", "s3://any/"));

    // Local paths as the folders they resolve to.
    let root = tempfile::tempdir().unwrap();
    let (allowed, secret) = (root.path().join("allowed"), root.path().join("secret"));
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::create_dir_all(&secret).unwrap();
    std::os::unix::fs::symlink(&secret, allowed.join("link")).unwrap();
    let rule = format!("file://{}/", allowed.display());
    let uri = |path: &std::path::Path| format!("file://{}/", path.display());
    assert!(rule_allows(&rule, &uri(&allowed.join("sub"))));
    assert!(
        !rule_allows(&rule, &uri(&allowed.join("link"))),
        "a link out"
    );
    assert!(
        !rule_allows(&rule, &uri(&allowed.join("../secret"))),
        "a climb out"
    );
    assert!(!rule_allows(
        &rule,
        &uri(&allowed.join("gone/../../secret"))
    ));
    assert!(rule_allows(
        &format!("file://{}/", secret.display()),
        &uri(&allowed.join("link"))
    ));
    assert!(!rule_allows("s3://", "file:///etc/"));
}

#[tokio::test]
async fn the_unix_listener_replaces_only_a_stale_socket() {
    use shardfeed::server::{ListenAddr, Listener};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shardfeed.sock");
    let addr = ListenAddr::Unix(path.clone());

    std::fs::write(&path, b"someone's data").unwrap();
    let refused = Listener::bind(&addr)
        .await
        .err()
        .expect("a regular file is refused");
    assert!(refused.to_string().contains("not a socket"), "{refused}");
    assert_eq!(std::fs::read(&path).unwrap(), b"someone's data");
    std::fs::remove_file(&path).unwrap();

    // A socket whose server is gone (the file stays behind) is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let live = Listener::bind(&addr)
        .await
        .expect("a stale socket is replaced");

    // While a server listens on it, a second one is refused.
    let refused = Listener::bind(&addr)
        .await
        .err()
        .expect("a live socket is kept");
    assert!(refused.to_string().contains("another server"), "{refused}");
    drop(live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_startup_completes_health_is_not_serving_and_requests_are_unavailable() {
    use shardfeed::dataset::DatasetRegistry;
    use shardfeed::engine::{Engine, EngineConfig};
    use shardfeed::server::{ListenAddr, Listener, ServiceConfig, ShardfeedService};
    let s3 = shardfeed::dev::s3mem::start(0).await.unwrap();
    let uri = upload(&s3, "data", "", &simple_dataset(2, 8)).await;
    let start = |startup: tokio::sync::oneshot::Receiver<Result<(), String>>| {
        let registry = DatasetRegistry::new(s3.s3_config(), fast_retries(), small_parts());
        let config = EngineConfig {
            decode_threads: 2,
            ..EngineConfig::default()
        };
        let engine = Engine::new(std::sync::Arc::new(registry), config).unwrap();
        let service = ShardfeedService::new(engine, ServiceConfig::default());
        async move {
            let listener = Listener::bind(&ListenAddr::Tcp(([127, 0, 0, 1], 0).into()))
                .await
                .unwrap();
            let addr = listener.local_addr();
            let task = tokio::spawn(server::serve(
                listener,
                service,
                async move { startup.await.unwrap_or_else(|_| Err("dropped".into())) },
                std::future::pending(),
                Duration::from_secs(1),
            ));
            (addr, task)
        }
    };

    let (ready, startup) = tokio::sync::oneshot::channel();
    let (addr, task) = start(startup).await;
    // Listening, answering, and saying it is not ready yet.
    assert!(!server::check_health(&addr).await.unwrap());
    let mut client =
        pb::shardfeed_client::ShardfeedClient::new(server::connect(&addr).await.unwrap())
            .max_decoding_message_size(usize::MAX);
    let refused = collect(&mut client, request(&uri)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert!(
        refused.message().contains("starting"),
        "{}",
        refused.message()
    );

    ready.send(Ok(())).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server::check_health(&addr).await.unwrap() {
        assert!(Instant::now() < deadline, "never became SERVING");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(collect(&mut client, request(&uri)).await.unwrap().len(), 2);
    task.abort();

    // A startup that fails (a cache directory another server holds) ends
    // the server with its reason.
    let (ready, startup) = tokio::sync::oneshot::channel();
    let (_, task) = start(startup).await;
    ready.send(Err("cache directory is locked".into())).unwrap();
    let error = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(
        error.to_string().contains("cache directory is locked"),
        "{error}"
    );
}

/// Opens `uri` on the server (a Describe), so that later streams of it
/// read no index.
async fn open_dataset(client: &mut ShardfeedClient<Channel>, uri: &str) {
    client
        .describe(pb::DescribeRequest {
            dataset: uri.to_string(),
            world_size: 1,
            batch_size: Some(1),
            ..Default::default()
        })
        .await
        .unwrap();
}
