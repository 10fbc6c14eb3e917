//! Who may use a cache directory: the lock that keeps two servers out of
//! one directory, the slots that let several share a node's directory, and
//! the preparation of a node directory for the sidecar's user.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::disk::{io_error, CacheConfig, CacheError, DiskCache, LOCK_FILE};

fn lock_dir(dir: &Path) -> Result<std::fs::File, CacheError> {
    use std::os::fd::AsRawFd;
    let path = dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| io_error(&path, e))?;
    // SAFETY: a valid open descriptor for the duration of the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let error = std::io::Error::last_os_error();
        return Err(if error.kind() == std::io::ErrorKind::WouldBlock {
            CacheError::Locked {
                dir: dir.to_path_buf(),
            }
        } else {
            io_error(&path, error)
        });
    }
    Ok(file)
}

/// Creates `dir` and gives it to `uid:gid`, mode 0750: a node directory
/// (hostPath) is made by the kubelet as root, and fsGroup does not apply to
/// it. Only the directory itself changes owner: what is in it is the
/// sidecar's own. Run by root with CAP_CHOWN (mode first, while root owns it).
pub fn prepare_dir(dir: &Path, uid: u32, gid: u32) -> Result<(), CacheError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750))
        .map_err(|e| io_error(dir, e))?;
    std::os::unix::fs::chown(dir, Some(uid), Some(gid)).map_err(|e| io_error(dir, e))
}

impl DiskCache {
    /// Opens (or creates) the cache in the first free slot of `config.dir`
    /// and adopts the entries a previous run left there (see
    /// [`DiskCache::open_locked`]).
    pub fn open(config: CacheConfig) -> Result<Arc<Self>, CacheError> {
        match Self::try_claim(&config)? {
            Some((dir, lock)) => Self::open_locked(config.claimed(dir), lock),
            None if config.slots <= 1 => Err(CacheError::Locked { dir: config.dir }),
            None => Err(CacheError::SlotsHeld {
                dir: config.dir,
                slots: config.slots,
                waited_s: 0,
            }),
        }
    }

    /// [`Self::open`], waiting up to `config.lock_wait` while every slot is
    /// held: a pod that replaces another on the same node starts while the
    /// old one drains, and the old one's lock goes with its process.
    pub async fn open_waiting(config: CacheConfig) -> Result<Arc<Self>, CacheError> {
        let wait = config.lock_wait;
        let attempt = config.clone();
        let claimed = wait_for_slot(&config.dir, config.slots, wait, move || {
            Self::try_claim(&attempt)
        })
        .await
        .map_err(|e| match e {
            SlotWaitError::Attempt(e) => e,
            SlotWaitError::Task(e) => io_error(&config.dir, e),
        })?;
        match claimed {
            Ok((dir, lock)) => {
                let config = config.claimed(dir);
                tokio::task::spawn_blocking(move || Self::open_locked(config, lock))
                    .await
                    .map_err(|e| io_error(Path::new("."), std::io::Error::other(e)))?
            }
            Err(_) if config.slots <= 1 && wait.is_zero() => {
                Err(CacheError::Locked { dir: config.dir })
            }
            Err(waited) => Err(CacheError::SlotsHeld {
                dir: config.dir,
                slots: config.slots,
                waited_s: waited.as_secs(),
            }),
        }
    }

    /// The first slot no other process holds, locked; `None` if all are held.
    fn try_claim(config: &CacheConfig) -> Result<Option<(PathBuf, std::fs::File)>, CacheError> {
        claim_slot(&config.dir, config.slots)
    }
}

/// The directory of slot `index` of `dir`: `dir` itself when there is one.
pub fn slot_dir(dir: &Path, slots: u32, index: u32) -> PathBuf {
    if slots <= 1 {
        dir.to_path_buf()
    } else {
        dir.join(format!("slot-{index}"))
    }
}

/// The first of `dir`'s `slots` slot directories that no other process
/// holds, created and locked (the lock lives as long as the file); `None`
/// if every one is held. Shared by the shard cache and the decoded-source
/// tier: both keep an index of their directory that a second writer would
/// contradict.
pub fn claim_slot(dir: &Path, slots: u32) -> Result<Option<(PathBuf, std::fs::File)>, CacheError> {
    for index in 0..slots.max(1) {
        let slot = slot_dir(dir, slots, index);
        std::fs::create_dir_all(&slot).map_err(|e| io_error(&slot, e))?;
        match lock_dir(&slot) {
            Ok(lock) => {
                if slots > 1 {
                    tracing::info!(dir = %slot.display(), slot = index, "cache slot claimed");
                }
                return Ok(Some((slot, lock)));
            }
            Err(CacheError::Locked { .. }) => continue,
            Err(other) => return Err(other),
        }
    }
    Ok(None)
}

/// Why [`wait_for_slot`] stopped short of a slot.
#[derive(Debug)]
pub enum SlotWaitError<E> {
    /// The attempt failed otherwise than by finding every slot held.
    Attempt(E),
    /// The blocking task running it did not finish.
    Task(std::io::Error),
}

/// Claims a free slot of `dir` with `attempt` (blocking: it takes a file
/// lock; `Ok(None)` when every one of the `slots` is held), retried every
/// second for up to `wait` and logged once: a pod replacing another on the
/// node starts while the old one drains. Both caches, the shard cache and
/// the decoded-source tier, wait through this. `Ok(Err(waited))` when every
/// slot was still held after `wait`.
pub async fn wait_for_slot<T: Send + 'static, E: Send + 'static>(
    dir: &Path,
    slots: u32,
    wait: Duration,
    attempt: impl Fn() -> Result<Option<T>, E> + Clone + Send + 'static,
) -> Result<Result<T, Duration>, SlotWaitError<E>> {
    const RETRY: Duration = Duration::from_secs(1);
    let started = tokio::time::Instant::now();
    let mut logged = false;
    loop {
        let once = attempt.clone();
        let claimed = tokio::task::spawn_blocking(once)
            .await
            .map_err(|e| SlotWaitError::Task(std::io::Error::other(e)))?
            .map_err(SlotWaitError::Attempt)?;
        if let Some(claimed) = claimed {
            return Ok(Ok(claimed));
        }
        let waited = started.elapsed();
        if waited >= wait {
            return Ok(Err(waited));
        }
        if !logged {
            tracing::warn!(
                dir = %dir.display(),
                slots,
                wait_s = wait.as_secs(),
                "every slot of the directory is held by another process; waiting for one"
            );
            logged = true;
        }
        tokio::time::sleep(RETRY.min(wait - waited)).await;
    }
}
