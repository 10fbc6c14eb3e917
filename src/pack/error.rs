//! Why a pack failed.

use std::path::PathBuf;

use crate::dataset::DatasetError;
use crate::shard::ShardError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("manifest {path}: {message}")]
    Manifest { path: PathBuf, message: String },
    #[error("{0}")]
    Layout(String),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Dataset(#[from] DatasetError),
    #[error("indexing a packed shard: {0}")]
    Shard(#[from] ShardError),
}
