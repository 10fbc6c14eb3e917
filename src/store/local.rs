//! A directory on local disk as an object store (`file:///abs/dir/`), for
//! development and for datasets already on a volume.

use std::io::SeekFrom;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::{ObjectMeta, ObjectStore, PartStream, StoreError};

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

fn walk(dir: &Path, root: &Path, out: &mut Vec<ObjectMeta>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        let path = entry.path();
        if meta.is_dir() {
            walk(&path, root, out)?;
        } else if meta.is_file() {
            let key = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .to_string_lossy()
                .replace('\\', "/");
            out.push(ObjectMeta {
                key,
                size: meta.len(),
                etag: file_etag(&meta),
            });
        }
    }
    Ok(())
}

#[async_trait]
impl ObjectStore for LocalStore {
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StoreError> {
        let root = self.root.clone();
        if !root.is_dir() {
            return Err(StoreError::NotFound {
                location: self.location(""),
                message: "no such directory".into(),
            });
        }
        let prefix = prefix.to_string();
        let mut objects = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            walk(&root, &root, &mut out).map(|_| out)
        })
        .await
        .map_err(|e| StoreError::Other {
            location: self.location(""),
            message: e.to_string(),
        })?
        .map_err(|e| self.io_error("", e))?;
        objects.retain(|o| o.key.starts_with(&prefix));
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(objects)
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
                        Err(StoreError::Other {
                            location: location.clone(),
                            message: format!("file ends at {offset}, before {end}"),
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
