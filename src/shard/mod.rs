//! Shard formats: turn a shard's bytes into samples.
//!
//! Pure byte parsing: no I/O, no async. A WebDataset sample is the run of
//! consecutive tar members sharing a key (the path up to the first dot of the
//! file name): `KEY.jpg` holds the image, `KEY.cls` its label. A TFRecord
//! sample is one record, a `tf.train.Example`, keyed by its record number
//! in the shard. The shard's file name says which ([`ShardFormat`]). A loose
//! object is a shard of one sample: its bytes are the image
//! ([`object_sample`]). A Parquet file is read by row group, not streamed
//! ([`parquet`]): a sample is a row.

pub mod parquet;
pub mod splitter;
pub mod tar;
pub mod tf_example;
pub mod tfrecord;

use bytes::Bytes;
use parquet::ParquetError;
use tar::TarError;
use tfrecord::{FeatureNames, TfRecordError};

/// Default limit on one tar member; larger ones are an error, which bounds the
/// parser's buffer.
pub const DEFAULT_MAX_MEMBER_BYTES: u64 = 64 << 20;
/// Bytes one extra field of a sample may hold unless the request says.
pub const DEFAULT_MAX_FIELD_BYTES: u64 = 1 << 20;
/// The most a request may allow per field: fields ride in the batch message.
pub const MAX_FIELD_BYTES: u64 = 16 << 20;
/// Extra fields a request may ask for.
pub const MAX_FIELDS: usize = 16;

/// What a stream reads of each sample beyond its image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleLayout {
    /// Extra parts returned as bytes, in this order: tar member extensions
    /// (lower case) or TFRecord feature names.
    pub fields: Vec<String>,
    /// Tar: the label is the integer at this top-level key of the `.json`
    /// member instead of the `.cls` member.
    pub label_json_key: Option<String>,
    /// TFRecord: which features hold the image, the label and the name.
    pub features: FeatureNames,
    pub max_field_bytes: u64,
    /// Parquet: the image and label columns.
    pub columns: parquet::ColumnNames,
    /// Added to every label before it is sent (TensorFlow's ImageNet
    /// records number classes from 1: -1 gives 0..999).
    pub label_offset: i64,
}

impl Default for SampleLayout {
    fn default() -> Self {
        Self {
            fields: Vec::new(),
            label_json_key: None,
            features: FeatureNames::default(),
            max_field_bytes: DEFAULT_MAX_FIELD_BYTES,
            columns: parquet::ColumnNames::default(),
            label_offset: 0,
        }
    }
}

/// What to do with a shard whose bytes cannot be parsed (truncated, garbage,
/// not matching its index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BadShardPolicy {
    /// End the stream with `DATA_LOSS` naming the shard.
    #[default]
    Fail,
    /// Substitute every sample of the shard from the damage on (from the
    /// sample being parsed when it was found: a sample is only known whole
    /// once the next one starts), and when building an index, keep the
    /// samples before it: batch counts stay equal on every rank.
    Skip,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    Jpeg,
    Png,
    Webp,
}

impl ImageFormat {
    pub fn from_extension(ext: &str) -> Option<Self> {
        match ext {
            "jpg" | "jpeg" => Some(Self::Jpeg),
            "png" => Some(Self::Png),
            "webp" => Some(Self::Webp),
            _ => None,
        }
    }

    /// The member extension a tar shard stores this format under.
    pub fn extension(self) -> &'static str {
        match self {
            Self::Jpeg => "jpg",
            Self::Png => "png",
            Self::Webp => "webp",
        }
    }

    /// The format from the data's signature (for containers that do not
    /// name it, like a TFRecord's `image/encoded`).
    pub fn sniff(data: &[u8]) -> Option<Self> {
        match data {
            [0xFF, 0xD8, 0xFF, ..] => Some(Self::Jpeg),
            [0x89, b'P', b'N', b'G', ..] => Some(Self::Png),
            [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', ..] => Some(Self::Webp),
            _ => None,
        }
    }
}

/// How a shard's bytes are laid out, from its file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardFormat {
    /// A whole object read as one byte stream through the splitter.
    Streamed(StreamedFormat),
    /// `*.parquet`: each row group a shard of the index, each row a sample,
    /// read by row group ([`parquet`]), never streamed.
    Parquet,
}

/// The formats the splitter reads as a stream of bytes: only these can be
/// asked of it, so it has no format to refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamedFormat {
    /// WebDataset: `*.tar`.
    Tar,
    /// `*.tfrecord` / `*.tfrecords`, uncompressed.
    TfRecord,
}

impl ShardFormat {
    /// `None` for objects that are not shards (they are not listed).
    pub fn from_name(name: &str) -> Option<Self> {
        if name.ends_with(".tar") {
            Some(Self::Streamed(StreamedFormat::Tar))
        } else if name.ends_with(".tfrecord") || name.ends_with(".tfrecords") {
            Some(Self::Streamed(StreamedFormat::TfRecord))
        } else if name.ends_with(".parquet") {
            Some(Self::Parquet)
        } else {
            None
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Label {
    Missing,
    Value(i64),
    /// The `.cls` member was not a decimal integer.
    Invalid(String),
}

impl Label {
    /// The label as sent to clients: -1 when missing or invalid.
    pub fn value(&self) -> i64 {
        match self {
            Label::Value(v) => *v,
            Label::Missing | Label::Invalid(_) => -1,
        }
    }

    fn parse(bytes: &[u8]) -> Self {
        let text = String::from_utf8_lossy(bytes);
        match text.trim().parse::<i64>() {
            Ok(v) => Label::Value(v),
            Err(_) => Label::Invalid(text.chars().take(40).collect()),
        }
    }

    /// The integer at top-level `key` of a JSON object.
    fn from_json(bytes: &[u8], key: &str) -> Self {
        match serde_json::from_slice::<serde_json::Value>(bytes) {
            Ok(value) => match value.get(key) {
                Some(found) => found
                    .as_i64()
                    .map_or_else(|| Label::Invalid(format!("{key}: {found}")), Label::Value),
                None => Label::Missing,
            },
            Err(e) => Label::Invalid(format!(".json member: {e}")),
        }
    }
}

/// One sample, with its compressed image bytes.
#[derive(Debug, Clone)]
pub struct RawSample {
    /// The sample's identity in its shard (the index's key): what the plan,
    /// augmentation and substitution key on.
    pub key: String,
    /// What the sample is called in `Batch.keys` when that differs from
    /// `key` (a TFRecord's key feature, e.g. `image/filename`).
    pub name: Option<String>,
    pub image: Option<(ImageFormat, Bytes)>,
    pub label: Label,
    /// Byte range of the sample in the shard: its first header to the end of
    /// its last member.
    pub start: u64,
    pub end: u64,
    /// Why the sample's bytes could not be used (a corrupt record, or the
    /// rest of a damaged shard skipped under `--on-bad-shard skip`); the
    /// sample is substituted.
    pub unreadable: Option<Unreadable>,
    /// The layout's extra fields, in its order (`None`: the sample has none).
    pub fields: Vec<Option<Bytes>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// The substitution reason (as for decode errors: a metric label).
    pub reason: &'static str,
    pub message: String,
}

impl RawSample {
    /// A placeholder for a sample of a damaged shard, keeping its place in
    /// the plan.
    pub fn unreadable(key: String, why: String) -> Self {
        Self::damaged(key, 0..0, "bad_shard", why)
    }

    /// A sample known by its place only (a frames-only index scan).
    fn framed(key: String, range: std::ops::Range<u64>) -> Self {
        Self {
            key,
            name: None,
            image: None,
            label: Label::Missing,
            start: range.start,
            end: range.end,
            unreadable: None,
            fields: Vec::new(),
        }
    }

    fn damaged(
        key: String,
        range: std::ops::Range<u64>,
        reason: &'static str,
        why: String,
    ) -> Self {
        Self {
            unreadable: Some(Unreadable {
                reason,
                message: why,
            }),
            ..Self::framed(key, range)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error(transparent)]
    Tar(#[from] TarError),
    #[error(transparent)]
    TfRecord(#[from] TfRecordError),
    #[error(transparent)]
    Parquet(#[from] ParquetError),
    /// Not damage: the request's cap is below the data.
    #[error(
        "sample {key}: field {field:?} is {bytes} bytes, over the request's max_field_bytes \
         of {max}"
    )]
    FieldTooLarge {
        key: String,
        field: String,
        bytes: u64,
        max: u64,
    },
}

/// Splits `KEY.ext` at the first dot of the file name.
pub fn split_key(name: &str) -> (&str, &str) {
    let file_start = name.rfind('/').map_or(0, |i| i + 1);
    match name[file_start..].find('.') {
        Some(dot) => (&name[..file_start + dot], &name[file_start + dot + 1..]),
        None => (name, ""),
    }
}

/// The sample of one loose object (a one-sample shard): its bytes are the
/// image, its label comes from the dataset's index. The format follows the
/// data's signature, not the key's extension, which a manifest need not have.
pub fn object_sample(
    key: String,
    range: std::ops::Range<u64>,
    label: Option<i64>,
    data: Bytes,
    fields: usize,
) -> RawSample {
    let Some(format) = ImageFormat::sniff(&data) else {
        let why = "object is not a JPEG, PNG or WebP image".to_string();
        return RawSample::damaged(key, range, "corrupt", why);
    };
    RawSample {
        key,
        name: None,
        image: Some((format, data)),
        label: label.map_or(Label::Missing, Label::Value),
        start: range.start,
        end: range.end,
        unreadable: None,
        fields: vec![None; fields],
    }
}

/// The sample of one Parquet row: substituted where its image is null or
/// not an image.
pub fn row_sample(row: parquet::Row, range: std::ops::Range<u64>) -> RawSample {
    let label = match row.label {
        parquet::RowLabel::Missing => Label::Missing,
        parquet::RowLabel::Value(value) => Label::Value(value),
        parquet::RowLabel::Invalid(why) => Label::Invalid(why),
    };
    let image = row
        .image
        .and_then(|bytes| match ImageFormat::sniff(&bytes) {
            Some(format) => Ok((format, bytes)),
            None => Err(format!(
                "row {}: its image bytes are not a JPEG, PNG or WebP image",
                row.key
            )),
        });
    let (image, unreadable) = match image {
        Ok(image) => (Some(image), None),
        Err(message) => (
            None,
            Some(Unreadable {
                reason: "corrupt",
                message,
            }),
        ),
    };
    RawSample {
        key: row.key,
        name: row.name,
        image,
        label,
        start: range.start,
        end: range.end,
        unreadable,
        fields: row.fields,
    }
}

/// A loose object larger than the member limit: never read, substituted.
pub fn oversized_object(key: String, range: std::ops::Range<u64>, max: u64) -> RawSample {
    let why = format!(
        "object is {} bytes, over the limit of {max} (--max-member-bytes)",
        range.end - range.start
    );
    RawSample::damaged(key, range, "too_large", why)
}
