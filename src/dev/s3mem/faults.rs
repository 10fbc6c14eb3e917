//! Failures the in-memory S3 injects, scripted per request the way a real
//! S3 produces them: throttling, a slow first byte, bodies cut short,
//! stalled or paced, operations that answer with an error.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use s3s::{s3_error, S3Result};

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
    pub(super) script: Mutex<HashMap<Operation, std::collections::VecDeque<Injected>>>,
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
    pub(super) gets_seen: AtomicU64,
    /// Every request until this instant answers 503 (a regional outage).
    pub(super) outage_until: Mutex<Option<std::time::Instant>>,
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
    pub(super) requests_seen: AtomicU64,
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
    pub(super) async fn pass(&self) {
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
    pub(super) fn scripted(&self, operation: Operation) -> S3Result<()> {
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

    pub(super) fn take(counter: &AtomicU64) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

fn set(knob: &Mutex<Duration>, delay: Duration) {
    *knob
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = delay;
}

/// Waits as long as `knob` says (not holding its lock meanwhile).
pub(super) async fn pause(knob: &Mutex<Duration>) {
    let delay = *knob
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

/// How long a stalled response waits: far longer than any client timeout.
pub(super) const STALL: Duration = Duration::from_secs(120);

/// How a GET body ends.
#[derive(Debug, Clone, Copy)]
pub(super) enum BodyEnd {
    Whole,
    /// The connection breaks after this many bytes.
    CutAfter(usize),
    /// Nothing more is sent after this many bytes, the connection kept open.
    StallAfter(usize),
}

/// The body in 64 KiB frames, ending as `end` says. The bytes before a cut
/// or stall reach the client, as when a connection breaks mid-body: the
/// failure waits until they are written out.
pub(super) fn body_stream(
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
