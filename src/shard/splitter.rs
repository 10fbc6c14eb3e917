//! Splitting a shard's bytes, pushed in arbitrary chunks, into samples:
//! tar members grouped by key, TFRecord records read as Examples (or, for
//! index scans, only framed).

use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};

use super::tar::{Parsed, TarError, TarParser};
use super::tfrecord::{self, RecordParser, TfRecordError};
use super::{split_key, ImageFormat, Label, RawSample, SampleLayout, ShardError, StreamedFormat};

/// Streams samples out of shard bytes pushed in arbitrary chunks.
#[derive(Debug)]
pub struct SampleSplitter {
    framing: Framing,
    layout: Arc<SampleLayout>,
    buf: BytesMut,
    ended: bool,
}

// One per splitter, never in a collection: boxing the tar variant's sample
// would cost an allocation per sample to save bytes nobody counts.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Framing {
    Tar {
        parser: TarParser,
        /// The sample whose members are being gathered.
        current: Option<RawSample>,
    },
    TfRecord {
        parser: RecordParser,
        /// The next record's number in the shard (its key).
        next_record: u64,
        /// Only where records are, not what they hold (see
        /// [`SampleSplitter::frames_only`]).
        frames_only: bool,
        /// Bytes of the current record still to drop as they are pushed,
        /// and where it started (frames only).
        skip: u64,
        record_start: u64,
    },
}

impl SampleSplitter {
    /// A tar splitter; `offset` is the shard offset of the first byte pushed
    /// (a header boundary).
    pub fn new(offset: u64, max_member: u64) -> Self {
        Self::for_format(
            StreamedFormat::Tar,
            offset,
            0,
            max_member,
            Arc::new(SampleLayout::default()),
        )
    }

    /// A splitter for a shard of `format` whose bytes are pushed from
    /// `offset`, the start of sample number `first_sample` of the shard,
    /// reading what `layout` asks of each sample.
    pub fn for_format(
        format: StreamedFormat,
        offset: u64,
        first_sample: u64,
        max_member: u64,
        layout: Arc<SampleLayout>,
    ) -> Self {
        let framing = match format {
            StreamedFormat::Tar => Framing::Tar {
                parser: TarParser::new(offset, max_member),
                current: None,
            },
            StreamedFormat::TfRecord => Framing::TfRecord {
                parser: RecordParser::new(offset, max_member),
                next_record: first_sample,
                frames_only: false,
                skip: 0,
                record_start: offset,
            },
        };
        Self {
            framing,
            layout,
            buf: BytesMut::new(),
            ended: false,
        }
    }

    /// For index scans, which keep keys and ranges: TFRecord samples are
    /// found from their headers alone, and their data is dropped as it
    /// arrives, so a scan holds at most a pushed chunk whatever a record's
    /// size and parses no Example. (Tar samples are found as before.)
    pub fn frames_only(mut self) -> Self {
        if let Framing::TfRecord { frames_only, .. } = &mut self.framing {
            *frames_only = true;
        }
        self
    }

    pub fn push(&mut self, mut chunk: &[u8]) {
        if self.ended {
            return;
        }
        if let Framing::TfRecord { skip, .. } = &mut self.framing {
            let dropped = (*skip).min(chunk.len() as u64);
            *skip -= dropped;
            chunk = &chunk[dropped as usize..];
        }
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete sample, if the bytes pushed so far hold one.
    pub fn next_sample(&mut self) -> Result<Option<RawSample>, ShardError> {
        match &mut self.framing {
            Framing::Tar { parser, current } => {
                while !self.ended {
                    match parser.parse(&self.buf)? {
                        Parsed::NeedMore(_) => return Ok(None),
                        Parsed::End => {
                            self.ended = true;
                            self.buf.clear();
                        }
                        Parsed::Skip { consumed } => self.buf.advance(consumed),
                        Parsed::Member { member, consumed } => {
                            // A copy the size of the member: a sample held in a
                            // shuffle buffer must not keep the whole parse buffer
                            // (megabytes of other samples) alive, and the buffer's
                            // space is reused once nothing else points into it.
                            let data = Bytes::copy_from_slice(&self.buf[member.data.clone()]);
                            self.buf.advance(consumed);
                            if let Some(done) = add_member(
                                current,
                                &self.layout,
                                &member.name,
                                data,
                                member.header_offset,
                                member.end_offset,
                            )? {
                                return Ok(Some(done));
                            }
                        }
                    }
                }
                Ok(current.take())
            }
            Framing::TfRecord {
                parser,
                next_record,
                frames_only: true,
                skip,
                record_start,
            } => {
                if *skip > 0 {
                    return Ok(None);
                }
                let Some((start, end)) = parser.parse_frame(&self.buf)? else {
                    return Ok(None);
                };
                let dropped = (end - start).min(self.buf.len() as u64);
                self.buf.advance(dropped as usize);
                *skip = end - start - dropped;
                *record_start = start;
                let key = format!("{:08}", *next_record);
                *next_record += 1;
                Ok(Some(RawSample::framed(key, start..end)))
            }
            Framing::TfRecord {
                parser,
                next_record,
                ..
            } => match parser.parse(&self.buf)? {
                tfrecord::Parsed::NeedMore(_) => Ok(None),
                tfrecord::Parsed::Record {
                    data,
                    start,
                    end,
                    data_ok,
                    consumed,
                } => {
                    // As for tar members: the record's own copy.
                    let record = Bytes::copy_from_slice(&self.buf[data]);
                    self.buf.advance(consumed);
                    let key = format!("{:08}", *next_record);
                    *next_record += 1;
                    example_sample(key, start..end, data_ok, record, &self.layout).map(Some)
                }
            },
        }
    }

    /// Call once all bytes are pushed: returns the last sample, or an error if
    /// the input stopped inside an entry.
    pub fn finish(&mut self) -> Result<Option<RawSample>, ShardError> {
        if let Some(sample) = self.next_sample()? {
            // A sample completed by the last bytes; the caller calls again.
            return Ok(Some(sample));
        }
        match &mut self.framing {
            Framing::Tar { parser, current } => {
                if !self.ended && !self.buf.is_empty() {
                    return Err(TarError::Truncated {
                        offset: parser.offset(),
                    }
                    .into());
                }
                self.ended = true;
                Ok(current.take())
            }
            Framing::TfRecord {
                skip, record_start, ..
            } if *skip > 0 => Err(TfRecordError::Truncated {
                offset: *record_start,
            }
            .into()),
            Framing::TfRecord { parser, .. } => {
                parser.finish(self.buf.len())?;
                self.ended = true;
                Ok(None)
            }
        }
    }
}

/// Adds a tar member to the sample being gathered; returns the previous
/// sample once a member of the next one arrives.
fn add_member(
    current: &mut Option<RawSample>,
    layout: &SampleLayout,
    name: &str,
    data: Bytes,
    start: u64,
    end: u64,
) -> Result<Option<RawSample>, ShardError> {
    let (key, ext) = split_key(name);
    let finished = match current {
        Some(sample) if sample.key != key => current.take(),
        _ => None,
    };
    let sample = current.get_or_insert_with(|| RawSample {
        key: key.to_string(),
        name: None,
        image: None,
        label: Label::Missing,
        start,
        end,
        unreadable: None,
        fields: vec![None; layout.fields.len()],
    });
    sample.end = end;
    let ext = ext.to_ascii_lowercase();
    // Extensions compare as the image ones do, without regard to case.
    if let Some(field) = layout
        .fields
        .iter()
        .position(|f| f.eq_ignore_ascii_case(&ext))
    {
        check_field_size(&sample.key, &ext, &data, layout)?;
        sample.fields[field] = Some(data.clone());
    }
    match &layout.label_json_key {
        None if ext == "cls" => sample.label = Label::parse(&data),
        Some(json_key) if ext == "json" => sample.label = Label::from_json(&data, json_key),
        _ => {}
    }
    if let Some(format) = ImageFormat::from_extension(&ext) {
        if sample.image.is_none() {
            sample.image = Some((format, data));
        }
    }
    Ok(finished)
}

fn check_field_size(
    key: &str,
    field: &str,
    data: &[u8],
    layout: &SampleLayout,
) -> Result<(), ShardError> {
    if data.len() as u64 > layout.max_field_bytes {
        return Err(ShardError::FieldTooLarge {
            key: key.to_string(),
            field: field.to_string(),
            bytes: data.len() as u64,
            max: layout.max_field_bytes,
        });
    }
    Ok(())
}

/// The sample of one TFRecord record: a record that fails its checksum or
/// is not a usable Example is a corrupt sample, substituted downstream.
fn example_sample(
    key: String,
    range: std::ops::Range<u64>,
    data_ok: bool,
    record: Bytes,
    layout: &SampleLayout,
) -> Result<RawSample, ShardError> {
    let names = &layout.features;
    if !data_ok {
        let why = "record fails its CRC32C".to_string();
        return Ok(RawSample::damaged(key, range, "corrupt", why));
    }
    let mut example = match tfrecord::parse_example(record, names, &layout.fields) {
        Ok(example) => example,
        Err(why) => return Ok(RawSample::damaged(key, range, "corrupt", why)),
    };
    let Some(format) = ImageFormat::sniff(&example.image) else {
        let why = format!("feature {:?} is not a JPEG, PNG or WebP image", names.image);
        return Ok(RawSample::damaged(key, range, "corrupt", why));
    };
    let mut fields = Vec::with_capacity(layout.fields.len());
    for name in &layout.fields {
        let value = example.bytes_features.remove(name);
        if let Some(value) = &value {
            check_field_size(&key, name, value, layout)?;
        }
        fields.push(value);
    }
    let name = example
        .bytes_features
        .get(&names.key)
        .and_then(|value| std::str::from_utf8(value).ok())
        .filter(|name| !name.is_empty())
        .map(str::to_string);
    Ok(RawSample {
        key,
        name,
        image: Some((format, example.image)),
        label: example.label.map_or(Label::Missing, Label::Value),
        start: range.start,
        end: range.end,
        unreadable: None,
        fields,
    })
}

#[cfg(test)]
mod tests {
    use super::super::tar::TarWriter;
    use super::super::DEFAULT_MAX_MEMBER_BYTES;
    use super::*;
    use crate::shard::ShardFormat;

    fn collect(bytes: &[u8], chunk: usize) -> Vec<RawSample> {
        let mut splitter = SampleSplitter::new(0, DEFAULT_MAX_MEMBER_BYTES);
        let mut out = Vec::new();
        for piece in bytes.chunks(chunk) {
            splitter.push(piece);
            while let Some(sample) = splitter.next_sample().unwrap() {
                out.push(sample);
            }
        }
        while let Some(sample) = splitter.finish().unwrap() {
            out.push(sample);
        }
        out
    }

    #[test]
    fn groups_members_by_key_whatever_the_chunking() {
        let mut writer = TarWriter::new();
        writer.append("train/0001.jpg", b"img1");
        writer.append("train/0001.cls", b"3\n");
        writer.append("train/0001.json", b"{}");
        writer.append("train/0002.cls", b"4");
        writer.append("train/0002.PNG", b"img2");
        writer.append("train/0003.cls", b"x");
        let bytes = writer.finish();
        for chunk in [1, 7, 512, 1000, bytes.len()] {
            let samples = collect(&bytes, chunk);
            assert_eq!(samples.len(), 3, "chunk {chunk}");
            assert_eq!(samples[0].key, "train/0001");
            assert_eq!(samples[0].label, Label::Value(3));
            assert_eq!(samples[0].image.as_ref().unwrap().1.as_ref(), b"img1");
            assert_eq!(samples[1].image.as_ref().unwrap().0, ImageFormat::Png);
            assert_eq!(samples[1].label.value(), 4);
            assert!(samples[2].image.is_none());
            assert!(matches!(samples[2].label, Label::Invalid(_)));
            assert_eq!(samples[0].start, 0);
            assert_eq!(samples[0].end, samples[1].start);
            assert_eq!(samples[1].end, samples[2].start);
        }
    }

    #[test]
    fn a_cut_stream_is_an_error_not_a_short_sample() {
        let mut writer = TarWriter::new();
        writer.append("a.jpg", &[1u8; 2000]);
        let bytes = writer.finish();
        let mut splitter = SampleSplitter::new(0, DEFAULT_MAX_MEMBER_BYTES);
        splitter.push(&bytes[..1200]);
        assert!(splitter.next_sample().unwrap().is_none());
        assert!(splitter.finish().is_err());
    }

    #[test]
    fn frames_only_scans_find_every_record_and_hold_no_more_than_a_chunk() {
        use tfrecord::{example_bytes, write_record};
        let mut shard = Vec::new();
        for (i, size) in [10usize, 300_000, 0, 5000].into_iter().enumerate() {
            write_record(
                &mut shard,
                &example_bytes(&vec![i as u8; size], Some(i as i64), &[]),
            );
        }
        let full: Vec<_> = {
            let mut splitter = tfrecord_splitter(0, 0);
            splitter.push(&shard);
            std::iter::from_fn(|| splitter.next_sample().unwrap()).collect()
        };
        assert_eq!(full.len(), 4);
        for chunk in [1, 13, 4096, shard.len()] {
            let mut splitter = tfrecord_splitter(0, 0).frames_only();
            let mut found = Vec::new();
            let mut held = 0;
            for piece in shard.chunks(chunk) {
                splitter.push(piece);
                held = held.max(splitter.buf.len());
                while let Some(sample) = splitter.next_sample().unwrap() {
                    found.push(sample);
                }
            }
            while let Some(sample) = splitter.finish().unwrap() {
                found.push(sample);
            }
            let places = |samples: &[RawSample]| -> Vec<_> {
                samples
                    .iter()
                    .map(|s| (s.key.clone(), s.start, s.end))
                    .collect()
            };
            assert_eq!(places(&found), places(&full), "chunk {chunk}");
            assert!(held <= chunk.max(12) + 12, "chunk {chunk}: held {held}");
        }
        // Cut inside the large record: an error naming where it starts.
        let mut splitter = tfrecord_splitter(0, 0).frames_only();
        splitter.push(&shard[..100_000]);
        while splitter.next_sample().unwrap().is_some() {}
        let error = splitter.finish().unwrap_err();
        assert_eq!(
            error,
            ShardError::TfRecord(TfRecordError::Truncated {
                offset: full[1].start
            })
        );
    }

    fn tfrecord_splitter(offset: u64, first_sample: u64) -> SampleSplitter {
        let layout = Arc::new(SampleLayout::default());
        SampleSplitter::for_format(
            StreamedFormat::TfRecord,
            offset,
            first_sample,
            DEFAULT_MAX_MEMBER_BYTES,
            layout,
        )
    }

    #[test]
    fn tfrecord_samples_are_records_keyed_by_their_number() {
        use tfrecord::{example_bytes, write_record};
        let jpeg = [0xFF, 0xD8, 0xFF, 0xE0, 1, 2];
        let mut shard = Vec::new();
        write_record(&mut shard, &example_bytes(&jpeg, Some(7), &[]));
        let second = shard.len() as u64;
        write_record(&mut shard, &example_bytes(b"\x89PNG....", None, &[]));
        write_record(&mut shard, &example_bytes(b"GIF89a", Some(1), &[]));
        write_record(&mut shard, b"not an example \xff\xff");
        let bad_crc = shard.len();
        write_record(&mut shard, &example_bytes(&jpeg, Some(2), &[]));
        shard[bad_crc + 14] ^= 0x10; // inside the last record's data
        for chunk in [1, 9, shard.len()] {
            let mut splitter = tfrecord_splitter(0, 0);
            let mut samples = Vec::new();
            for piece in shard.chunks(chunk) {
                splitter.push(piece);
                while let Some(sample) = splitter.next_sample().unwrap() {
                    samples.push(sample);
                }
            }
            while let Some(sample) = splitter.finish().unwrap() {
                samples.push(sample);
            }
            let keys: Vec<&str> = samples.iter().map(|s| s.key.as_str()).collect();
            assert_eq!(
                keys,
                ["00000000", "00000001", "00000002", "00000003", "00000004"]
            );
            assert_eq!(
                samples[0].image.as_ref().unwrap(),
                &(ImageFormat::Jpeg, Bytes::copy_from_slice(&jpeg))
            );
            assert_eq!(samples[0].label, Label::Value(7));
            assert_eq!((samples[0].start, samples[0].end), (0, second));
            assert_eq!(samples[1].image.as_ref().unwrap().0, ImageFormat::Png);
            assert_eq!(samples[1].label, Label::Missing);
            for (sample, why) in
                samples[2..]
                    .iter()
                    .zip(["not a JPEG", "tf.train.Example", "CRC32C"])
            {
                let unreadable = sample.unreadable.as_ref().expect("a corrupt sample");
                assert_eq!(unreadable.reason, "corrupt");
                assert!(unreadable.message.contains(why), "{}", unreadable.message);
            }
        }
        // Read from the second record on: numbering continues from there.
        let mut splitter = tfrecord_splitter(second, 1);
        splitter.push(&shard[second as usize..]);
        let sample = splitter.next_sample().unwrap().unwrap();
        assert_eq!((sample.key.as_str(), sample.start), ("00000001", second));
        // Cut inside a record: the shard is truncated, not a short sample.
        let mut splitter = tfrecord_splitter(0, 0);
        splitter.push(&shard[..second as usize - 1]);
        assert!(splitter.next_sample().unwrap().is_none());
        assert!(matches!(
            splitter.finish(),
            Err(ShardError::TfRecord(TfRecordError::Truncated { offset: 0 }))
        ));
    }

    #[test]
    fn formats_follow_the_shard_name() {
        assert_eq!(
            ShardFormat::from_name("a/b-000.tar"),
            Some(ShardFormat::Streamed(StreamedFormat::Tar))
        );
        assert_eq!(
            ShardFormat::from_name("train-1.tfrecord"),
            Some(ShardFormat::Streamed(StreamedFormat::TfRecord))
        );
        assert_eq!(
            ShardFormat::from_name("x.tfrecords"),
            Some(ShardFormat::Streamed(StreamedFormat::TfRecord))
        );
        assert_eq!(
            ShardFormat::from_name("data/train-00000-of-00042.parquet"),
            Some(ShardFormat::Parquet)
        );
        assert_eq!(ShardFormat::from_name("x.tfrecord.gz"), None);
        assert_eq!(ShardFormat::from_name("index.json"), None);
    }

    #[test]
    fn keys_split_at_the_first_dot_of_the_file_name() {
        assert_eq!(split_key("a/b.c/d.seg.png"), ("a/b.c/d", "seg.png"));
        assert_eq!(split_key("noext"), ("noext", ""));
    }
}
