//! Bounds on a call's request body, for listeners whose every call sends
//! one request message (all of ours: unary and server-streaming RPCs).
//!
//! A connection's idle bound never applies while a call is open, and HTTP/2
//! lets a client open a call and never finish its request: HEADERS with no
//! body, or all but the last byte of a large message. Each such call held
//! its stream place and its buffered bytes for as long as the client liked
//! (the trainer's socket refused while 1,024 of them stayed; 257 MiB a
//! connection at 64 streams of 4 MiB). [`BoundRequestsLayer`] gives every
//! call's request `deadline` to arrive whole, at most `max_body_bytes`, and
//! draws its bytes from one budget shared by the listener's calls, so the
//! request bytes a listener buffers are bounded by the budget whatever the
//! number of connections and streams. A call past any bound ends with a
//! status saying which (`DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`), and
//! its place and bytes are free again. A message whose gRPC length prefix
//! declares more than the bound is refused on its prefix (`OUT_OF_RANGE`,
//! counted like any cut), before tonic reads the claim: the server's
//! decode cap is [`RequestBounds::max_message_bytes`], so the size a
//! listener publishes is the size it takes, and every refusal is counted.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;

/// One listener's bounds on request bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestBounds {
    /// A request must be whole (its END_STREAM received) this soon after
    /// its headers.
    pub deadline: Duration,
    /// The most one request's body may hold.
    pub max_body_bytes: usize,
    /// The most all the listener's unfinished requests hold together.
    pub in_flight_bytes: usize,
}

/// gRPC's length prefix: a compression flag and the message's length.
const PREFIX_BYTES: usize = 5;

impl RequestBounds {
    /// The largest message a request may carry: the body bound less gRPC's
    /// prefix. A server's decode cap (tonic's `max_decoding_message_size`)
    /// is this figure, so the bound published is the bound enforced.
    pub const fn max_message_bytes(&self) -> usize {
        self.max_body_bytes.saturating_sub(PREFIX_BYTES)
    }
}

/// The shared state of one listener's bounds: its byte budget.
#[derive(Debug, Clone)]
pub struct BoundRequestsLayer {
    bounds: RequestBounds,
    budget: Arc<Semaphore>,
}

impl BoundRequestsLayer {
    pub fn new(bounds: RequestBounds) -> Self {
        let permits = bounds.in_flight_bytes.min(Semaphore::MAX_PERMITS);
        Self {
            bounds,
            budget: Arc::new(Semaphore::new(permits)),
        }
    }
}

impl<S> tower::Layer<S> for BoundRequestsLayer {
    type Service = BoundRequests<S>;

    fn layer(&self, inner: S) -> BoundRequests<S> {
        BoundRequests {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct BoundRequests<S> {
    inner: S,
    layer: BoundRequestsLayer,
}

type HttpRequest = tonic::codegen::http::Request<tonic::body::Body>;

impl<S> tower::Service<HttpRequest> for BoundRequests<S>
where
    S: tower::Service<HttpRequest>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: HttpRequest) -> S::Future {
        let layer = self.layer.clone();
        self.inner.call(request.map(|body| {
            tonic::body::Body::new(BoundedBody {
                inner: body,
                received: 0,
                held: None,
                deadline: Box::pin(tokio::time::sleep(layer.bounds.deadline)),
                whole: false,
                prefix: [0; PREFIX_BYTES],
                prefix_seen: 0,
                layer,
            })
        }))
    }
}

/// A request body within its listener's bounds; its bytes stay counted
/// against the budget until the body is dropped (once its message is
/// decoded).
struct BoundedBody {
    inner: tonic::body::Body,
    layer: BoundRequestsLayer,
    received: usize,
    held: Option<OwnedSemaphorePermit>,
    deadline: Pin<Box<Sleep>>,
    whole: bool,
    /// The first message's length prefix, as far as it has arrived.
    prefix: [u8; PREFIX_BYTES],
    prefix_seen: usize,
}

impl BoundedBody {
    /// Reads the first message's prefix from `data` and refuses a declared
    /// length past the bound the moment it is known.
    fn check_prefix(&mut self, data: &[u8]) -> Result<(), tonic::Status> {
        if self.prefix_seen == PREFIX_BYTES {
            return Ok(());
        }
        let take = (PREFIX_BYTES - self.prefix_seen).min(data.len());
        self.prefix[self.prefix_seen..self.prefix_seen + take].copy_from_slice(&data[..take]);
        self.prefix_seen += take;
        if self.prefix_seen < PREFIX_BYTES {
            return Ok(());
        }
        let declared = u32::from_be_bytes([
            self.prefix[1],
            self.prefix[2],
            self.prefix[3],
            self.prefix[4],
        ]);
        let most = self.layer.bounds.max_message_bytes();
        if usize::try_from(declared).map_or(true, |declared| declared > most) {
            metrics::counter!(crate::metrics::REQUESTS_CUT, "reason" => "size").increment(1);
            return Err(tonic::Status::out_of_range(format!(
                "the request declares a {declared}-byte message; this listener takes at most {most}"
            )));
        }
        Ok(())
    }

    fn count(&mut self, bytes: usize) -> Result<(), tonic::Status> {
        let bounds = &self.layer.bounds;
        self.received = self.received.saturating_add(bytes);
        if self.received > bounds.max_body_bytes {
            metrics::counter!(crate::metrics::REQUESTS_CUT, "reason" => "size").increment(1);
            return Err(tonic::Status::resource_exhausted(format!(
                "the request is over {} bytes, the most this listener takes",
                bounds.max_body_bytes
            )));
        }
        let permits = u32::try_from(bytes).unwrap_or(u32::MAX);
        let taken = self
            .layer
            .budget
            .clone()
            .try_acquire_many_owned(permits)
            .map_err(|_| {
                metrics::counter!(crate::metrics::REQUESTS_CUT, "reason" => "budget").increment(1);
                tonic::Status::resource_exhausted(format!(
                    "the listener holds its bound of {} bytes of unfinished requests; retry",
                    bounds.in_flight_bytes
                ))
            })?;
        match &mut self.held {
            Some(held) => held.merge(taken),
            None => self.held = Some(taken),
        }
        Ok(())
    }
}

impl Body for BoundedBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let checked = this
                        .check_prefix(data)
                        .and_then(|()| this.count(data.len()));
                    if let Err(status) = checked {
                        return Poll::Ready(Some(Err(status)));
                    }
                }
                this.whole = this.inner.is_end_stream();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                this.whole = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(status))) => Poll::Ready(Some(Err(status))),
            Poll::Pending if this.whole => Poll::Pending,
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    metrics::counter!(crate::metrics::REQUESTS_CUT, "reason" => "deadline")
                        .increment(1);
                    Poll::Ready(Some(Err(tonic::Status::deadline_exceeded(format!(
                        "the request did not arrive whole within {:?}",
                        this.layer.bounds.deadline
                    )))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, Service, ServiceExt};

    /// Reads the request body, as tonic does before it calls a handler,
    /// and answers with what ended it; `hold` keeps the body after its
    /// first frame and never answers (a call whose request is unfinished).
    #[derive(Clone)]
    struct ReadsBody {
        hold: bool,
    }

    impl Service<HttpRequest> for ReadsBody {
        type Response = Result<usize, tonic::Code>;
        type Error = std::convert::Infallible;
        type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: HttpRequest) -> Self::Future {
            let hold = self.hold;
            Box::pin(async move {
                let mut body = request.into_body();
                let mut bytes = 0;
                while let Some(frame) =
                    std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
                {
                    match frame {
                        Ok(frame) => bytes += frame.data_ref().map_or(0, Bytes::len),
                        Err(status) => return Ok(Err(status.code())),
                    }
                    if hold {
                        std::future::pending::<()>().await;
                    }
                }
                Ok(Ok(bytes))
            })
        }
    }

    fn bounds() -> RequestBounds {
        RequestBounds {
            deadline: Duration::from_secs(10),
            max_body_bytes: 100,
            in_flight_bytes: 150,
        }
    }

    /// A body the test feeds by hand, left open until the sender drops.
    fn open_body() -> (
        futures::channel::mpsc::UnboundedSender<Bytes>,
        tonic::body::Body,
    ) {
        let (sender, receiver) = futures::channel::mpsc::unbounded::<Bytes>();
        let stream = futures::StreamExt::map(receiver, |b| Ok::<_, tonic::Status>(Frame::data(b)));
        (
            sender,
            tonic::body::Body::new(http_body_util_stream(stream)),
        )
    }

    fn http_body_util_stream<S>(stream: S) -> StreamBody<S> {
        StreamBody(stream)
    }

    struct StreamBody<S>(S);

    impl<S> Body for StreamBody<S>
    where
        S: futures::Stream<Item = Result<Frame<Bytes>, tonic::Status>> + Unpin,
    {
        type Data = Bytes;
        type Error = tonic::Status;

        fn poll_frame(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
            futures::Stream::poll_next(Pin::new(&mut self.get_mut().0), cx)
        }
    }

    fn request(body: tonic::body::Body) -> HttpRequest {
        tonic::codegen::http::Request::new(body)
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_never_ends_is_cut_at_the_deadline() {
        let layer = BoundRequestsLayer::new(bounds());
        let (_sender, body) = open_body();
        let started = tokio::time::Instant::now();
        let answer = layer
            .layer(ReadsBody { hold: false })
            .oneshot(request(body))
            .await
            .unwrap();
        assert_eq!(answer, Err(tonic::Code::DeadlineExceeded));
        assert_eq!(started.elapsed(), bounds().deadline);
    }

    /// A whole request of `bytes` through `layer`: how reading it ended.
    async fn whole(layer: &BoundRequestsLayer, bytes: usize) -> Result<usize, tonic::Code> {
        let (sender, body) = open_body();
        sender
            .unbounded_send(Bytes::from(vec![0u8; bytes]))
            .unwrap();
        drop(sender);
        let read = ReadsBody { hold: false };
        layer
            .clone()
            .layer(read)
            .oneshot(request(body))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_whole_request_passes_and_frees_its_bytes() {
        let layer = BoundRequestsLayer::new(bounds());
        for _ in 0..5 {
            assert_eq!(whole(&layer, 90).await, Ok(90));
        }
        assert_eq!(layer.budget.available_permits(), 150);
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_declared_past_the_bound_is_refused_on_its_prefix() {
        let layer = BoundRequestsLayer::new(bounds());
        let most = bounds().max_message_bytes() as u32;
        for (declared, answer) in [
            (most, Err(tonic::Code::DeadlineExceeded)),
            (most + 1, Err(tonic::Code::OutOfRange)),
            (u32::MAX, Err(tonic::Code::OutOfRange)),
        ] {
            // The prefix in two frames, the message never sent: only the
            // claim can refuse it before the deadline.
            let (sender, body) = open_body();
            let prefix = [&[0u8][..], &declared.to_be_bytes()].concat();
            sender
                .unbounded_send(Bytes::copy_from_slice(&prefix[..2]))
                .unwrap();
            sender
                .unbounded_send(Bytes::copy_from_slice(&prefix[2..]))
                .unwrap();
            let read = layer
                .clone()
                .layer(ReadsBody { hold: false })
                .oneshot(request(body));
            let read = tokio::time::timeout(Duration::from_secs(15), read).await;
            let got = read.map_or(Err(tonic::Code::DeadlineExceeded), Result::unwrap);
            assert_eq!(got, answer, "declared {declared}");
        }
    }

    #[tokio::test]
    async fn a_request_over_its_cap_or_the_budget_is_refused() {
        let layer = BoundRequestsLayer::new(bounds());
        assert_eq!(
            whole(&layer, 101).await,
            Err(tonic::Code::ResourceExhausted)
        );
        // One unfinished request holds 90 of the 150: the next's 90 do not fit.
        let (held_sender, held) = open_body();
        held_sender
            .unbounded_send(Bytes::from(vec![0u8; 90]))
            .unwrap();
        let mut held_body = layer
            .clone()
            .layer(ReadsBody { hold: true })
            .call(request(held));
        let _ = futures::poll!(&mut held_body);
        assert_eq!(whole(&layer, 90).await, Err(tonic::Code::ResourceExhausted));
        drop(held_body);
        assert_eq!(
            layer.budget.available_permits(),
            150,
            "its bytes are free again"
        );
    }
}
