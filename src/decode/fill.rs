//! Filling the decoded-source tier off the critical path.
//!
//! The epochs before a stream's `from_epoch` are defined from the original
//! image (today's region decode, the same bytes as with no tier), so they
//! cost no more than the tier off. While they stream, each sample the tier
//! does not hold yet is offered here with a copy of its compressed bytes;
//! threads at the kernel's idle priority (`SCHED_IDLE`) derive and store
//! its source. Such a thread runs only on a core nothing else wants: where
//! the trainer's steps leave the decode threads waiting (a GPU-bound job),
//! the tier fills in that slack; where the decode is the wall, the offers
//! wait, the bounded queue overflows and the rest is derived on demand in
//! the first stored epoch. A dropped offer loses nothing: it is only a
//! record not made ahead (counted).
//!
//! Memory: the queue holds at most [`FILL_QUEUE_BYTES`] of compressed
//! images; the derivations share a scratch budget of [`FILL_SCRATCH_BYTES`]
//! of their own (not the streams' decode scratch: an idle-priority thread
//! holding it would make foreground decodes wait on a thread that only
//! runs once they are idle). An image too large for it is not filled
//! ahead.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::tier::{FillJob, FillQueue};
use super::{DecodeError, Decoder, ScratchBudget};
use crate::metrics;

/// Compressed bytes the queue may hold, over every stream of the server.
pub const FILL_QUEUE_BYTES: u64 = 32 << 20;
/// Full-size decode scratch the fill threads share.
pub const FILL_SCRATCH_BYTES: u64 = 64 << 20;
/// How long an idle fill thread sleeps before it looks again (it is woken
/// by each offer; the timeout only bounds the wait).
const IDLE_WAIT: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Queue {
    jobs: VecDeque<FillJob>,
    bytes: u64,
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    offered: Condvar,
    decoder: Arc<dyn Decoder>,
    scratch: ScratchBudget,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The server's background fill: a bounded queue and its idle-priority
/// threads. Dropping the last handle stops the threads.
pub struct TierFiller {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for TierFiller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let queue = self.shared.lock();
        f.debug_struct("TierFiller")
            .field("queued", &queue.jobs.len())
            .field("bytes", &queue.bytes)
            .finish()
    }
}

impl TierFiller {
    /// Starts `threads` fill threads deriving with `decoder`.
    pub fn start(decoder: Arc<dyn Decoder>, threads: usize) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            offered: Condvar::new(),
            decoder,
            scratch: ScratchBudget::new(FILL_SCRATCH_BYTES),
        });
        for index in 0..threads.max(1) {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("shardfeed-fill-{index}"))
                .spawn(move || {
                    lower_to_idle_priority(index);
                    run(&shared);
                })?;
        }
        Ok(Self { shared })
    }

    /// Offers queued, not yet taken by a fill thread.
    pub fn queued(&self) -> usize {
        self.shared.lock().jobs.len()
    }
}

impl FillQueue for TierFiller {
    fn has_room(&self, bytes: u64) -> bool {
        let queue = self.shared.lock();
        !queue.closed && queue.bytes + bytes <= FILL_QUEUE_BYTES
    }

    fn offer(&self, job: FillJob) {
        let bytes = job.bytes();
        let mut queue = self.shared.lock();
        if queue.closed || queue.bytes + bytes > FILL_QUEUE_BYTES {
            drop(queue);
            metrics::decoded_tier("fill_dropped");
            return;
        }
        queue.bytes += bytes;
        queue.jobs.push_back(job);
        drop(queue);
        self.shared.offered.notify_one();
    }
}

impl Drop for TierFiller {
    fn drop(&mut self) {
        let mut queue = self.shared.lock();
        queue.closed = true;
        queue.jobs.clear();
        queue.bytes = 0;
        drop(queue);
        self.shared.offered.notify_all();
    }
}

fn run(shared: &Shared) {
    loop {
        let job = {
            let mut queue = shared.lock();
            loop {
                if queue.closed {
                    return;
                }
                if let Some(job) = queue.jobs.pop_front() {
                    queue.bytes -= job.bytes();
                    break job;
                }
                queue = shared
                    .offered
                    .wait_timeout(queue, IDLE_WAIT)
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .0;
            }
        };
        match job.run(&*shared.decoder, &shared.scratch) {
            Ok(_) => {}
            Err(DecodeError::OverBudget { .. }) => metrics::decoded_tier("fill_skipped"),
            Err(error) => {
                // The foreground decoded this image; a failure here (a full
                // disk is counted by the store) only leaves it to be
                // derived in its first stored epoch.
                tracing::debug!(%error, "decoded-source tier: background fill failed");
                metrics::decoded_tier("fill_failed");
            }
        }
    }
}

/// `SCHED_IDLE`: the thread runs only when no other thread wants the core.
/// Where the kernel refuses it (not Linux, a seccomp profile), the lowest
/// nice value is the fallback; either way the fill still runs.
fn lower_to_idle_priority(index: usize) {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: plain syscall on the calling thread (pid 0) with a valid
        // parameter block.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0 {
            return;
        }
        let refused = std::io::Error::last_os_error();
        // SAFETY: as above; PRIO_PROCESS with who = 0 is the calling thread
        // on Linux.
        let niced = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) } == 0;
        if index == 0 {
            tracing::warn!(
                error = %refused,
                niced,
                "decoded-source tier: the kernel refused SCHED_IDLE for the background fill; \
                 it runs at the lowest nice value and may take CPU from decoding"
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = index;
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::decode::source::{SourceForm, SourceKind, StoredSource};
    use crate::decode::tier::{SampleVersion, SourceKey, SourceStore, TierRequest};
    use crate::decode::{ImageCrateDecoder, ImageFormat, OutputSpec, SampleKey};

    #[derive(Debug, Default)]
    struct Memory(Mutex<HashMap<String, StoredSource>>);

    impl SourceStore for Memory {
        fn get(&self, key: &SourceKey) -> Option<StoredSource> {
            self.0.lock().unwrap().get(&name(key)).cloned()
        }
        fn put(&self, key: &SourceKey, source: &StoredSource) {
            self.0.lock().unwrap().insert(name(key), source.clone());
        }
    }

    fn name(key: &SourceKey) -> String {
        format!("{}\n{}", key.record(), key.form())
    }

    fn jpeg(seed: u8) -> Vec<u8> {
        let pixels: Vec<u8> = (0..48 * 40 * 3)
            .map(|i| (i as u8).wrapping_mul(seed))
            .collect();
        let mut out = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90)
            .encode(&pixels, 48, 40, image::ExtendedColorType::Rgb8)
            .unwrap();
        out
    }

    #[test]
    fn offers_are_stored_in_the_background_and_a_full_queue_drops_them() {
        let store = Arc::new(Memory::default());
        let filler = Arc::new(TierFiller::start(Arc::new(ImageCrateDecoder), 1).unwrap());
        let tier = TierRequest {
            form: SourceForm {
                shorter_side: 32,
                kind: SourceKind::Raw,
            },
            cache: Some(store.clone()),
            from_epoch: 1,
            filler: Some(filler.clone()),
        };
        let spec = OutputSpec::center(16, 16);
        let keys: Vec<String> = (0..4).map(|i| format!("k{i}")).collect();
        for (i, key) in keys.iter().enumerate() {
            let sample = SampleVersion {
                location: "s3://b/shard.tar",
                version: "etag",
                size: 1,
                key,
            };
            let augment = SampleKey {
                seed: 0,
                epoch: 0,
                sample: i as u64,
            };
            tier.offer(
                ImageFormat::Jpeg,
                &jpeg(i as u8 + 1),
                &spec,
                &augment,
                &sample,
            );
        }
        // A center crop keeps its output too: a source and an output each.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while store.0.lock().unwrap().len() < 8 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(store.0.lock().unwrap().len(), 8);
        assert!(filler.has_room(FILL_QUEUE_BYTES));
        assert!(!filler.has_room(FILL_QUEUE_BYTES + 1), "the queue's bound");
        assert_eq!(filler.queued(), 0);
    }
}
