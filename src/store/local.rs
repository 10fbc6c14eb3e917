//! A directory on local disk as an object store (`file:///abs/dir/`), for
//! development and for datasets already on a volume.

use std::io::SeekFrom;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::{ListPage, ObjectMeta, ObjectStore, PartStream, StoreError};

const READ_CHUNK: usize = 1 << 20;

#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
}

impl LocalStore {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
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
        let path = self.root.join(relative);
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
        if let (Some(resolved), Ok(root)) = (resolved, tokio::fs::canonicalize(&self.root).await) {
            if !resolved.starts_with(&root) {
                return Err(escapes(
                    "the key resolves outside the dataset directory (a symlink)",
                ));
            }
        }
        Ok(path)
    }

    fn io_error(&self, key: &str, error: std::io::Error) -> StoreError {
        let location = self.location(key);
        match error.kind() {
            std::io::ErrorKind::NotFound => StoreError::NotFound {
                location,
                message: String::new(),
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
        let root = self.root.clone();
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
        let meta = tokio::fs::metadata(self.path(key).await?)
            .await
            .map_err(|e| self.io_error(key, e))?;
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
        let path = self.path(key).await?;
        let mut file = tokio::fs::File::open(&path)
            .await
            .map_err(|e| self.io_error(key, e))?;
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
