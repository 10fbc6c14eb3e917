//! What the packer reads: one input (a file, a TFRecord record or an object),
//! the listing of a source, and the sample keys the inputs get.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::store::ObjectMeta;

/// Why a file was left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub path: PathBuf,
    pub reason: String,
}

/// A file to pack, or one record of a TFRecord file.
#[derive(Debug, Clone)]
pub(super) struct Input {
    pub(super) path: PathBuf,
    pub(super) key: String,
    pub(super) label: i64,
    pub(super) size: u64,
    /// The record's byte range in `path` (a TFRecord source).
    pub(super) record: Option<std::ops::Range<u64>>,
    /// The object to fetch (a loose-object source; `path` is its key).
    pub(super) object: Option<ObjectMeta>,
}

/// The inputs, the class names, and the files left out.
pub(super) type Listing = (Vec<Input>, Vec<String>, Vec<Skipped>);

/// The sample key: the path below `source` without its extension, dots in
/// the file name replaced (a WebDataset key ends at the file name's first dot).
pub(super) fn sample_key(source: &Path, path: &Path) -> String {
    let relative = path.strip_prefix(source).unwrap_or(path);
    let relative = relative.to_string_lossy().replace('\\', "/");
    let (dir, file) = match relative.rfind('/') {
        Some(slash) => (&relative[..=slash], &relative[slash + 1..]),
        None => ("", relative.as_str()),
    };
    let stem = file.rsplit_once('.').map_or(file, |(stem, _)| stem);
    format!("{dir}{}", stem.replace('.', "_"))
}

/// `key`, or `key_2`, `key_3`, … when taken (e.g. `a.jpg` beside `a.png`).
pub(super) fn unique_key(key: String, taken: &mut HashSet<String>) -> String {
    if taken.insert(key.clone()) {
        return key;
    }
    let mut n = 2;
    loop {
        let candidate = format!("{key}_{n}");
        if taken.insert(candidate.clone()) {
            return candidate;
        }
        n += 1;
    }
}
