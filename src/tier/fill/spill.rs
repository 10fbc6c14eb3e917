//! Where the fill queue keeps the compressed images its memory bound
//! leaves out: append-only segment files in the tier's directory.
//!
//! A trainer that leaves the decode idle between steps still starts each
//! epoch with a burst (the pipeline decodes its first batches ahead at full
//! speed, with no core to spare), and a burst of a thousand photos is far
//! more than a queue bounded in memory should hold. On disk it costs the
//! page cache, and the fill catches up once the trainer's pace leaves the
//! cores idle. A segment is unlinked as soon as it is created: its space is
//! freed when the last job that points into it is done, and a crash leaves
//! nothing behind.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Bytes a segment takes before the next one starts: large enough that a
/// burst is a few files, small enough that a drained one frees its space
/// soon.
const SEGMENT_BYTES: u64 = 64 << 20;

/// The spill's segments, bounded to `limit` bytes of live segments.
#[derive(Debug)]
pub(super) struct Spill {
    dir: PathBuf,
    limit: u64,
    /// Bytes of segments some job still points into.
    live: Arc<AtomicU64>,
    writing: Mutex<Writing>,
}

#[derive(Debug, Default)]
struct Writing {
    /// Weak: a segment every job of which is done goes at once, with its
    /// space, even while it is the one written to.
    current: Weak<Segment>,
    next_id: u64,
}

/// An unlinked file and the bytes reserved in it; dropped with its last
/// job, when its bytes leave the spill's count.
#[derive(Debug)]
struct Segment {
    file: File,
    reserved: AtomicU64,
    live: Arc<AtomicU64>,
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.live
            .fetch_sub(*self.reserved.get_mut(), Ordering::Relaxed);
    }
}

/// One image on disk: where to read it back.
#[derive(Debug)]
pub(super) struct Spilled {
    segment: Arc<Segment>,
    offset: u64,
    len: u64,
    /// CRC-32 of what was written: the fill derives a stored source from
    /// these bytes, served in every later epoch, so bytes changed on disk
    /// (a bad sector, another writer) must not get that far.
    crc: u32,
}

impl Spilled {
    pub(super) fn read(&self) -> std::io::Result<Vec<u8>> {
        let mut bytes = vec![0u8; self.len as usize];
        self.segment.file.read_exact_at(&mut bytes, self.offset)?;
        if crc32fast::hash(&bytes) != self.crc {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "a spilled image changed on disk (checksum mismatch)",
            ));
        }
        Ok(bytes)
    }
}

impl Spill {
    /// A spill in `dir` (emptied of an earlier run's files) holding at most
    /// `limit` bytes.
    pub(super) fn create(dir: &Path, limit: u64) -> std::io::Result<Self> {
        match std::fs::remove_dir_all(dir) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            limit,
            live: Arc::new(AtomicU64::new(0)),
            writing: Mutex::new(Writing::default()),
        })
    }

    /// Bytes of live segments.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
    }

    /// Writes `data` to the current segment, or `Ok(None)` where the spill
    /// is full.
    pub(super) fn write(&self, data: &[u8]) -> std::io::Result<Option<Spilled>> {
        let len = data.len() as u64;
        let (segment, offset) = {
            let mut writing = self
                .writing
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if self.live.load(Ordering::Relaxed) + len > self.limit {
                return Ok(None);
            }
            // A full segment is left to its jobs.
            let current = writing
                .current
                .upgrade()
                .filter(|segment| segment.reserved.load(Ordering::Relaxed) < SEGMENT_BYTES);
            let segment = match current {
                Some(segment) => segment,
                None => {
                    let path = self.dir.join(format!("segment-{}", writing.next_id));
                    writing.next_id += 1;
                    let file = File::options()
                        .read(true)
                        .write(true)
                        .create_new(true)
                        .open(&path)?;
                    std::fs::remove_file(&path)?;
                    Arc::new(Segment {
                        file,
                        reserved: AtomicU64::new(0),
                        live: self.live.clone(),
                    })
                }
            };
            // Reserved under the lock, written after it: writers of one
            // segment never overlap, and none waits on another's write.
            let offset = segment.reserved.fetch_add(len, Ordering::Relaxed);
            self.live.fetch_add(len, Ordering::Relaxed);
            writing.current = Arc::downgrade(&segment);
            (segment, offset)
        };
        segment.file.write_all_at(data, offset)?;
        Ok(Some(Spilled {
            segment,
            offset,
            len,
            crc: crc32fast::hash(data),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_read_back_as_written_and_the_space_returns_with_the_last_job() {
        let dir = tempfile::tempdir().unwrap();
        let spill = Spill::create(&dir.path().join("spill"), 10 << 20).unwrap();
        let images: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 3 << 20]).collect();
        let mut spilled: Vec<Spilled> = images
            .iter()
            .take(3)
            .map(|image| spill.write(image).unwrap().expect("room for three"))
            .collect();
        assert!(spill.write(&images[3]).unwrap().is_none(), "over the bound");
        assert_eq!(spill.bytes(), 9 << 20);
        // The files are unlinked at once: nothing is left to clean up.
        assert_eq!(
            std::fs::read_dir(dir.path().join("spill")).unwrap().count(),
            0
        );
        for (written, image) in spilled.iter().zip(&images) {
            assert_eq!(&written.read().unwrap(), image);
        }
        // One segment: its space is the spill's until its last job is done.
        spilled.truncate(1);
        assert!(spill.write(&images[3]).unwrap().is_none());
        drop(spilled);
        assert_eq!(spill.bytes(), 0);
        let again = spill.write(&images[4]).unwrap().expect("room again");
        assert_eq!(spill.bytes(), 3 << 20);
        assert_eq!(again.read().unwrap(), images[4]);
        // A byte changed under it is caught, not decoded into the tier.
        again
            .segment
            .file
            .write_all_at(&[9], again.offset + 7)
            .unwrap();
        let error = again.read().unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidData, "{error}");
    }
}
