//! A directory on local disk as an object store (`file:///abs/dir/`), for
//! development and for datasets already on a volume.

use std::io::SeekFrom;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use super::beneath::{is_link_refused, Beneath, Links};
use super::{ListPage, ObjectMeta, ObjectStore, PartStream, StoreError};

const READ_CHUNK: usize = 1 << 20;

#[derive(Debug, Clone)]
pub struct LocalStore {
    /// The folder as the dataset URI names it (for messages).
    root: PathBuf,
    /// The folder itself, resolved once when the store was made: a link
    /// in its path repointed later changes nothing here.
    held: Option<Arc<Beneath>>,
}

/// Dataset folders held open, by the path their URI names, while anything
/// holds them: the `--allow` check and the store a request opens resolve
/// the folder once, through one descriptor, so a link repointed between
/// the check and the open cannot lead the store elsewhere.
static HELD_ROOTS: Mutex<Option<HashMap<PathBuf, Weak<Beneath>>>> = Mutex::new(None);

/// The folder at `path`, opened now or shared with whoever holds it.
pub fn hold_root(path: &Path) -> std::io::Result<Arc<Beneath>> {
    let mut held = HELD_ROOTS.lock().unwrap_or_else(|e| e.into_inner());
    let held = held.get_or_insert_with(HashMap::new);
    if let Some(root) = held.get(path).and_then(Weak::upgrade) {
        return Ok(root);
    }
    held.retain(|_, root| root.strong_count() > 0);
    let root = Arc::new(Beneath::open(path)?);
    held.insert(path.to_path_buf(), Arc::downgrade(&root));
    Ok(root)
}

impl LocalStore {
    /// A store over `root`, resolved now (or, for a folder that does not
    /// exist yet, by its path on every call).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let held = hold_root(&root).ok();
        Self { root, held }
    }

    /// Where paths start: the held folder (through its descriptor), else the
    /// named path.
    fn base(&self) -> PathBuf {
        self.held
            .as_ref()
            .map_or_else(|| self.root.clone(), |held| held.fd_path())
    }

    /// The file of `key`, which must stay inside the root: no absolute
    /// keys, no `..`, and no symlink that resolves outside the root (a
    /// dataset's index names its shards; `--allow` admits the root only).
    async fn path(&self, key: &str) -> Result<PathBuf, StoreError> {
        let escapes = |message: &str| StoreError::PermissionDenied {
            location: self.location(key),
            message: message.to_string(),
        };
        let relative = Path::new(key);
        if relative.is_absolute()
            || relative
                .components()
                .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(escapes("the key leaves the dataset directory"));
        }
        let base = self.base();
        let path = base.join(relative);
        // Resolve the deepest existing ancestor: a file being created has none yet.
        let mut existing = path.as_path();
        let resolved = loop {
            match tokio::fs::canonicalize(existing).await {
                Ok(resolved) => break Some(resolved),
                Err(_) => match existing.parent() {
                    Some(parent) => existing = parent,
                    None => break None,
                },
            }
        };
        if let (Some(resolved), Ok(root)) = (resolved, tokio::fs::canonicalize(&base).await) {
            if !resolved.starts_with(&root) {
                return Err(escapes(
                    "the key resolves outside the dataset directory (a symlink)",
                ));
            }
        }
        Ok(path)
    }

    /// Opens `key` for reading: beneath the held folder (no link out of it
    /// followed, even one made after the key was checked), else by path.
    async fn open(&self, key: &str) -> Result<tokio::fs::File, StoreError> {
        let path = self.path(key).await?;
        let Some(held) = self.held.clone() else {
            return tokio::fs::File::open(&path)
                .await
                .map_err(|e| self.io_error(key, e));
        };
        let relative = PathBuf::from(key);
        let opened = tokio::task::spawn_blocking(move || held.open_read(&relative, Links::Inside))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|opened| opened);
        match opened {
            Ok(file) => Ok(tokio::fs::File::from_std(file)),
            Err(error) if is_link_refused(&error) => Err(StoreError::PermissionDenied {
                location: self.location(key),
                message: "the key resolves outside the dataset directory (a symlink)".into(),
            }),
            Err(error) => Err(self.io_error(key, error)),
        }
    }

    fn io_error(&self, key: &str, error: std::io::Error) -> StoreError {
        let location = self.location(key);
        match error.kind() {
            std::io::ErrorKind::NotFound => StoreError::NotFound {
                location,
                message: String::new(),
            },
            // A file where a folder of the path should be: nothing is there
            // to read, as for a path that does not exist.
            std::io::ErrorKind::NotADirectory => StoreError::NotFound {
                location,
                message: error.to_string(),
            },
            std::io::ErrorKind::PermissionDenied => StoreError::PermissionDenied {
                location,
                message: error.to_string(),
            },
            _ => StoreError::Other {
                location,
                message: error.to_string(),
            },
        }
    }
}

/// ETag stand-in for files: size and modification time.
fn file_etag(meta: &std::fs::Metadata) -> Option<String> {
    let modified = meta.modified().ok()?;
    let nanos = modified
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos();
    Some(format!("{:x}-{:x}", meta.len(), nanos))
}

/// Lists `dir` into `out`, keys relative to `root`. Symlinks are followed
/// (as torchvision's ImageFolder follows them) while they resolve inside
/// `real_root`: a link to a folder outside is an error naming it (a whole
/// class would vanish), a link to a file outside or a broken link is left
/// out with a warning, and a link to a folder that holds it (a loop) is not
/// walked. Every folder is listed as a `folder/` marker, as S3 consoles
/// create them, so a class folder without images still counts as a class.
fn walk(
    dir: &Path,
    root: &Path,
    ancestors: &mut Vec<PathBuf>,
    out: &mut Vec<ObjectMeta>,
) -> Result<(), String> {
    let key_of = |path: &Path| {
        path.strip_prefix(root)
            .unwrap_or(path)
            .to_string_lossy()
            .replace('\\', "/")
    };
    let io = |path: &Path, error: std::io::Error| format!("{}: {error}", path.display());
    for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let entry = entry.map_err(|e| io(dir, e))?;
        let path = entry.path();
        let linked = entry.file_type().map_err(|e| io(&path, e))?.is_symlink();
        let meta = match std::fs::metadata(&path) {
            Ok(meta) => meta,
            Err(error) if linked => {
                tracing::warn!(path = %path.display(), %error, "left out a broken symlink");
                continue;
            }
            Err(error) => return Err(io(&path, error)),
        };
        let real = std::fs::canonicalize(&path).map_err(|e| io(&path, e))?;
        if !real.starts_with(&ancestors[0]) {
            if meta.is_dir() {
                return Err(format!(
                    "{} links to {}, outside the dataset directory; point the dataset at a \
                     directory that holds both",
                    path.display(),
                    real.display()
                ));
            }
            tracing::warn!(
                path = %path.display(),
                target = %real.display(),
                "left out a symlink to a file outside the dataset directory"
            );
            continue;
        }
        if meta.is_dir() {
            if ancestors.contains(&real) {
                tracing::warn!(path = %path.display(), "left out a symlink loop");
                continue;
            }
            out.push(ObjectMeta {
                key: format!("{}/", key_of(&path)),
                size: 0,
                etag: None,
            });
            ancestors.push(real);
            let walked = walk(&path, root, ancestors, out);
            ancestors.pop();
            walked?;
        } else if meta.is_file() {
            out.push(ObjectMeta {
                key: key_of(&path),
                size: meta.len(),
                etag: file_etag(&meta),
            });
        }
    }
    Ok(())
}

#[async_trait]
impl ObjectStore for LocalStore {
    async fn list_page(&self, prefix: &str, _token: Option<&str>) -> Result<ListPage, StoreError> {
        let root = self.base();
        if !root.is_dir() {
            return Err(StoreError::NotFound {
                location: self.location(""),
                message: "no such directory".into(),
            });
        }
        let prefix = prefix.to_string();
        let mut objects = tokio::task::spawn_blocking(move || {
            let real_root = std::fs::canonicalize(&root).map_err(|e| e.to_string())?;
            let mut out = Vec::new();
            walk(&root, &root, &mut vec![real_root], &mut out).map(|_| out)
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|listed| listed)
        .map_err(|message| StoreError::Other {
            location: self.location(""),
            message,
        })?;
        objects.retain(|o| o.key.starts_with(&prefix));
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(ListPage {
            objects,
            next: None,
        })
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta, StoreError> {
        let file = self.open(key).await?;
        let meta = file.metadata().await.map_err(|e| self.io_error(key, e))?;
        Ok(ObjectMeta {
            key: key.to_string(),
            size: meta.len(),
            etag: file_etag(&meta),
        })
    }

    async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<PartStream, StoreError> {
        let mut file = self.open(key).await?;
        if let Some(expected) = if_match {
            let meta = file.metadata().await.map_err(|e| self.io_error(key, e))?;
            if file_etag(&meta).as_deref() != Some(expected) {
                return Err(StoreError::Changed {
                    location: self.location(key),
                });
            }
        }
        file.seek(SeekFrom::Start(range.start))
            .await
            .map_err(|e| self.io_error(key, e))?;
        let location = self.location(key);
        let stream = futures::stream::unfold(
            (file, range.start, range.end, location),
            |(mut file, offset, end, location)| async move {
                if offset >= end {
                    return None;
                }
                let want = ((end - offset) as usize).min(READ_CHUNK);
                let mut buf = vec![0u8; want];
                match file.read(&mut buf).await {
                    Ok(0) => Some((
                        Err(StoreError::Truncated {
                            location: location.clone(),
                            message: format!("the file ends at byte {offset}, before {end}"),
                        }),
                        (file, end, end, location),
                    )),
                    Ok(n) => {
                        buf.truncate(n);
                        let item = Ok((offset, Bytes::from(buf)));
                        Some((item, (file, offset + n as u64, end, location)))
                    }
                    Err(e) => Some((
                        Err(StoreError::Transient {
                            location: location.clone(),
                            message: e.to_string(),
                        }),
                        (file, end, end, location),
                    )),
                }
            },
        );
        Ok(stream.boxed())
    }

    async fn put(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
        let path = self.path(key).await?;
        if let Some(parent) = path.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| self.io_error(key, e))?;
        }
        // Write then rename: a reader never sees a half-written object.
        let tmp = path.with_extension("partial");
        tokio::fs::write(&tmp, &data)
            .await
            .map_err(|e| self.io_error(key, e))?;
        tokio::fs::rename(&tmp, &path)
            .await
            .map_err(|e| self.io_error(key, e))
    }

    fn location(&self, key: &str) -> String {
        format!("file://{}", self.root.join(key).display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read_all(store: &LocalStore, key: &str) -> Result<Vec<u8>, StoreError> {
        let size = store.head(key).await?.size;
        let mut parts = store.get_range(key, 0..size, None).await?;
        let mut out = Vec::new();
        while let Some(part) = parts.next().await {
            out.extend_from_slice(&part?.1);
        }
        Ok(out)
    }

    #[tokio::test]
    async fn a_link_repointed_after_the_check_or_the_open_leads_nowhere_else() {
        let dir = tempfile::tempdir().unwrap();
        let (real, outside) = (dir.path().join("allowed/real"), dir.path().join("outside"));
        for (folder, text) in [(&real, "allowed"), (&outside, "outside")] {
            std::fs::create_dir_all(folder).unwrap();
            std::fs::write(folder.join("shard.tar"), text).unwrap();
        }
        let link = dir.path().join("allowed/current");
        std::os::unix::fs::symlink(&real, &link).unwrap();

        // The check holds the folder; the link is repointed before the
        // request's store is made: the store reads the folder checked.
        let checked = hold_root(&link).unwrap();
        assert_eq!(checked.resolved().unwrap(), real.canonicalize().unwrap());
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        let store = LocalStore::new(&link);
        drop(checked);
        assert_eq!(read_all(&store, "shard.tar").await.unwrap(), b"allowed");
        // Repointed again while the store is open: still the same folder.
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        assert_eq!(read_all(&store, "shard.tar").await.unwrap(), b"allowed");
        let listed = store.list_page("", None).await.unwrap();
        let keys: Vec<&str> = listed.objects.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(keys, ["shard.tar"]);
        // A link inside the folder to a file outside it is refused.
        std::os::unix::fs::symlink(outside.join("shard.tar"), real.join("leak.tar")).unwrap();
        let error = read_all(&store, "leak.tar").await.unwrap_err();
        assert!(
            matches!(error, StoreError::PermissionDenied { .. }),
            "{error}"
        );
        // Once nothing holds it, a new store resolves the link anew.
        drop(store);
        let fresh = LocalStore::new(&link);
        assert!(read_all(&fresh, "allowed/real/shard.tar").await.is_ok());
    }
}
