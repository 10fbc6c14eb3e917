//! TFRecord shards (uncompressed; gzip/zlib-compressed files are not read):
//! a sequence of records, each framed as
//!
//! ```text
//! length: u64 LE | masked CRC32C of length: u32 LE | data | masked CRC32C of data: u32 LE
//! ```
//!
//! and each record's data a `tf.train.Example` protobuf. A record whose data
//! checksum fails, or whose Example is malformed, is one corrupt sample (it
//! is substituted like a corrupt image); a length whose checksum fails leaves
//! no way to find the next record, so it is a shard error.

use std::collections::HashMap;
use std::ops::Range;

use bytes::Bytes;

/// Bytes of a record's framing: length, its CRC, and the data's CRC.
pub const FRAME_BYTES: u64 = 8 + 4 + 4;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TfRecordError {
    #[error(
        "TFRecord length checksum mismatch at byte {offset}: the shard is damaged \
         (or gzip-compressed, which shardfeed does not read) from here on"
    )]
    LengthChecksum { offset: u64 },
    #[error("TFRecord record at byte {offset} is {length} bytes, over the limit of {max}")]
    TooLarge { offset: u64, length: u64, max: u64 },
    #[error("TFRecord shard ends inside the record starting at byte {offset}")]
    Truncated { offset: u64 },
}

/// TFRecord's checksum: CRC32C, rotated and offset so that a CRC of data
/// holding CRCs is not degenerate.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32;
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One step of [`RecordParser::parse`].
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// The input holds no whole record yet; at least this many bytes more
    /// are needed.
    NeedMore(usize),
    /// A whole record: `data` indexes the input; `start..end` is the record
    /// in the shard, framing included.
    Record {
        data: Range<usize>,
        start: u64,
        end: u64,
        /// Whether the data matches its checksum.
        data_ok: bool,
        consumed: usize,
    },
}

/// Streams records out of bytes pushed in arbitrary chunks; the caller
/// keeps the unconsumed bytes and passes them again with more appended.
#[derive(Debug)]
pub struct RecordParser {
    /// Shard offset of the first byte of the next input.
    offset: u64,
    max_record: u64,
}

impl RecordParser {
    /// `offset` is the shard offset of the first byte passed (a record
    /// boundary); records over `max_record` bytes are an error, which bounds
    /// the caller's buffer.
    pub fn new(offset: u64, max_record: u64) -> Self {
        Self { offset, max_record }
    }

    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn parse(&mut self, input: &[u8]) -> Result<Parsed, TfRecordError> {
        if input.len() < 12 {
            return Ok(Parsed::NeedMore(12 - input.len()));
        }
        let length_bytes: [u8; 8] = input[..8].try_into().expect("8 bytes");
        let length_crc = u32::from_le_bytes(input[8..12].try_into().expect("4 bytes"));
        if masked_crc32c(&length_bytes) != length_crc {
            return Err(TfRecordError::LengthChecksum {
                offset: self.offset,
            });
        }
        let length = u64::from_le_bytes(length_bytes);
        if length > self.max_record {
            return Err(TfRecordError::TooLarge {
                offset: self.offset,
                length,
                max: self.max_record,
            });
        }
        let total = (FRAME_BYTES + length) as usize;
        if input.len() < total {
            return Ok(Parsed::NeedMore(total - input.len()));
        }
        let data = 12..12 + length as usize;
        let data_crc = u32::from_le_bytes(input[data.end..total].try_into().expect("4 bytes"));
        let data_ok = masked_crc32c(&input[data.clone()]) == data_crc;
        let start = self.offset;
        self.offset += total as u64;
        Ok(Parsed::Record {
            data,
            start,
            end: self.offset,
            data_ok,
            consumed: total,
        })
    }

    /// Call when the input has ended with `left` bytes unconsumed.
    pub fn finish(&self, left: usize) -> Result<(), TfRecordError> {
        if left == 0 {
            Ok(())
        } else {
            Err(TfRecordError::Truncated {
                offset: self.offset,
            })
        }
    }
}

/// Frames `data` as one TFRecord (for `pack`, tests and benchmarks).
pub fn write_record(out: &mut Vec<u8>, data: &[u8]) {
    let length = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&length);
    out.extend_from_slice(&masked_crc32c(&length).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
}

/// `tf.train.Example`, the fields shardfeed reads (TensorFlow's
/// `example.proto` and `feature.proto`, field numbers unchanged).
pub mod example {
    use std::collections::HashMap;

    use bytes::Bytes;

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Example {
        #[prost(message, optional, tag = "1")]
        pub features: Option<Features>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Features {
        #[prost(map = "string, message", tag = "1")]
        pub feature: HashMap<String, Feature>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Feature {
        #[prost(oneof = "Kind", tags = "1, 2, 3")]
        pub kind: Option<Kind>,
    }

    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(message, tag = "1")]
        BytesList(BytesList),
        #[prost(message, tag = "2")]
        FloatList(FloatList),
        #[prost(message, tag = "3")]
        Int64List(Int64List),
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct BytesList {
        #[prost(bytes = "bytes", repeated, tag = "1")]
        pub value: Vec<Bytes>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FloatList {
        #[prost(float, repeated, tag = "1")]
        pub value: Vec<f32>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Int64List {
        #[prost(int64, repeated, tag = "1")]
        pub value: Vec<i64>,
    }
}

/// Which features of an Example hold the image and the label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureNames {
    pub image: String,
    pub label: String,
    /// The bytes feature that names the sample (`Batch.keys`).
    pub key: String,
}

impl Default for FeatureNames {
    /// The names of TensorFlow's ImageNet conversion scripts.
    fn default() -> Self {
        Self {
            image: "image/encoded".into(),
            label: "image/class/label".into(),
            key: "image/filename".into(),
        }
    }
}

/// What one Example holds for shardfeed.
#[derive(Debug, Clone, PartialEq)]
pub struct ExampleSample {
    pub image: Bytes,
    /// `None` when the Example has no label feature.
    pub label: Option<i64>,
    /// Every other feature that is a single bytes value, by name (for the
    /// extra fields a request may ask for).
    pub bytes_features: HashMap<String, Bytes>,
}

/// Reads the image and label of one Example record. Errors say what is
/// wrong, for the substitution's log line.
pub fn parse_example(data: Bytes, names: &FeatureNames) -> Result<ExampleSample, String> {
    use example::Kind;
    use prost::Message;

    let parsed = example::Example::decode(data)
        .map_err(|e| format!("record is not a tf.train.Example: {e}"))?;
    let mut features = parsed.features.map(|f| f.feature).unwrap_or_default();
    let image = match features.remove(&names.image).and_then(|f| f.kind) {
        Some(Kind::BytesList(list)) if list.value.len() == 1 => {
            list.value.into_iter().next().expect("one value")
        }
        Some(Kind::BytesList(list)) => {
            return Err(format!(
                "feature {:?} holds {} values, not one image",
                names.image,
                list.value.len()
            ))
        }
        Some(_) => return Err(format!("feature {:?} is not a bytes list", names.image)),
        None => return Err(format!("Example has no feature {:?}", names.image)),
    };
    let label = match features.remove(&names.label).and_then(|f| f.kind) {
        Some(Kind::Int64List(list)) if list.value.len() == 1 => Some(list.value[0]),
        Some(Kind::Int64List(list)) => {
            return Err(format!(
                "feature {:?} holds {} values, not one label",
                names.label,
                list.value.len()
            ))
        }
        Some(_) => return Err(format!("feature {:?} is not an int64 list", names.label)),
        None => None,
    };
    let bytes_features = features
        .into_iter()
        .filter_map(|(name, feature)| match feature.kind {
            Some(Kind::BytesList(list)) if list.value.len() == 1 => {
                Some((name, list.value.into_iter().next().expect("one value")))
            }
            _ => None,
        })
        .collect();
    Ok(ExampleSample {
        image,
        label,
        bytes_features,
    })
}

/// An Example with the default feature names: `image`, an optional label,
/// and extra single-value bytes features (for tests, benchmarks and tools
/// that write TFRecords).
pub fn example_bytes(image: &[u8], label: Option<i64>, extra: &[(&str, &[u8])]) -> Vec<u8> {
    use example::{BytesList, Example, Feature, Features, Int64List, Kind};
    use prost::Message;

    let mut feature = HashMap::new();
    feature.insert(
        FeatureNames::default().image,
        Feature {
            kind: Some(Kind::BytesList(BytesList {
                value: vec![Bytes::copy_from_slice(image)],
            })),
        },
    );
    if let Some(label) = label {
        feature.insert(
            FeatureNames::default().label,
            Feature {
                kind: Some(Kind::Int64List(Int64List { value: vec![label] })),
            },
        );
    }
    for (name, value) in extra {
        feature.insert(
            name.to_string(),
            Feature {
                kind: Some(Kind::BytesList(BytesList {
                    value: vec![Bytes::copy_from_slice(value)],
                })),
            },
        );
    }
    Example {
        features: Some(Features { feature }),
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_is_crc32c_under_tensorflows_mask() {
        // CRC32C("123456789") = 0xE3069283 (the standard check value), masked.
        let crc: u32 = 0xE306_9283;
        assert_eq!(
            masked_crc32c(b"123456789"),
            crc.rotate_right(15).wrapping_add(0xa282_ead8)
        );
    }

    #[test]
    fn records_round_trip_through_any_chunking() {
        let mut shard = Vec::new();
        let payloads: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 1 + 37 * i as usize]).collect();
        for payload in &payloads {
            write_record(&mut shard, payload);
        }
        for chunk in [1, 7, 16, 1000] {
            let mut parser = RecordParser::new(0, 1 << 20);
            let mut buffer = Vec::new();
            let mut got = Vec::new();
            for piece in shard.chunks(chunk) {
                buffer.extend_from_slice(piece);
                while let Parsed::Record {
                    data,
                    data_ok,
                    consumed,
                    start,
                    end,
                } = parser.parse(&buffer).unwrap()
                {
                    assert!(data_ok);
                    assert_eq!(end - start, consumed as u64);
                    got.push(buffer[data].to_vec());
                    buffer.drain(..consumed);
                }
            }
            parser.finish(buffer.len()).unwrap();
            assert_eq!(got, payloads, "chunk {chunk}");
        }
    }

    #[test]
    fn a_bad_data_checksum_is_one_bad_record_and_parsing_goes_on() {
        let mut shard = Vec::new();
        write_record(&mut shard, b"first");
        write_record(&mut shard, b"second");
        shard[12] ^= 1; // a bit of the first record's data
        let mut parser = RecordParser::new(0, 1 << 20);
        let Parsed::Record {
            data_ok, consumed, ..
        } = parser.parse(&shard).unwrap()
        else {
            panic!("a record")
        };
        assert!(!data_ok);
        let Parsed::Record { data, data_ok, .. } = parser.parse(&shard[consumed..]).unwrap() else {
            panic!("a record")
        };
        assert!(data_ok);
        assert_eq!(&shard[consumed..][data], b"second");
    }

    #[test]
    fn a_bad_length_checksum_is_a_shard_error_naming_the_offset() {
        let mut shard = Vec::new();
        write_record(&mut shard, b"first");
        let second = shard.len();
        write_record(&mut shard, b"second");
        shard[second + 3] ^= 1; // the second record's length
        let mut parser = RecordParser::new(0, 1 << 20);
        let Parsed::Record { consumed, .. } = parser.parse(&shard).unwrap() else {
            panic!("a record")
        };
        let error = parser.parse(&shard[consumed..]).unwrap_err();
        assert_eq!(
            error,
            TfRecordError::LengthChecksum {
                offset: second as u64
            }
        );
        assert!(error.to_string().contains("gzip"));
    }

    #[test]
    fn oversized_and_truncated_records_are_errors() {
        let mut shard = Vec::new();
        write_record(&mut shard, &[7; 100]);
        let mut parser = RecordParser::new(0, 99);
        assert!(matches!(
            parser.parse(&shard),
            Err(TfRecordError::TooLarge { length: 100, .. })
        ));
        let mut parser = RecordParser::new(0, 1 << 20);
        assert_eq!(parser.parse(&shard[..50]).unwrap(), Parsed::NeedMore(66));
        assert_eq!(
            parser.finish(50),
            Err(TfRecordError::Truncated { offset: 0 })
        );
    }

    #[test]
    fn examples_give_image_label_and_single_bytes_features() {
        let data = example_bytes(b"\xff\xd8jpeg", Some(42), &[("caption", b"a cat")]);
        let sample = parse_example(Bytes::from(data), &FeatureNames::default()).unwrap();
        assert_eq!(&sample.image[..], b"\xff\xd8jpeg");
        assert_eq!(sample.label, Some(42));
        assert_eq!(&sample.bytes_features["caption"][..], b"a cat");

        let unlabeled = example_bytes(b"img", None, &[]);
        let sample = parse_example(Bytes::from(unlabeled), &FeatureNames::default()).unwrap();
        assert_eq!(sample.label, None);

        let renamed = FeatureNames {
            image: "jpeg".into(),
            label: "y".into(),
            ..FeatureNames::default()
        };
        let error =
            parse_example(Bytes::from(example_bytes(b"img", Some(1), &[])), &renamed).unwrap_err();
        assert!(error.contains("\"jpeg\""), "{error}");
        let error = parse_example(
            Bytes::from_static(b"\xff\xff\xff"),
            &FeatureNames::default(),
        )
        .unwrap_err();
        assert!(error.contains("not a tf.train.Example"), "{error}");
    }
}
