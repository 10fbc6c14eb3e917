//! `tf.train.Example`, the record inside a TFRecord: reading the features
//! shardfeed uses (by walking the wire format) and writing simple ones.

use std::collections::HashMap;
use std::ops::Range;

use bytes::Bytes;

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
    /// The wanted features (and the key feature) that are a single bytes
    /// value, by name.
    pub bytes_features: HashMap<String, Bytes>,
}

/// Reads the image, the label and the `wanted` bytes features (plus the
/// key feature) of one Example record, walking its wire format rather than
/// decoding it: features nobody asked for are skipped by their length, and
/// what is kept is slices of `data`. So the memory of a record is the
/// record, whatever it holds (a full decode of a record of many small
/// values costs ~16x its size), and the time is linear in it. Errors say
/// what is wrong, for the substitution's log line.
pub fn parse_example(
    data: Bytes,
    names: &FeatureNames,
    wanted: &[String],
) -> Result<ExampleSample, String> {
    let not_example = |why: String| format!("record is not a tf.train.Example: {why}");
    let mut image = FeatureValue::Absent;
    let mut label = FeatureValue::Absent;
    let mut bytes_features: HashMap<String, FeatureValue> = HashMap::new();
    let mut example = Wire::new(&data, 0..data.len());
    while let Some((field, kind)) = example.field().map_err(not_example)? {
        if field != 1 || kind != LEN {
            example.skip(kind).map_err(not_example)?;
            continue;
        }
        // Features: a map of name -> Feature, as repeated entries.
        let mut features = Wire::new(&data, example.len_delimited().map_err(not_example)?);
        while let Some((field, kind)) = features.field().map_err(not_example)? {
            if field != 1 || kind != LEN {
                features.skip(kind).map_err(not_example)?;
                continue;
            }
            let entry = features.len_delimited().map_err(not_example)?;
            let (name, feature) = map_entry(&data, entry).map_err(not_example)?;
            let name = std::str::from_utf8(&data[name])
                .map_err(|_| not_example("a feature name is not UTF-8".into()))?;
            // A later entry of the same name replaces an earlier one.
            let slot = if name == names.image {
                &mut image
            } else if name == names.label {
                &mut label
            } else if name == names.key || wanted.iter().any(|w| w == name) {
                bytes_features
                    .entry(name.to_string())
                    .or_insert(FeatureValue::Absent)
            } else {
                continue;
            };
            *slot = read_feature(&data, feature).map_err(not_example)?;
        }
    }
    let image = match image {
        FeatureValue::Bytes { count: 1, first } => data.slice(first),
        FeatureValue::Bytes { count, .. } => {
            return Err(format!(
                "feature {:?} holds {count} values, not one image",
                names.image
            ))
        }
        FeatureValue::Absent => return Err(format!("Example has no feature {:?}", names.image)),
        _ => return Err(format!("feature {:?} is not a bytes list", names.image)),
    };
    let label = match label {
        FeatureValue::Int64 { count: 1, first } => Some(first),
        FeatureValue::Int64 { count, .. } => {
            return Err(format!(
                "feature {:?} holds {count} values, not one label",
                names.label
            ))
        }
        FeatureValue::Absent => None,
        _ => return Err(format!("feature {:?} is not an int64 list", names.label)),
    };
    let bytes_features = bytes_features
        .into_iter()
        .filter_map(|(name, value)| match value {
            FeatureValue::Bytes { count: 1, first } => Some((name, data.slice(first))),
            _ => None,
        })
        .collect();
    Ok(ExampleSample {
        image,
        label,
        bytes_features,
    })
}

/// What a feature holds: its kind, how many values, and the first.
#[derive(Debug, Clone, PartialEq)]
enum FeatureValue {
    Absent,
    Bytes { count: u64, first: Range<usize> },
    Int64 { count: u64, first: i64 },
    Float,
}

/// Protobuf wire types.
const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const I32: u8 = 5;

/// A cursor over one message's bytes, `range` of the whole record.
struct Wire<'a> {
    data: &'a [u8],
    at: usize,
    end: usize,
}

impl<'a> Wire<'a> {
    fn new(data: &'a [u8], range: Range<usize>) -> Self {
        Self {
            data,
            at: range.start,
            end: range.end,
        }
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&byte) = self.data[..self.end].get(self.at) else {
                return Err("a varint runs past its message".into());
            };
            self.at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("a varint is longer than 10 bytes".into())
    }

    /// The next field's number and wire type; `None` at the message's end.
    fn field(&mut self) -> Result<Option<(u64, u8)>, String> {
        if self.at >= self.end {
            return Ok(None);
        }
        let tag = self.varint()?;
        Ok(Some((tag >> 3, (tag & 7) as u8)))
    }

    /// The range of a length-delimited value, which the cursor passes.
    fn len_delimited(&mut self) -> Result<Range<usize>, String> {
        let len = self.varint()?;
        let start = self.at;
        if len > (self.end - start) as u64 {
            return Err("a field's length runs past its message".into());
        }
        self.at = start + len as usize;
        Ok(start..self.at)
    }

    fn advance(&mut self, bytes: usize) -> Result<(), String> {
        if bytes > self.end - self.at {
            return Err("a field runs past its message".into());
        }
        self.at += bytes;
        Ok(())
    }

    fn skip(&mut self, kind: u8) -> Result<(), String> {
        match kind {
            VARINT => self.varint().map(drop),
            I64 => self.advance(8),
            LEN => self.len_delimited().map(drop),
            I32 => self.advance(4),
            other => Err(format!(
                "wire type {other} (groups) is not used by Examples"
            )),
        }
    }
}

/// A map entry's key (the name's range) and value (the Feature's range).
fn map_entry(data: &[u8], entry: Range<usize>) -> Result<(Range<usize>, Range<usize>), String> {
    let mut wire = Wire::new(data, entry.clone());
    let (mut name, mut value) = (entry.start..entry.start, entry.start..entry.start);
    while let Some((field, kind)) = wire.field()? {
        match (field, kind) {
            (1, LEN) => name = wire.len_delimited()?,
            (2, LEN) => value = wire.len_delimited()?,
            _ => wire.skip(kind)?,
        }
    }
    Ok((name, value))
}

/// One Feature: a oneof of bytes, float and int64 lists. A list given twice
/// in one Feature is merged (values appended), as protobuf merges it.
fn read_feature(data: &[u8], feature: Range<usize>) -> Result<FeatureValue, String> {
    let mut wire = Wire::new(data, feature);
    let mut value = FeatureValue::Absent;
    while let Some((field, kind)) = wire.field()? {
        if kind != LEN || !(1..=3).contains(&field) {
            wire.skip(kind)?;
            continue;
        }
        let list = wire.len_delimited()?;
        value = match field {
            1 => bytes_list(data, list, value)?,
            2 => FeatureValue::Float,
            _ => int64_list(data, list, value)?,
        };
    }
    Ok(value)
}

fn bytes_list(
    data: &[u8],
    list: Range<usize>,
    before: FeatureValue,
) -> Result<FeatureValue, String> {
    let (mut count, mut first) = match before {
        FeatureValue::Bytes { count, first } => (count, Some(first)),
        _ => (0, None),
    };
    let mut wire = Wire::new(data, list);
    while let Some((field, kind)) = wire.field()? {
        if (field, kind) != (1, LEN) {
            wire.skip(kind)?;
            continue;
        }
        let value = wire.len_delimited()?;
        first.get_or_insert(value);
        count += 1;
    }
    Ok(FeatureValue::Bytes {
        count,
        first: first.unwrap_or(0..0),
    })
}

fn int64_list(
    data: &[u8],
    list: Range<usize>,
    before: FeatureValue,
) -> Result<FeatureValue, String> {
    let (mut count, mut first) = match before {
        FeatureValue::Int64 { count, first } => (count, Some(first)),
        _ => (0, None),
    };
    let mut wire = Wire::new(data, list);
    while let Some((field, kind)) = wire.field()? {
        match (field, kind) {
            // Packed (what writers produce) or one value per field.
            (1, LEN) => {
                let mut packed = Wire::new(data, wire.len_delimited()?);
                while packed.at < packed.end {
                    let value = packed.varint()? as i64;
                    first.get_or_insert(value);
                    count += 1;
                }
            }
            (1, VARINT) => {
                let value = wire.varint()? as i64;
                first.get_or_insert(value);
                count += 1;
            }
            _ => wire.skip(kind)?,
        }
    }
    Ok(FeatureValue::Int64 {
        count,
        first: first.unwrap_or(0),
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

/// Appends to an Example's bytes one more feature, `name`, holding `values`
/// empty bytes values: 2 bytes each on the wire, a `Bytes` handle each when
/// fully decoded (the worst case of a record's decoded size, for tests and
/// benchmarks). Appending works because protobuf merges repeated messages.
pub fn append_empty_values_feature(example: &mut Vec<u8>, name: &str, values: usize) {
    use prost::encoding::bytes::encode;
    let mut list = Vec::with_capacity(2 * values);
    for _ in 0..values {
        encode(1, &Bytes::new(), &mut list);
    }
    let mut feature = Vec::new();
    encode(1, &Bytes::from(list), &mut feature);
    let mut entry = Vec::new();
    encode(1, &Bytes::copy_from_slice(name.as_bytes()), &mut entry);
    encode(2, &Bytes::from(feature), &mut entry);
    let mut features = Vec::new();
    encode(1, &Bytes::from(entry), &mut features);
    encode(1, &Bytes::from(features), example);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The walker reads what a full protobuf decode reads, for Examples
    /// written every way protobuf allows: repeated entries of one name
    /// (the last wins), a list given twice in one Feature (merged), kinds
    /// replaced, unpacked int64s, unknown fields of every wire type.
    #[test]
    fn the_wire_walk_agrees_with_a_full_decode() {
        use prost::Message;
        fn tag(out: &mut Vec<u8>, field: u64, kind: u64) {
            prost::encoding::encode_varint(field << 3 | kind, out);
        }
        fn len(out: &mut Vec<u8>, field: u64, body: &[u8]) {
            tag(out, field, 2);
            prost::encoding::encode_varint(body.len() as u64, out);
            out.extend_from_slice(body);
        }
        fn entry(name: &str, feature: &[u8]) -> Vec<u8> {
            let mut out = Vec::new();
            len(&mut out, 1, name.as_bytes());
            len(&mut out, 2, feature);
            out
        }
        fn bytes_list(values: &[&[u8]]) -> Vec<u8> {
            let mut list = Vec::new();
            for value in values {
                len(&mut list, 1, value);
            }
            let mut feature = Vec::new();
            len(&mut feature, 1, &list);
            feature
        }
        let mut unpacked = Vec::new();
        for value in [7u64, 9] {
            tag(&mut unpacked, 1, 0);
            prost::encoding::encode_varint(value, &mut unpacked);
        }
        let mut unpacked_feature = Vec::new();
        len(&mut unpacked_feature, 3, &unpacked);
        let mut one_label = Vec::new();
        tag(&mut one_label, 1, 0);
        prost::encoding::encode_varint(5, &mut one_label);
        let mut label_feature = Vec::new();
        len(&mut label_feature, 3, &one_label);
        let mut floats = Vec::new();
        len(&mut floats, 1, &1.5f32.to_le_bytes());
        let mut float_feature = Vec::new();
        len(&mut float_feature, 2, &floats);
        let mut twice = bytes_list(&[b"a"]);
        twice.extend(bytes_list(&[b"b"]));

        type Entries<'a> = Vec<(&'a str, Vec<u8>)>;
        let cases: Vec<(&str, Entries)> = vec![
            (
                "plain",
                vec![
                    ("image/encoded", bytes_list(&[b"jpeg"])),
                    ("image/class/label", label_feature.clone()),
                ],
            ),
            (
                "last entry wins",
                vec![
                    ("image/encoded", bytes_list(&[b"old"])),
                    ("image/encoded", bytes_list(&[b"new"])),
                ],
            ),
            ("lists merge", vec![("image/encoded", twice.clone())]),
            (
                "kind replaced",
                vec![(
                    "image/encoded",
                    [bytes_list(&[b"x"]), float_feature.clone()].concat(),
                )],
            ),
            (
                "unpacked",
                vec![
                    ("image/encoded", bytes_list(&[b"i"])),
                    ("image/class/label", unpacked_feature.clone()),
                ],
            ),
            (
                "float label",
                vec![
                    ("image/encoded", bytes_list(&[b"i"])),
                    ("image/class/label", float_feature.clone()),
                ],
            ),
            (
                "caption",
                vec![
                    ("image/encoded", bytes_list(&[b"i"])),
                    ("caption", bytes_list(&[b"a cat"])),
                    ("other", bytes_list(&[b"x".as_slice(); 1000])),
                ],
            ),
        ];
        for (case, entries) in cases {
            let mut features = Vec::new();
            for (name, feature) in &entries {
                len(&mut features, 1, &entry(name, feature));
            }
            // Unknown fields of every wire type around the features.
            tag(&mut features, 9, 0);
            features.push(1);
            tag(&mut features, 9, 5);
            features.extend_from_slice(&[0; 4]);
            let mut record = Vec::new();
            tag(&mut record, 7, 1);
            record.extend_from_slice(&[0; 8]);
            len(&mut record, 1, &features);

            let walked = parse_example(
                Bytes::from(record.clone()),
                &FeatureNames::default(),
                &["caption".to_string()],
            );
            let decoded = example::Example::decode(record.as_slice()).unwrap();
            let mut map = decoded.features.unwrap().feature;
            let expected_image = match map.remove("image/encoded").and_then(|f| f.kind) {
                Some(example::Kind::BytesList(list)) if list.value.len() == 1 => {
                    Some(list.value[0].clone())
                }
                _ => None,
            };
            let expected_label = match map.remove("image/class/label").and_then(|f| f.kind) {
                Some(example::Kind::Int64List(list)) if list.value.len() == 1 => {
                    Ok(Some(list.value[0]))
                }
                None => Ok(None),
                _ => Err(()),
            };
            match (&walked, expected_image, expected_label) {
                (Ok(sample), Some(image), Ok(label)) => {
                    assert_eq!(sample.image, image, "{case}");
                    assert_eq!(sample.label, label, "{case}");
                    let caption = map.remove("caption").map(|_| Bytes::from_static(b"a cat"));
                    assert_eq!(
                        sample.bytes_features.get("caption").cloned(),
                        caption,
                        "{case}"
                    );
                    assert!(
                        !sample.bytes_features.contains_key("other"),
                        "{case}: not wanted"
                    );
                }
                (Err(_), None, _) | (Err(_), _, Err(())) => {}
                (walked, image, label) => {
                    panic!("{case}: walked {walked:?}, decoded {image:?} {label:?}")
                }
            }
        }
    }

    #[test]
    fn a_record_of_many_tiny_values_keeps_nothing_but_slices_of_itself() {
        // 500,000 empty bytes values: 1 MB on the wire, 16 MB decoded.
        let mut data = example_bytes(b"\xff\xd8jpeg", Some(3), &[("caption", b"a cat")]);
        append_empty_values_feature(&mut data, "noise", 500_000);
        let data = Bytes::from(data);
        let wanted = ["caption".to_string(), "noise".to_string()];
        let sample = parse_example(data.clone(), &FeatureNames::default(), &wanted).unwrap();
        assert_eq!(&sample.image[..], b"\xff\xd8jpeg");
        assert_eq!(sample.label, Some(3));
        let inside = |bytes: &Bytes| data.as_ptr_range().contains(&bytes.as_ptr());
        assert!(inside(&sample.image), "the image is a slice of the record");
        assert!(inside(&sample.bytes_features["caption"]));
        // Many values are not one field value: left out, not materialised.
        assert!(!sample.bytes_features.contains_key("noise"));
    }

    #[test]
    fn examples_give_image_label_and_single_bytes_features() {
        let data = example_bytes(b"\xff\xd8jpeg", Some(42), &[("caption", b"a cat")]);
        let wanted = ["caption".to_string()];
        let sample = parse_example(Bytes::from(data), &FeatureNames::default(), &wanted).unwrap();
        assert_eq!(&sample.image[..], b"\xff\xd8jpeg");
        assert_eq!(sample.label, Some(42));
        assert_eq!(&sample.bytes_features["caption"][..], b"a cat");

        let unlabeled = example_bytes(b"img", None, &[]);
        let sample = parse_example(Bytes::from(unlabeled), &FeatureNames::default(), &[]).unwrap();
        assert_eq!(sample.label, None);

        let renamed = FeatureNames {
            image: "jpeg".into(),
            label: "y".into(),
            ..FeatureNames::default()
        };
        let error = parse_example(
            Bytes::from(example_bytes(b"img", Some(1), &[])),
            &renamed,
            &[],
        )
        .unwrap_err();
        assert!(error.contains("\"jpeg\""), "{error}");
        let error = parse_example(
            Bytes::from_static(b"\xff\xff\xff"),
            &FeatureNames::default(),
            &[],
        )
        .unwrap_err();
        assert!(error.contains("not a tf.train.Example"), "{error}");
    }
}
