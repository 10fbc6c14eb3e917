//! What `pack` reads from a local folder: the ImageFolder layout, any
//! layout with a manifest, or a folder of TFRecord files.
//!
//! Symlinked class folders and images are followed, as torchvision's
//! ImageFolder follows them, but only to targets inside the source folder:
//! a link that leads out is refused (a class folder) or reported and
//! skipped (an image), and a link to a folder that holds it (a loop) is
//! reported and not walked.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::error::PackError;
use super::input::{sample_key, unique_key, Input, Listing, Skipped};
use crate::dataset::manifest::parse_manifest;
use crate::shard::tfrecord::{self, FeatureNames, RecordParser};
use crate::shard::{ShardFormat, StreamedFormat, DEFAULT_MAX_MEMBER_BYTES};

/// Files with their labels, class names (empty for integer labels), and
/// what the walk refused.
struct Labelled {
    files: Vec<(PathBuf, i64)>,
    classes: Vec<String>,
    skipped: Vec<Skipped>,
}

/// The files to pack with their labels, sorted by path; class names; files
/// already known to be unusable.
pub(super) fn list_inputs(source: &Path, manifest: Option<&Path>) -> Result<Listing, PackError> {
    let labelled = match manifest {
        Some(manifest) => read_manifest(source, manifest)?,
        None => {
            let mut walker = Walker::new(source)?;
            let mut found = Vec::new();
            let real_source = walker.ancestors[0].clone();
            walker.walk(source, &real_source, &mut found)?;
            let files: Vec<PathBuf> = found.into_iter().map(|(path, _)| path).collect();
            let (records, images): (Vec<PathBuf>, Vec<PathBuf>) =
                files.into_iter().partition(|path| {
                    ShardFormat::from_name(&path.to_string_lossy())
                        == Some(ShardFormat::Streamed(StreamedFormat::TfRecord))
                });
            if let (Some(record), Some(image)) =
                (records.first(), images.iter().find(|p| is_image_name(p)))
            {
                return Err(PackError::Layout(format!(
                    "{} holds both TFRecord files ({}) and images ({}): pack one or the \
                     other, from folders of their own",
                    source.display(),
                    record.display(),
                    image.display()
                )));
            }
            if !records.is_empty() {
                return tfrecord_inputs(source, records);
            }
            image_folder(source)?
        }
    };
    let Labelled {
        files,
        classes,
        mut skipped,
    } = labelled;
    let mut inputs = Vec::with_capacity(files.len());
    let mut keys = HashSet::new();
    for (path, label) in files {
        let size = match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => meta.len(),
            Ok(_) => {
                skipped.push(Skipped {
                    path,
                    reason: "not a regular file".into(),
                });
                continue;
            }
            Err(error) => {
                skipped.push(Skipped {
                    path,
                    reason: format!("unreadable: {error}"),
                });
                continue;
            }
        };
        if size > DEFAULT_MAX_MEMBER_BYTES {
            skipped.push(Skipped {
                path,
                reason: format!(
                    "{size} bytes, over the {DEFAULT_MAX_MEMBER_BYTES}-byte member limit"
                ),
            });
            continue;
        }
        let key = unique_key(sample_key(source, &path), &mut keys);
        inputs.push(Input {
            path,
            key,
            label,
            size,
            record: None,
            object: None,
        });
    }
    Ok((inputs, classes, skipped))
}

fn is_image_name(path: &Path) -> bool {
    crate::dataset::loose::is_image_key(&path.to_string_lossy())
}

/// Every record of the TFRecord files under the source (sorted by path),
/// keyed `<file stem>/<record number>`, with the Example's label (-1 when it
/// has none). A record failing its checks is skipped with the reason; a
/// broken frame skips the rest of its file.
fn tfrecord_inputs(source: &Path, mut files: Vec<PathBuf>) -> Result<Listing, PackError> {
    files.sort();
    let names = FeatureNames::default();
    let mut inputs = Vec::new();
    let mut skipped = Vec::new();
    let mut keys = HashSet::new();
    for path in files {
        let data = std::fs::read(&path).map_err(|source| PackError::Io {
            path: path.clone(),
            source,
        })?;
        let stem = sample_key(source, &path);
        let mut parser = RecordParser::new(0, DEFAULT_MAX_MEMBER_BYTES);
        let mut offset = 0usize;
        let mut number = 0u64;
        let skip = |reason: String| Skipped {
            path: path.clone(),
            reason,
        };
        while offset < data.len() {
            let (range, start, end, data_ok) = match parser.parse(&data[offset..]) {
                Ok(tfrecord::Parsed::Record {
                    data: range,
                    start,
                    end,
                    data_ok,
                    consumed,
                }) => {
                    let range = offset + range.start..offset + range.end;
                    offset += consumed;
                    (range, start, end, data_ok)
                }
                Ok(tfrecord::Parsed::NeedMore(_)) => {
                    skipped.push(skip(format!("record {number}: the file ends inside it")));
                    break;
                }
                Err(error) => {
                    skipped.push(skip(format!("record {number} and the rest: {error}")));
                    break;
                }
            };
            let record = number;
            number += 1;
            if !data_ok {
                skipped.push(skip(format!("record {record}: fails its CRC32C")));
                continue;
            }
            let example = Bytes::copy_from_slice(&data[range]);
            match tfrecord::parse_example(example, &names, &[]) {
                Ok(example) => inputs.push(Input {
                    path: path.clone(),
                    key: unique_key(format!("{stem}/{record:08}"), &mut keys),
                    label: example.label.unwrap_or(-1),
                    size: example.image.len() as u64,
                    record: Some(start..end),
                    object: None,
                }),
                Err(reason) => skipped.push(skip(format!("record {record}: {reason}"))),
            }
        }
    }
    Ok((inputs, Vec::new(), skipped))
}

/// The image of one record of a TFRecord file (its checks passed when listed).
pub(super) fn read_record_image(
    path: &Path,
    record: &std::ops::Range<u64>,
) -> Result<Vec<u8>, String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).map_err(|e| format!("unreadable: {e}"))?;
    let mut framed = vec![0; (record.end - record.start) as usize];
    file.seek(SeekFrom::Start(record.start))
        .and_then(|_| file.read_exact(&mut framed))
        .map_err(|e| format!("unreadable: {e}"))?;
    let example = Bytes::from(framed).slice(12..(record.end - record.start) as usize - 4);
    tfrecord::parse_example(example, &FeatureNames::default(), &[]).map(|e| e.image.to_vec())
}

/// The ImageFolder layout: `source/<class>/**/<file>`, classes sorted. A
/// class folder with no files keeps its index (labels never shift because
/// one class is empty); `pack` reports it.
fn image_folder(source: &Path) -> Result<Labelled, PackError> {
    let mut walker = Walker::new(source)?;
    let mut classes = Vec::new();
    let real_source = walker.ancestors[0].clone();
    for entry in walker.entries(source, &real_source)? {
        if let Entry::Dir(path, _) = entry {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            classes.push((name.into_owned(), path));
        }
    }
    if classes.is_empty() {
        return Err(PackError::Layout(format!(
            "{} has no class directories (ImageFolder layout: one directory per class); \
             for a flat folder give --manifest",
            source.display()
        )));
    }
    classes.sort();
    let mut files = Vec::new();
    for (label, (_, dir)) in classes.iter().enumerate() {
        let mut found = Vec::new();
        let real = std::fs::canonicalize(dir).map_err(|source| PackError::Io {
            path: dir.clone(),
            source,
        })?;
        walker.walk(dir, &real, &mut found)?;
        // A file reached by several paths of one class (a link beside its
        // target) is that class's sample once, under its first path.
        found.sort();
        let mut seen = std::collections::HashSet::new();
        found.retain(|(_, real)| seen.insert(real.clone()));
        files.extend(found.into_iter().map(|(path, _)| (path, label as i64)));
    }
    files.sort();
    Ok(Labelled {
        files,
        classes: classes.into_iter().map(|(name, _)| name).collect(),
        skipped: walker.skipped,
    })
}

/// An entry of a directory, with its real path (links resolved).
enum Entry {
    Dir(PathBuf, PathBuf),
    File(PathBuf, PathBuf),
}

/// Walks a folder following symlinks wherever they point, as torchvision's
/// ImageFolder does: subsets of large datasets are often folders of links.
/// `pack` runs with its user's own rights, so it confines nothing; what a
/// sidecar may serve is its `--allow` roots' business.
struct Walker {
    /// Real paths of the directories being walked: a link to one is a loop.
    ancestors: Vec<PathBuf>,
    skipped: Vec<Skipped>,
}

impl Walker {
    fn new(source: &Path) -> Result<Self, PackError> {
        let root = std::fs::canonicalize(source).map_err(|error| PackError::Io {
            path: source.to_path_buf(),
            source: error,
        })?;
        Ok(Self {
            ancestors: vec![root],
            skipped: Vec::new(),
        })
    }

    /// The visible entries of `dir` (whose real path is `real_dir`), links
    /// resolved; a broken link is skipped with the reason.
    fn entries(&mut self, dir: &Path, real_dir: &Path) -> Result<Vec<Entry>, PackError> {
        let io = |source| PackError::Io {
            path: dir.to_path_buf(),
            source,
        };
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name();
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            let path = entry.path();
            let kind = entry.file_type().map_err(io)?;
            if !kind.is_symlink() {
                let real = real_dir.join(&name);
                entries.push(if kind.is_dir() {
                    Entry::Dir(path, real)
                } else {
                    Entry::File(path, real)
                });
                continue;
            }
            let Ok(target) = std::fs::canonicalize(&path) else {
                self.skipped.push(Skipped {
                    path,
                    reason: "a broken symlink".into(),
                });
                continue;
            };
            entries.push(if target.is_dir() {
                Entry::Dir(path, target)
            } else {
                Entry::File(path, target)
            });
        }
        Ok(entries)
    }

    /// Every file under `dir` with its real path, skipping hidden names and
    /// links back to a folder being walked (loops).
    fn walk(
        &mut self,
        dir: &Path,
        real_dir: &Path,
        out: &mut Vec<(PathBuf, PathBuf)>,
    ) -> Result<(), PackError> {
        for entry in self.entries(dir, real_dir)? {
            match entry {
                Entry::File(path, real) => out.push((path, real)),
                Entry::Dir(path, real) => {
                    if self.ancestors.contains(&real) {
                        self.skipped.push(Skipped {
                            path,
                            reason: "a symlink loop (links to a folder that holds it)".into(),
                        });
                    } else {
                        self.ancestors.push(real.clone());
                        let walked = self.walk(&path, &real, out);
                        self.ancestors.pop();
                        walked?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// A manifest (see [`crate::dataset::manifest`] for its rules) naming files
/// relative to `source`.
fn read_manifest(source: &Path, manifest: &Path) -> Result<Labelled, PackError> {
    let bytes = std::fs::read(manifest).map_err(|error| PackError::Io {
        path: manifest.to_path_buf(),
        source: error,
    })?;
    let name = manifest.to_string_lossy();
    let parsed = parse_manifest(&name, &bytes).map_err(|message| PackError::Manifest {
        path: manifest.to_path_buf(),
        message,
    })?;
    let mut files: Vec<(PathBuf, i64)> = parsed
        .entries
        .into_iter()
        .map(|entry| (source.join(entry.path), entry.label))
        .collect();
    files.sort();
    Ok(Labelled {
        files,
        classes: parsed.classes,
        skipped: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"x").unwrap();
    }

    #[test]
    fn symlinked_classes_and_images_are_followed_wherever_they_point() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("train");
        touch(&root.join("a/1.jpg"));
        touch(&root.join("store/b/2.jpg"));
        touch(&root.join("store/loose.jpg"));
        touch(&dir.path().join("outside/3.jpg"));
        touch(&dir.path().join("elsewhere/4.jpg"));
        std::os::unix::fs::symlink(root.join("store/b"), root.join("b")).unwrap();
        std::os::unix::fs::symlink(root.join("store/loose.jpg"), root.join("a/link.jpg")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("outside/3.jpg"), root.join("a/out.jpg"))
            .unwrap();
        // The same file twice in one class: once.
        std::os::unix::fs::symlink(root.join("a/1.jpg"), root.join("a/again.jpg")).unwrap();
        std::os::unix::fs::symlink(&root, root.join("a/loop")).unwrap();
        // A class folder outside the source folder (a subset made of links).
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), root.join("c")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("gone"), root.join("a/broken.jpg")).unwrap();
        std::fs::create_dir_all(root.join("empty")).unwrap();
        let listed = image_folder(&root).unwrap();
        assert_eq!(listed.classes, ["a", "b", "c", "empty", "store"]);
        let rel: Vec<(String, i64)> = listed
            .files
            .iter()
            .map(|(p, l)| (p.strip_prefix(&root).unwrap().display().to_string(), *l))
            .collect();
        assert_eq!(
            rel,
            [
                ("a/1.jpg".to_string(), 0),
                ("a/link.jpg".to_string(), 0),
                ("a/out.jpg".to_string(), 0),
                ("b/2.jpg".to_string(), 1),
                ("c/4.jpg".to_string(), 2),
                ("store/b/2.jpg".to_string(), 4),
                ("store/loose.jpg".to_string(), 4),
            ]
        );
        let reasons: Vec<&str> = listed.skipped.iter().map(|s| s.reason.as_str()).collect();
        assert!(reasons.iter().any(|r| r.contains("symlink loop")));
        assert!(reasons.iter().any(|r| r.contains("broken symlink")));
    }

    #[test]
    fn images_beside_tfrecords_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        touch(&dir.path().join("train-0.tfrecord"));
        touch(&dir.path().join("cat/1.jpg"));
        let error = list_inputs(dir.path(), None).err().unwrap().to_string();
        assert!(
            error.contains("train-0.tfrecord") && error.contains("1.jpg"),
            "{error}"
        );
    }
}
