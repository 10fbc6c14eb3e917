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
//! Bounds: the queue holds at most [`FillBounds::memory_bytes`] of
//! compressed images in memory and keeps the rest of a burst (an epoch's
//! first batches are decoded ahead with no core to spare) on disk, up to
//! [`FillBounds::spill_bytes`] in the tier's directory ([`spill`]); at most
//! [`FillBounds::jobs`] jobs wait (each a few hundred bytes of keys). The
//! derivations share a scratch budget of [`FILL_SCRATCH_BYTES`] of their
//! own (not the streams' decode scratch: an idle-priority thread holding it
//! would make foreground decodes wait on a thread that only runs once they
//! are idle). An image too large for it is not filled ahead.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::output::{FillJob, FillQueue};
use crate::decode::{DecodeError, Decoder, ScratchBudget};
use crate::metrics;

mod spill;
use spill::{Spill, Spilled};

/// Full-size decode scratch the fill threads share.
pub const FILL_SCRATCH_BYTES: u64 = 64 << 20;
/// How long an idle fill thread sleeps before it looks again (it is woken
/// by each offer; the timeout only bounds the wait).
const IDLE_WAIT: Duration = Duration::from_secs(1);

/// What the fill queue may hold, over every stream of the server.
#[derive(Debug, Clone, Copy)]
pub struct FillBounds {
    /// Compressed images held in process memory.
    pub memory_bytes: u64,
    /// Compressed images kept on disk past that (0: none).
    pub spill_bytes: u64,
    /// Jobs waiting, wherever their images are.
    pub jobs: usize,
}

impl Default for FillBounds {
    /// 32 MiB in memory; 1 GiB on disk holds the opening burst of ~10,000
    /// photos of 110 KB; 16,384 jobs take ~5 MiB of keys.
    fn default() -> Self {
        Self {
            memory_bytes: 32 << 20,
            spill_bytes: 1 << 30,
            jobs: 16_384,
        }
    }
}

/// Where a queued job's image is.
enum Image {
    Held(Vec<u8>),
    Spilled(Spilled),
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<(FillJob, Image)>,
    /// Bytes of the held images.
    held_bytes: u64,
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    offered: Condvar,
    decoder: Arc<dyn Decoder>,
    scratch: ScratchBudget,
    bounds: FillBounds,
    spill: Option<Spill>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Queues a job; `false` where it is closed or holds its most jobs.
    fn push(&self, job: FillJob, image: Image) -> bool {
        let mut queue = self.lock();
        if queue.closed || queue.jobs.len() >= self.bounds.jobs {
            return false;
        }
        if let Image::Held(bytes) = &image {
            let held = queue.held_bytes + bytes.len() as u64;
            if held > self.bounds.memory_bytes {
                return false;
            }
            queue.held_bytes = held;
        }
        queue.jobs.push_back((job, image));
        drop(queue);
        self.offered.notify_one();
        true
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
            .field("held_bytes", &queue.held_bytes)
            .finish()
    }
}

impl TierFiller {
    /// Starts `threads` fill threads deriving with `decoder`, spilling to
    /// `spill_dir` (emptied first; `None`, or a directory that cannot be
    /// made: the queue keeps to its memory bound).
    pub fn start(
        decoder: Arc<dyn Decoder>,
        threads: usize,
        bounds: FillBounds,
        spill_dir: Option<&Path>,
    ) -> std::io::Result<Self> {
        let filler = Self::new(decoder, bounds, spill_dir);
        filler.spawn(threads.max(1))?;
        Ok(filler)
    }

    /// The queue, with no thread yet to take from it.
    fn new(decoder: Arc<dyn Decoder>, bounds: FillBounds, spill_dir: Option<&Path>) -> Self {
        let spill =
            spill_dir
                .filter(|_| bounds.spill_bytes > 0)
                .and_then(|dir| match Spill::create(dir, bounds.spill_bytes) {
                    Ok(spill) => Some(spill),
                    Err(error) => {
                        tracing::warn!(
                            %error,
                            dir = %dir.display(),
                            "decoded-source tier: the background fill keeps no images on disk; \
                             a burst past its memory bound is derived in its first stored epoch"
                        );
                        None
                    }
                });
        Self {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue::default()),
                offered: Condvar::new(),
                decoder,
                scratch: ScratchBudget::new(FILL_SCRATCH_BYTES),
                bounds,
                spill,
            }),
        }
    }

    fn spawn(&self, threads: usize) -> std::io::Result<()> {
        for index in 0..threads {
            let shared = self.shared.clone();
            std::thread::Builder::new()
                .name(format!("shardfeed-fill-{index}"))
                .spawn(move || {
                    lower_to_idle_priority(index);
                    run(&shared);
                })?;
        }
        Ok(())
    }

    /// Offers queued, not yet taken by a fill thread.
    pub fn queued(&self) -> usize {
        self.shared.lock().jobs.len()
    }

    /// Bytes of images kept on disk.
    #[cfg(test)]
    fn spilled_bytes(&self) -> u64 {
        self.shared.spill.as_ref().map_or(0, Spill::bytes)
    }
}

impl FillQueue for TierFiller {
    fn offer(&self, job: FillJob, data: &[u8]) {
        let shared = &*self.shared;
        let len = data.len() as u64;
        let in_memory = {
            let queue = shared.lock();
            if queue.closed || queue.jobs.len() >= shared.bounds.jobs {
                drop(queue);
                metrics::decoded_tier("fill_dropped");
                return;
            }
            queue.held_bytes + len <= shared.bounds.memory_bytes
        };
        let image = if in_memory {
            Image::Held(data.to_vec())
        } else {
            match shared.spill.as_ref().map(|spill| spill.write(data)) {
                Some(Ok(Some(spilled))) => {
                    metrics::decoded_tier("fill_spilled");
                    Image::Spilled(spilled)
                }
                Some(Err(error)) => {
                    tracing::debug!(%error, "decoded-source tier: could not keep a fill image on disk");
                    metrics::decoded_tier("fill_dropped");
                    return;
                }
                Some(Ok(None)) | None => {
                    metrics::decoded_tier("fill_dropped");
                    return;
                }
            }
        };
        // Another offer may have taken the room since: the bound is
        // rechecked, and a job that lost the race is dropped.
        if !shared.push(job, image) {
            metrics::decoded_tier("fill_dropped");
        }
    }
}

impl Drop for TierFiller {
    fn drop(&mut self) {
        let mut queue = self.shared.lock();
        queue.closed = true;
        queue.jobs.clear();
        queue.held_bytes = 0;
        drop(queue);
        self.shared.offered.notify_all();
    }
}

fn run(shared: &Shared) {
    loop {
        let (job, image) = {
            let mut queue = shared.lock();
            loop {
                if queue.closed {
                    return;
                }
                if let Some((job, image)) = queue.jobs.pop_front() {
                    if let Image::Held(bytes) = &image {
                        queue.held_bytes -= bytes.len() as u64;
                    }
                    break (job, image);
                }
                queue = shared
                    .offered
                    .wait_timeout(queue, IDLE_WAIT)
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .0;
            }
        };
        let data = match image {
            Image::Held(bytes) => bytes,
            Image::Spilled(spilled) => match spilled.read() {
                Ok(bytes) => bytes,
                Err(error) => {
                    tracing::debug!(%error, "decoded-source tier: could not read a fill image back");
                    metrics::decoded_tier("fill_failed");
                    continue;
                }
            },
        };
        match job.run(&*shared.decoder, &shared.scratch, &data) {
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
    use crate::decode::{ImageCrateDecoder, OutputSpec, SampleKey};
    use crate::shard::ImageFormat;
    use crate::tier::output::{SampleVersion, SourceKey, SourceStore, TierRequest};

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
    fn offers_past_memory_wait_on_disk_and_past_both_bounds_are_dropped() {
        let store = Arc::new(Memory::default());
        let images: Vec<Vec<u8>> = (0..5).map(|i| jpeg(i as u8 + 1)).collect();
        let largest = images.iter().map(Vec::len).max().unwrap() as u64;
        let dir = tempfile::tempdir().unwrap();
        // One image in memory, two on disk, then no room.
        let bounds = FillBounds {
            memory_bytes: largest,
            spill_bytes: (images[1].len() + images[2].len()) as u64,
            jobs: 16,
        };
        let filler = Arc::new(TierFiller::new(
            Arc::new(ImageCrateDecoder),
            bounds,
            Some(&dir.path().join("spill")),
        ));
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
        let keys: Vec<String> = (0..images.len()).map(|i| format!("k{i}")).collect();
        for (i, (key, image)) in keys.iter().zip(&images).enumerate() {
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
                copy: 0,
            };
            tier.offer(ImageFormat::Jpeg, image, Some(&spec), &augment, &sample);
        }
        assert_eq!(filler.queued(), 3, "one held, two on disk, two dropped");
        assert_eq!(
            filler.spilled_bytes(),
            (images[1].len() + images[2].len()) as u64
        );
        filler.spawn(1).unwrap();
        // A center crop keeps its output too: a source and an output each.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while store.0.lock().unwrap().len() < 6 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let stored = store.0.lock().unwrap().len();
        assert_eq!(stored, 6);
        assert_eq!(filler.queued(), 0);
        // The disk's space goes with the last job that read from it.
        assert_eq!(filler.spilled_bytes(), 0);
        // What was kept is what a stored epoch would derive.
        let first = SourceKey::new(
            &SampleVersion {
                location: "s3://b/shard.tar",
                version: "etag",
                size: 1,
                key: &keys[2],
            },
            tier.form,
        );
        let kept = store.get(&first).expect("the spilled image's source");
        let derived = crate::decode::source::derive_source_with(
            &ImageCrateDecoder,
            ImageFormat::Jpeg,
            &images[2],
            &tier.form,
        )
        .unwrap();
        assert_eq!(kept.bytes, derived.bytes);
    }
}
