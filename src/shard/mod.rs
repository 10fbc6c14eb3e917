//! Shard formats: turn a shard's bytes into samples.
//!
//! Pure byte parsing: no I/O, no async. A WebDataset sample is the run of
//! consecutive tar members sharing a key (the path up to the first dot of the
//! file name): `KEY.jpg` holds the image, `KEY.cls` its label. Other formats
//! (e.g. loose files, record files) add a splitter beside the tar one.

pub mod tar;
pub mod tfrecord;

use bytes::{Buf, Bytes, BytesMut};
use tar::{Parsed, TarError, TarParser};

/// Default limit on one tar member; larger ones are an error, which bounds the
/// parser's buffer.
pub const DEFAULT_MAX_MEMBER_BYTES: u64 = 64 << 20;

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
}

/// One sample, with its compressed image bytes.
#[derive(Debug, Clone)]
pub struct RawSample {
    pub key: String,
    pub image: Option<(ImageFormat, Bytes)>,
    pub label: Label,
    /// Byte range of the sample in the shard: its first header to the end of
    /// its last member.
    pub start: u64,
    pub end: u64,
    /// Why the sample's bytes could not be read (the rest of a damaged shard
    /// skipped under `--on-bad-shard skip`); the sample is substituted.
    pub unreadable: Option<String>,
}

impl RawSample {
    /// A placeholder for a sample of a damaged shard, keeping its place in
    /// the plan.
    pub fn unreadable(key: String, why: String) -> Self {
        Self {
            key,
            image: None,
            label: Label::Missing,
            start: 0,
            end: 0,
            unreadable: Some(why),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error(transparent)]
    Tar(#[from] TarError),
}

/// Splits `KEY.ext` at the first dot of the file name.
pub fn split_key(name: &str) -> (&str, &str) {
    let file_start = name.rfind('/').map_or(0, |i| i + 1);
    match name[file_start..].find('.') {
        Some(dot) => (&name[..file_start + dot], &name[file_start + dot + 1..]),
        None => (name, ""),
    }
}

/// Streams samples out of tar bytes pushed in arbitrary chunks.
#[derive(Debug)]
pub struct SampleSplitter {
    parser: TarParser,
    buf: BytesMut,
    current: Option<RawSample>,
    ended: bool,
}

impl SampleSplitter {
    /// `offset` is the shard offset of the first byte pushed (a header boundary).
    pub fn new(offset: u64, max_member: u64) -> Self {
        Self {
            parser: TarParser::new(offset, max_member),
            buf: BytesMut::new(),
            current: None,
            ended: false,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        if !self.ended {
            self.buf.extend_from_slice(chunk);
        }
    }

    /// The next complete sample, if the bytes pushed so far hold one.
    pub fn next_sample(&mut self) -> Result<Option<RawSample>, ShardError> {
        while !self.ended {
            match self.parser.parse(&self.buf)? {
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
                    if let Some(done) =
                        self.add_member(&member.name, data, member.header_offset, member.end_offset)
                    {
                        return Ok(Some(done));
                    }
                }
            }
        }
        Ok(self.current.take())
    }

    /// Call once all bytes are pushed: returns the last sample, or an error if
    /// the input stopped inside an entry.
    pub fn finish(&mut self) -> Result<Option<RawSample>, ShardError> {
        if let Some(sample) = self.next_sample()? {
            // A sample completed by the last bytes; the caller calls again.
            return Ok(Some(sample));
        }
        if !self.ended && !self.buf.is_empty() {
            return Err(TarError::Truncated {
                offset: self.parser.offset(),
            }
            .into());
        }
        self.ended = true;
        Ok(self.current.take())
    }

    fn add_member(&mut self, name: &str, data: Bytes, start: u64, end: u64) -> Option<RawSample> {
        let (key, ext) = split_key(name);
        let finished = match &self.current {
            Some(current) if current.key != key => self.current.take(),
            _ => None,
        };
        let sample = self.current.get_or_insert_with(|| RawSample {
            key: key.to_string(),
            image: None,
            label: Label::Missing,
            start,
            end,
            unreadable: None,
        });
        sample.end = end;
        let ext = ext.to_ascii_lowercase();
        if ext == "cls" {
            sample.label = Label::parse(&data);
        } else if let Some(format) = ImageFormat::from_extension(&ext) {
            if sample.image.is_none() {
                sample.image = Some((format, data));
            }
        }
        finished
    }
}

#[cfg(test)]
mod tests {
    use super::tar::TarWriter;
    use super::*;

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
    fn keys_split_at_the_first_dot_of_the_file_name() {
        assert_eq!(split_key("a/b.c/d.seg.png"), ("a/b.c/d", "seg.png"));
        assert_eq!(split_key("noext"), ("noext", ""));
    }
}
