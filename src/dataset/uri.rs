//! Dataset URIs: `s3://bucket/prefix/` or `file:///abs/dir/`, each
//! optionally naming a manifest object instead of the folder.

use std::path::PathBuf;

use super::index::DatasetError;
use super::manifest::is_manifest_name;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatasetUri {
    /// `manifest`: the URI named a manifest object (`*.csv`, `*.jsonl`) in
    /// the folder `prefix` rather than the folder itself.
    S3 {
        bucket: String,
        prefix: String,
        manifest: Option<String>,
    },
    Local {
        root: PathBuf,
        manifest: Option<String>,
    },
}

impl DatasetUri {
    pub fn parse(uri: &str) -> Result<Self, DatasetError> {
        let invalid = |reason| DatasetError::InvalidUri {
            uri: uri.to_string(),
            reason,
        };
        // No key or path holds one, and the OS would refuse it as a path.
        if uri.contains('\0') {
            return Err(invalid("a dataset URI may not contain a NUL byte"));
        }
        if let Some(rest) = uri.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(invalid(
                    "missing bucket name (expected s3://bucket/prefix/)",
                ));
            }
            let (prefix, manifest) = split_manifest(prefix);
            let mut prefix = prefix.to_string();
            if !prefix.is_empty() && !prefix.ends_with('/') {
                prefix.push('/');
            }
            Ok(Self::S3 {
                bucket: bucket.to_string(),
                prefix,
                manifest,
            })
        } else if let Some(path) = uri.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(invalid(
                    "file URIs need an absolute path (file:///abs/dir/)",
                ));
            }
            // `..` would escape an --allow prefix.
            if path.split('/').any(|segment| segment == "..") {
                return Err(invalid("file URIs may not contain `..`"));
            }
            let (root, manifest) = split_manifest(path);
            Ok(Self::Local {
                root: PathBuf::from(if root.is_empty() { "/" } else { root }),
                manifest,
            })
        } else if uri.is_empty() {
            Err(invalid("dataset is empty"))
        } else {
            Err(invalid("expected s3://bucket/prefix/ or file:///abs/dir/"))
        }
    }

    /// One spelling per dataset: `file:///data//train/./` and
    /// `file:///data/train` name the same directory, and the registry keeps
    /// one index for both.
    pub fn canonical(&self) -> String {
        match self {
            Self::S3 {
                bucket,
                prefix,
                manifest,
            } => format!(
                "s3://{bucket}/{prefix}{}",
                manifest.as_deref().unwrap_or("")
            ),
            Self::Local { root, manifest } => {
                let mut path = String::from("/");
                for part in root.components() {
                    if let std::path::Component::Normal(name) = part {
                        path.push_str(&name.to_string_lossy());
                        path.push('/');
                    }
                }
                format!("file://{path}{}", manifest.as_deref().unwrap_or(""))
            }
        }
    }

    /// The manifest object the URI names, if it names one.
    pub fn manifest(&self) -> Option<&str> {
        match self {
            Self::S3 { manifest, .. } | Self::Local { manifest, .. } => manifest.as_deref(),
        }
    }
}

/// `folder/`, `Some(name)` when the path's last segment names a manifest.
fn split_manifest(path: &str) -> (&str, Option<String>) {
    match path.rsplit_once('/') {
        Some((folder, name)) if is_manifest_name(name) => (folder, Some(name.to_string())),
        None if is_manifest_name(path) => ("", Some(path.to_string())),
        _ => (path, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_of_one_dataset_share_a_canonical_uri() {
        let canonical = |uri: &str| DatasetUri::parse(uri).unwrap().canonical();
        assert_eq!(canonical("file:///data//train/./"), "file:///data/train/");
        assert_eq!(canonical("file:///data/train"), "file:///data/train/");
        assert_eq!(canonical("file:///data/./m.csv"), "file:///data/m.csv");
        assert_eq!(canonical("s3://b/train"), "s3://b/train/");
        assert_eq!(
            canonical("s3://b/images/train.csv"),
            "s3://b/images/train.csv"
        );
        assert_ne!(canonical("s3://b/a/"), canonical("s3://b/b/"));
    }

    #[test]
    fn parses_uris() {
        assert_eq!(
            DatasetUri::parse("s3://b/train").unwrap(),
            DatasetUri::S3 {
                bucket: "b".into(),
                prefix: "train/".into(),
                manifest: None,
            }
        );
        assert_eq!(
            DatasetUri::parse("s3://b").unwrap(),
            DatasetUri::S3 {
                bucket: "b".into(),
                prefix: String::new(),
                manifest: None,
            }
        );
        assert_eq!(
            DatasetUri::parse("s3://b/images/train.csv").unwrap(),
            DatasetUri::S3 {
                bucket: "b".into(),
                prefix: "images/".into(),
                manifest: Some("train.csv".into()),
            }
        );
        assert_eq!(
            DatasetUri::parse("s3://b/val.JSONL").unwrap().manifest(),
            Some("val.JSONL")
        );
        assert_eq!(
            DatasetUri::parse("file:///data/m.csv").unwrap(),
            DatasetUri::Local {
                root: "/data".into(),
                manifest: Some("m.csv".into()),
            }
        );
        assert!(DatasetUri::parse("s3:///x").is_err());
        assert!(DatasetUri::parse("file://relative").is_err());
        assert!(DatasetUri::parse("http://x").is_err());
        assert!(DatasetUri::parse("file:///data/../etc/").is_err());
        assert!(matches!(
            DatasetUri::parse("file:///data/").unwrap(),
            DatasetUri::Local { .. }
        ));
    }
}
