//! What the attacks are made of: the real binary started under attack
//! (its peak RSS read from /proc), an honest client's dataset, raw HTTP/2
//! frames and calls, and the JSON line each attack prints.

use super::common;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

pub(crate) const TOKEN: &str = "hostile-suite-token";
pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A shardfeed process, killed when dropped.
pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) what: &'static str,
}

impl Server {
    pub(crate) fn spawn(what: &'static str, args: &[String], dir: tempfile::TempDir) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_shardfeed"))
            .args(args)
            .env("SHARDFEED_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the shardfeed binary starts");
        Self {
            child,
            _dir: dir,
            what,
        }
    }

    /// A pool worker on loopback, plain text (the token is the check under
    /// attack; TLS is tested in tests/pool/defences.rs).
    pub(crate) fn worker(addr: SocketAddr) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, TOKEN).unwrap();
        let args = [
            "pool-worker",
            "--listen",
            &addr.to_string(),
            "--metrics-listen",
            "127.0.0.1:0",
            "--token-file",
            token.to_str().unwrap(),
            "--decode-threads",
            "1",
            "--max-units",
            "8",
        ];
        Self::spawn("pool worker", &strings(&args), dir)
    }

    pub(crate) fn sidecar(listen: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let args = [
            "serve",
            "--listen",
            listen,
            "--metrics-listen",
            "127.0.0.1:0",
            "--decode-threads",
            "1",
        ];
        Self::spawn("sidecar", &strings(&args), dir)
    }

    pub(crate) fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{field} in /proc/{}/status", self.child.id()))
    }

    pub(crate) fn peak_rss_mb(&self) -> f64 {
        self.status_kib("VmHWM:") as f64 / 1024.0
    }

    pub(crate) fn rss_mb(&self) -> f64 {
        self.status_kib("VmRSS:") as f64 / 1024.0
    }

    pub(crate) fn assert_alive(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "the {} exited under attack",
            self.what
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// A loopback port nothing listens on now.
pub(crate) fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// The honest work a listener serves after an attack.
pub(crate) enum Honest {
    /// A stream of this dataset (the sidecar).
    Stream(String),
    /// A unit with the token (the worker).
    Unit,
}

/// A small indexed dataset on local disk, for the sidecar's honest stream.
pub(crate) fn honest_dataset() -> (tempfile::TempDir, Honest) {
    let (dir, uri) = common::indexed_local_dataset(&common::simple_dataset(2, 8));
    (dir, Honest::Stream(uri))
}

/// Where a listener is, to connect raw sockets to it.
#[derive(Clone)]
pub(crate) enum Target {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

impl Target {
    pub(crate) async fn connect(&self) -> std::io::Result<Box<dyn Io>> {
        Ok(match self {
            Target::Tcp(addr) => Box::new(tokio::net::TcpStream::connect(addr).await?),
            Target::Unix(path) => Box::new(tokio::net::UnixStream::connect(path).await?),
        })
    }

    /// A fresh gRPC channel, as an honest client makes one.
    pub(crate) async fn channel(&self) -> Result<tonic::transport::Channel, String> {
        let target = self.clone();
        let connector = tower::service_fn(move |_: tonic::codegen::http::Uri| {
            let target = target.clone();
            async move { target.connect().await.map(hyper_util::rt::TokioIo::new) }
        });
        tonic::transport::Endpoint::from_static("http://localhost")
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10))
            .connect_with_connector(connector)
            .await
            .map_err(|e| e.to_string())
    }

    /// gRPC health's status over a fresh connection.
    pub(crate) async fn health(&self) -> Result<i32, String> {
        let mut client = tonic_health::pb::health_client::HealthClient::new(self.channel().await?);
        client
            .check(tonic_health::pb::HealthCheckRequest::default())
            .await
            .map(|response| response.into_inner().status)
            .map_err(|status| status.to_string())
    }

    /// What an honest client gets after the attack: the sidecar streams a
    /// batch of `dataset`, the worker decodes a unit sent with the token.
    pub(crate) async fn serves_honest_work(&self, work: &Honest) {
        let channel = self.channel().await.expect("an honest client connects");
        match work {
            Honest::Stream(dataset) => {
                let mut client =
                    shardfeed::server::pb::shardfeed_client::ShardfeedClient::new(channel);
                let mut stream = client
                    .stream_batches(common::unshuffled(dataset))
                    .await
                    .expect("the stream opens")
                    .into_inner();
                let batch = stream
                    .message()
                    .await
                    .expect("a batch, not an error")
                    .expect("a batch, not the end");
                assert_eq!(batch.keys.len(), 8);
            }
            Honest::Unit => {
                use shardfeed::pool::wire::{self, pb as wire_pb};
                let sample = wire::UnitSample {
                    key: shardfeed::decode::SampleKey {
                        seed: 1,
                        epoch: 0,
                        sample: 7,
                        copy: 0,
                    },
                    format: shardfeed::shard::ImageFormat::Jpeg,
                    data: common::jpeg(64, 48, 1).into(),
                };
                let spec = shardfeed::decode::OutputSpec::center(32, 32);
                let mut request = tonic::Request::new(wire::unit_to_wire(1, spec, &[sample]));
                let build = wire::build_identity(shardfeed::decode::default_decoder_name());
                let metadata = request.metadata_mut();
                metadata.insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
                metadata.insert(wire::BUILD_HEADER, build.parse().unwrap());
                let answer = wire_pb::decode_pool_client::DecodePoolClient::new(channel)
                    .decode(request)
                    .await
                    .expect("the unit is decoded");
                assert_eq!(answer.get_ref().pixels.len(), 32 * 32 * 3);
            }
        }
    }

    /// Waits until the server answers health SERVING.
    pub(crate) async fn wait_serving(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.health().await == Ok(1) {
                return;
            }
            assert!(Instant::now() < deadline, "the server never served");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One HTTP/2 frame.
pub(crate) fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A gRPC call's header block to `path`: HPACK literals without indexing.
pub(crate) fn call_headers(path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    let mut literal = |name: &str, value: &str| {
        block.push(0x00);
        for string in [name, value] {
            loona_hpack::encoder::encode_integer_into(string.len(), 7, 0x00, &mut block).unwrap();
            block.extend_from_slice(string.as_bytes());
        }
    };
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "localhost"),
        (":path", path),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    .iter()
    .chain(extra)
    {
        literal(name, value);
    }
    block
}

/// Reads frames until `deadline`, returning (RST_STREAMs, GOAWAYs, PING
/// ACKs, whether the server closed the connection).
pub(crate) async fn read_frames(
    io: &mut Box<dyn Io>,
    wait: Duration,
) -> (usize, usize, usize, bool) {
    let (mut resets, mut goaways, mut pongs) = (0, 0, 0);
    let mut buffer = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let read = match tokio::time::timeout_at(deadline, io.read(&mut chunk)).await {
            Err(_) => return (resets, goaways, pongs, false),
            Ok(Ok(0)) | Ok(Err(_)) => return (resets, goaways, pongs, true),
            Ok(Ok(n)) => n,
        };
        buffer.extend_from_slice(&chunk[..read]);
        while buffer.len() >= 9 {
            let length = u32::from_be_bytes([0, buffer[0], buffer[1], buffer[2]]) as usize;
            if buffer.len() < 9 + length {
                break;
            }
            match (buffer[3], buffer[4]) {
                (0x3, _) => resets += 1,
                (0x7, _) => goaways += 1,
                (0x6, flags) if flags & 0x1 != 0 => pongs += 1,
                _ => {}
            }
            buffer.drain(..9 + length);
        }
    }
}

/// A raw HTTP/2 client connection to `addr`, past the server's SETTINGS
/// (streams sent ahead of its stream limit would be refused, REFUSED_STREAM,
/// not by the check under test).
pub(crate) async fn raw_h2(addr: SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (h2, connection) = h2::client::Builder::new()
        .initial_window_size(1 << 20)
        .handshake::<_, Bytes>(tcp)
        .await
        .unwrap();
    tokio::spawn(connection);
    let h2 = h2.ready().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    h2
}

/// Opens a gRPC call to `path` on `h2`, its request headers sent with
/// `extra` and its body left open.
pub(crate) async fn open_call(
    h2: &h2::client::SendRequest<Bytes>,
    addr: SocketAddr,
    path: &str,
    extra: &[(&str, &str)],
) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
    let mut request = tonic::codegen::http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    let mut ready = h2.clone().ready().await.unwrap();
    ready
        .send_request(request.body(()).unwrap(), false)
        .unwrap()
}

/// A gRPC message's 5-byte prefix declaring `declared` bytes, then up to
/// `send` bytes of it as the server's flow control lets them go; the
/// stream is left open. Returns the bytes sent.
pub(crate) async fn send_unfinished(
    body: &mut h2::SendStream<Bytes>,
    declared: u32,
    send: usize,
) -> usize {
    let mut header = vec![0u8; 5];
    header[1..5].copy_from_slice(&declared.to_be_bytes());
    let _ = body.send_data(header.into(), false);
    let mut sent = 0usize;
    while sent < send {
        body.reserve_capacity(1 << 20);
        let capacity = tokio::time::timeout(
            Duration::from_millis(500),
            std::future::poll_fn(|cx| body.poll_capacity(cx)),
        )
        .await;
        match capacity {
            Ok(Some(Ok(n))) if n > 0 => {
                let n = n.min(send - sent);
                if body.send_data(Bytes::from(vec![0u8; n]), false).is_err() {
                    break;
                }
                sent += n;
            }
            _ => break,
        }
    }
    sent
}

/// Figures of one attack, printed as a JSON line.
pub(crate) fn report(
    attack: &str,
    server: &Server,
    baseline_mb: f64,
    started: Instant,
    outcome: &str,
) {
    println!(
        "{{\"hostile\":\"{attack}\",\"listener\":\"{}\",\"baseline_rss_mb\":{baseline_mb:.1},\
         \"peak_rss_mb\":{:.1},\"rss_after_mb\":{:.1},\"seconds\":{:.2},\"outcome\":\"{outcome}\"}}",
        server.what,
        server.peak_rss_mb(),
        server.rss_mb(),
        started.elapsed().as_secs_f64()
    );
    std::io::stdout().flush().unwrap();
}
