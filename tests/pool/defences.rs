//! The worker's defences: units refused with the field named, calls refused
//! on their headers before a body is buffered, its connection and stream
//! limits, TLS both ways, and stalled handshakes that take no place.

use super::*;

/// A unit call with the token and build given.
fn call(
    unit: shardfeed::pool::wire::pb::DecodeUnit,
    token: &str,
    build: &str,
) -> tonic::Request<shardfeed::pool::wire::pb::DecodeUnit> {
    let mut request = tonic::Request::new(unit);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
        .metadata_mut()
        .insert(shardfeed::pool::wire::BUILD_HEADER, build.parse().unwrap());
    request
}

/// The status a worker refuses `request` with (it must refuse it).
async fn refusal(
    client: &mut shardfeed::pool::wire::pb::decode_pool_client::DecodePoolClient<
        tonic::transport::Channel,
    >,
    request: tonic::Request<shardfeed::pool::wire::pb::DecodeUnit>,
) -> tonic::Status {
    client.decode(request).await.unwrap_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_units_are_refused_with_the_field_named() {
    use shardfeed::pool::wire::{self, pb as wire_pb};
    let worker = Worker::start([127, 0, 0, 1], TOKEN, None).await;
    let mut client =
        wire_pb::decode_pool_client::DecodePoolClient::connect(format!("http://{}", worker.addr))
            .await
            .unwrap();
    let build = wire::build_identity(decode::default_decoder_name());
    let sample = one_sample();
    let good = wire::unit_to_wire(9, OutputSpec::center(32, 32), std::slice::from_ref(&sample));

    let answer = client
        .decode(call(good.clone(), TOKEN, &build))
        .await
        .unwrap();
    assert_eq!(answer.get_ref().pixels.len(), 32 * 32 * 3);

    let status = refusal(&mut client, call(good.clone(), "wrong", &build)).await;
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let status = refusal(
        &mut client,
        call(good.clone(), TOKEN, "shardfeed 0.0.1 / x"),
    )
    .await;
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(status.message().contains("0.0.1"), "{}", status.message());

    let too_many = wire::unit_to_wire(9, OutputSpec::center(32, 32), &vec![sample.clone(); 65]);
    let status = refusal(&mut client, call(too_many, TOKEN, &build)).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().starts_with("samples:"),
        "{}",
        status.message()
    );

    let huge = wire::unit_to_wire(
        9,
        OutputSpec::center(4096, 4096),
        std::slice::from_ref(&sample),
    );
    let status = refusal(&mut client, call(huge, TOKEN, &build)).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("max-unit-output-bytes"),
        "{}",
        status.message()
    );

    // A unit of views counts every view: five 1024² views (15 MiB) fit
    // the worker's 16 MiB, a sixth of 600² takes them past it.
    let views = |extra: Option<OutputSpec>| {
        let mut groups = vec![shardfeed::decode::ViewGroup::repeated(
            5,
            OutputSpec::center(1024, 1024),
        )];
        groups.extend(extra.map(|spec| shardfeed::decode::ViewGroup::repeated(1, spec)));
        wire::UnitOutput::Views(Arc::new(shardfeed::decode::Views { groups }))
    };
    let fitting = wire::unit_to_wire(11, views(None), std::slice::from_ref(&sample));
    let answer = client
        .clone()
        .max_decoding_message_size(32 << 20)
        .decode(call(fitting, TOKEN, &build))
        .await
        .unwrap();
    assert_eq!(answer.get_ref().pixels.len(), 5 * 1024 * 1024 * 3);
    let over = wire::unit_to_wire(
        12,
        views(Some(OutputSpec::center(600, 600))),
        std::slice::from_ref(&sample),
    );
    let status = refusal(&mut client, call(over, TOKEN, &build)).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().starts_with("samples:")
            && status.message().contains("max-unit-output-bytes")
            && status
                .message()
                .contains(&(5 * 1024 * 1024 * 3 + 600 * 600 * 3).to_string()),
        "{}",
        status.message()
    );

    let mut no_spec = good.clone();
    no_spec.spec = None;
    let status = refusal(&mut client, call(no_spec, TOKEN, &build)).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().starts_with("spec:"),
        "{}",
        status.message()
    );

    // A corrupt image is answered as a failure, not an error.
    let mut corrupt = sample;
    corrupt.data = bytes::Bytes::from_static(b"\xff\xd8 not a jpeg");
    let answer = client
        .decode(call(
            wire::unit_to_wire(10, OutputSpec::center(32, 32), &[corrupt]),
            TOKEN,
            &build,
        ))
        .await
        .unwrap()
        .into_inner();
    let answers = wire::answers_from_wire(&answer, 1, &OutputSpec::center(32, 32).into()).unwrap();
    assert!(matches!(answers[0], wire::SampleAnswer::Failed { .. }));
}

/// A raw HTTP/2 call to a worker's Decode: its headers (with `token` and
/// the worker's build), then a gRPC message header declaring `declared`
/// bytes and the first `sent` of them, the body left open. The response
/// resolves only when the worker answers.
async fn open_unit_call(
    h2: &mut h2::client::SendRequest<bytes::Bytes>,
    addr: SocketAddr,
    token: &str,
    declared: u32,
    sent: usize,
) -> (h2::client::ResponseFuture, h2::SendStream<bytes::Bytes>) {
    use shardfeed::pool::wire;
    let request = tonic::codegen::http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/shardfeed.pool.v1.DecodePool/Decode"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .header(
            wire::BUILD_HEADER,
            wire::build_identity(decode::default_decoder_name()),
        )
        .body(())
        .unwrap();
    let mut ready = h2.clone().ready().await.unwrap();
    let (response, mut body) = ready.send_request(request, false).unwrap();
    let mut data = vec![0u8; 5 + sent];
    data[1..5].copy_from_slice(&declared.to_be_bytes());
    // A worker that has answered already may have closed the stream.
    let _ = body.send_data(data.into(), false);
    *h2 = ready;
    (response, body)
}

/// The gRPC status a worker answered with on the headers alone
/// (trailers-only), within `wait` of asking.
async fn status_within(response: h2::client::ResponseFuture, wait: Duration) -> String {
    let response = tokio::time::timeout(wait, response)
        .await
        .expect("answered while its body was still open")
        .unwrap();
    response
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_refused_on_their_headers_before_any_body_is_buffered() {
    use shardfeed::pool::wire::{self, pb as wire_pb};
    let worker = Worker::start([127, 0, 0, 1], TOKEN, None).await;
    let connect = || async {
        let tcp = tokio::net::TcpStream::connect(worker.addr).await.unwrap();
        let (h2, connection) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(connection);
        // The worker's SETTINGS arrive before the first call (a call sent
        // ahead of them was seen to give its admission place back at
        // once, which would put the count of refusals below off by one).
        tokio::time::sleep(Duration::from_millis(200)).await;
        h2
    };
    // Without the token: every call refused at once, its 30 MiB never read
    // (before, the worker buffered each body whole, then refused it).
    let mut h2 = connect().await;
    let mut calls = Vec::new();
    for _ in 0..50 {
        calls.push(open_unit_call(&mut h2, worker.addr, "wrong", 30 << 20, 64 << 10).await);
    }
    for (response, _body) in calls {
        let status = status_within(response, Duration::from_secs(5)).await;
        assert_eq!(status, (tonic::Code::Unauthenticated as i32).to_string());
    }
    // With it: 2 x max_units (16) calls are admitted while their bodies
    // are still coming; the 8 past them are refused as busy on their
    // headers (before, all 24 waited for their bodies).
    let mut h2 = connect().await;
    let mut calls = Vec::new();
    for _ in 0..24 {
        calls.push(open_unit_call(&mut h2, worker.addr, TOKEN, 1 << 20, 1024).await);
    }
    let (responses, mut held): (Vec<_>, Vec<_>) = calls.into_iter().unzip();
    let answered = futures::future::join_all(
        responses
            .into_iter()
            .map(|response| tokio::time::timeout(Duration::from_secs(3), response)),
    )
    .await;
    let busy = (tonic::Code::ResourceExhausted as i32).to_string();
    let refused = answered
        .iter()
        .filter_map(|answer| answer.as_ref().ok())
        .map(|response| {
            let response = response.as_ref().unwrap();
            response
                .headers()
                .get("grpc-status")
                .unwrap()
                .to_str()
                .unwrap()
        })
        .inspect(|status| assert_eq!(status, &busy))
        .count();
    assert_eq!(
        refused, 8,
        "16 admitted with their bodies open, the rest refused"
    );
    // The held calls go away: their places come back, and an honest unit is
    // decoded.
    for body in &mut held {
        body.send_reset(h2::Reason::CANCEL);
    }
    let mut client =
        wire_pb::decode_pool_client::DecodePoolClient::connect(format!("http://{}", worker.addr))
            .await
            .unwrap();
    let build = wire::build_identity(decode::default_decoder_name());
    let unit = wire::unit_to_wire(3, OutputSpec::center(32, 32), &[one_sample()]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let answer = loop {
        match client.decode(call(unit.clone(), TOKEN, &build)).await {
            Ok(answer) => break answer.into_inner(),
            // The resets may still be on their way.
            Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                assert!(
                    Instant::now() < deadline,
                    "admission places never came back"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => panic!("{status:?}"),
        }
    };
    assert_eq!(answer.pixels.len(), 32 * 32 * 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_holds_no_more_streams_than_the_worker_admits() {
    let worker = Worker::start([127, 0, 0, 1], TOKEN, None).await;
    // max_units 8: 16 admitted units and 8 more for health checks, named in
    // the worker's SETTINGS (before, none), which h2 enforces by refusing
    // streams past it.
    let h2 = raw_h2(worker.addr).await;
    assert_eq!(h2.current_max_send_streams(), 24);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_holds_its_connection_limit_and_closes_idle_connections() {
    let limits = shardfeed::net::connections::ConnectionLimits {
        max_connections: 2,
        idle: Duration::from_secs(1),
    };
    let worker = Worker::start_with([127, 0, 0, 1], TOKEN, None, limits).await;
    // Two connections: one with a call whose request never finishes, then
    // one with no call.
    let mut waiting = raw_h2(worker.addr).await;
    let (response, _body) = open_unit_call(&mut waiting, worker.addr, TOKEN, 1 << 20, 1024).await;
    let idle = raw_h2(worker.addr).await;
    // The listener is full and neither is in service: a third takes the
    // place of the one longest without progress, the waiting call's.
    let _third = raw_h2(worker.addr).await;
    let ended = tokio::time::timeout(Duration::from_secs(2), response)
        .await
        .expect("the waiting call ended with its connection");
    assert!(ended.is_err(), "{ended:?}");
    assert!(idle.clone().ready().await.is_ok(), "the idle one is open");
    // Past the idle bound the connection without a call is gone.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        idle.clone().ready().await.is_err(),
        "the idle connection was closed"
    );
    // Its place is free: an honest client is served.
    let mut client = shardfeed::pool::wire::pb::decode_pool_client::DecodePoolClient::connect(
        format!("http://{}", worker.addr),
    )
    .await
    .unwrap();
    let build = shardfeed::pool::wire::build_identity(decode::default_decoder_name());
    let unit = shardfeed::pool::wire::unit_to_wire(3, OutputSpec::center(32, 32), &[one_sample()]);
    let answer = client.decode(call(unit, TOKEN, &build)).await.unwrap();
    assert_eq!(answer.get_ref().pixels.len(), 32 * 32 * 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_traffic_is_tls_and_both_ends_must_hold_the_pools_certificates() {
    let certs = pool_certs("shardfeed-pool");
    let worker = Worker::start_tls(
        [127, 0, 0, 1],
        TOKEN,
        None,
        shardfeed::pool::CONNECTION_LIMITS,
        Some(certs.good.clone()),
    )
    .await;
    let sample = one_sample();
    let spec = OutputSpec::center(32, 32);
    let decode_with = |tls: Option<shardfeed::net::tls::PoolTls>| {
        let (worker_addr, sample) = (worker.addr, sample.clone());
        async move {
            let mut config = pool_config(&[], 1.0);
            config.targets = vec![worker_addr.to_string()];
            config.tls = tls;
            let client = PoolClient::start(config, decode::default_decoder_name());
            client.wait_for_workers(1, Duration::from_secs(10)).await;
            let answer = client.decode(spec, std::slice::from_ref(&sample)).await;
            (answer, client.counts())
        }
    };
    // The pool's sidecar: answered over TLS, pixels as a local decode's.
    let (answer, counts) = decode_with(Some(certs.good.clone())).await;
    let answer = answer.expect("answered over TLS");
    let mut local = vec![0u8; spec.bytes()];
    decode::decode_bounded(
        &*decode::default_decoder(),
        &decode::ScratchBudget::new(256 << 20),
        sample.format,
        &sample.data,
        &spec,
        &sample.key,
        &mut local,
    )
    .unwrap();
    assert_eq!(&answer.pixels[..], &local[..]);
    assert_eq!(counts.answered, 1);
    // Plain text to a TLS worker, a certificate of another CA, or a worker
    // named otherwise: no answer, decoded here, the worker never reached.
    let decoded_before = worker.samples();
    let (answer, _) = decode_with(None).await;
    assert!(answer.is_none(), "plain text is not answered");
    let (answer, _) = decode_with(Some(certs.other.clone())).await;
    assert!(answer.is_none(), "a stranger's certificate is refused");
    let mut misnamed = certs.good.clone();
    misnamed.server_name = "someone-else".into();
    let (answer, _) = decode_with(Some(misnamed)).await;
    assert!(answer.is_none(), "a worker must carry the pool's name");
    assert_eq!(worker.samples(), decoded_before);
    // The kubelet's probes speak no TLS: health alone, in plain text, on a
    // port of its own; the units' service is not there.
    let health = worker.health.expect("a TLS worker has its health listener");
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{health}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let status = tonic_health::pb::health_client::HealthClient::new(channel.clone())
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let unit = shardfeed::pool::wire::unit_to_wire(1, spec, std::slice::from_ref(&sample));
    let build = shardfeed::pool::wire::build_identity(decode::default_decoder_name());
    let refused = shardfeed::pool::wire::pb::decode_pool_client::DecodePoolClient::new(channel)
        .decode(call(unit, TOKEN, &build))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unimplemented);
}

/// Hardening D8: sockets that never send a ClientHello. A TLS worker shakes
/// hands before a connection takes one of its places, at most 32 at a time
/// from one address: a stranger's 200 stalled sockets leave 168 closed at
/// once and the rest holding handshake places only, and an honest sidecar
/// is served meanwhile through a worker of 8 connection places (which the
/// 32 stalled handshakes filled when tonic shook hands inside them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_handshakes_take_no_connection_places() {
    use shardfeed::net::handshake::HandshakeLimits;
    use tokio::io::AsyncReadExt;
    let certs = pool_certs("shardfeed-pool");
    let places = shardfeed::net::connections::ConnectionLimits {
        max_connections: 8,
        idle: Duration::from_secs(60),
    };
    let worker = Worker::start_tls(
        [127, 0, 0, 1],
        TOKEN,
        None,
        places,
        Some(certs.good.clone()),
    )
    .await;
    let mut strangers = Vec::new();
    for _ in 0..200 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        strangers.push(socket.connect(worker.addr).await.unwrap());
    }
    let reads = strangers.iter_mut().map(|stranger| async move {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(500), stranger.read(&mut byte));
        matches!(read.await, Ok(Ok(0)) | Ok(Err(_)))
    });
    let closed = futures::future::join_all(reads)
        .await
        .into_iter()
        .filter(|&closed| closed)
        .count();
    assert_eq!(closed, 200 - HandshakeLimits::DEFAULT.per_peer);
    // The stalled ones still open, an honest sidecar gets its unit.
    let mut config = pool_config(&[], 1.0);
    config.targets = vec![worker.addr.to_string()];
    config.tls = Some(certs.good.clone());
    let client = PoolClient::start(config, decode::default_decoder_name());
    client.wait_for_workers(1, Duration::from_secs(10)).await;
    let spec = OutputSpec::center(32, 32);
    let answer = client.decode(spec, &[one_sample()]).await;
    assert!(answer.is_some(), "an honest sidecar was kept out");
    drop(strangers);
}
