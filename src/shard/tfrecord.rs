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

use std::ops::Range;

pub use super::tf_example::{example, example_bytes, parse_example, ExampleSample, FeatureNames};

/// Bytes of a record's framing: length, its CRC, and the data's CRC.
pub const FRAME_BYTES: u64 = 8 + 4 + 4;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TfRecordError {
    #[error(
        "TFRecord length checksum mismatch at byte {offset}: the shard is damaged \
         (or gzip-compressed, which shardfeed does not read) from here on"
    )]
    LengthChecksum { offset: u64 },
    #[error(
        "TFRecord record at byte {offset} is {length} bytes, over the limit of {max} \
         (--max-member-bytes)"
    )]
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

    /// The length of the record whose header starts `input` (checked
    /// against its CRC and the limit); `None` until 12 bytes are there.
    fn header(&self, input: &[u8]) -> Result<Option<u64>, TfRecordError> {
        let Some(header) = input.get(..12) else {
            return Ok(None);
        };
        let (length_bytes, length_crc) = header.split_at(8);
        let length_crc = u32::from_le_bytes(length_crc.try_into().expect("4 bytes"));
        if masked_crc32c(length_bytes) != length_crc {
            return Err(TfRecordError::LengthChecksum {
                offset: self.offset,
            });
        }
        let length = u64::from_le_bytes(length_bytes.try_into().expect("8 bytes"));
        if length > self.max_record {
            return Err(TfRecordError::TooLarge {
                offset: self.offset,
                length,
                max: self.max_record,
            });
        }
        Ok(Some(length))
    }

    /// The next record's place in the shard, from its header alone: `(start,
    /// end)`, framing included. The caller skips `end - start` bytes from
    /// the header's first byte; the data and its checksum are not looked at
    /// (index scans need only where records are).
    pub fn parse_frame(&mut self, input: &[u8]) -> Result<Option<(u64, u64)>, TfRecordError> {
        let Some(length) = self.header(input)? else {
            return Ok(None);
        };
        let start = self.offset;
        self.offset += FRAME_BYTES + length;
        Ok(Some((start, self.offset)))
    }

    pub fn parse(&mut self, input: &[u8]) -> Result<Parsed, TfRecordError> {
        let Some(length) = self.header(input)? else {
            return Ok(Parsed::NeedMore(12 - input.len()));
        };
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
}
