//! A Parquet file's footer: where it lies, what it says, and whether what
//! it says fits the file.
//!
//! The file ends with `metadata | metadata length: u32 LE | "PAR1"`. A reader
//! GETs the last [`TAIL_READ_BYTES`] (one request for every footer the Hub's
//! image files have), and a second range only when the metadata is longer.
//! Every offset the metadata gives is checked against the file's size here,
//! once, so the readers behind it never index past what was fetched.

use std::ops::Range;

use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader, RowGroupMetaData};

use super::error::ParquetError;

/// Bytes of the file's last GET: the footers of HF image files (a few
/// hundred row groups of three columns) are 20–200 KB.
pub const TAIL_READ_BYTES: u64 = 256 << 10;
/// The longest footer read. A footer is parsed whole into memory (it is
/// ~10x its size there) and kept per file while its row groups are read:
/// 10,000 row groups of 8 columns is ~4 MB.
pub const MAX_FOOTER_BYTES: u64 = 16 << 20;
/// The most rows a row group may claim: pyarrow writes up to 2^20 a group;
/// a footer claiming more than this is refused before its index (a key
/// per row) is made.
pub const MAX_ROW_GROUP_ROWS: u64 = 1 << 22;
/// The most column chunks (row groups x columns) a footer may list: it is
/// parsed whole, each chunk's metadata a few hundred bytes in memory, so
/// 2^17 is tens of MB. The review's 16 MiB footers listed 705,000 each
/// (3.76 M row groups in 16 files) and held 2 GB; the Hub's image files
/// list a few hundred.
pub const MAX_FOOTER_COLUMN_CHUNKS: u64 = 1 << 17;
/// `metadata length: u32 LE | "PAR1"`.
const TRAILER_BYTES: u64 = 8;
const MAGIC: &[u8; 4] = b"PAR1";
/// The magic of a file whose footer is encrypted: not read.
const ENCRYPTED_MAGIC: &[u8; 4] = b"PARE";

/// Where a file's metadata lies, from its last eight bytes.
pub fn metadata_range(trailer: &[u8], file_size: u64) -> Result<Range<u64>, ParquetError> {
    let not_parquet = |why: String| ParquetError::NotParquet { why };
    if file_size < 2 * MAGIC.len() as u64 + TRAILER_BYTES - MAGIC.len() as u64 {
        return Err(not_parquet(format!(
            "{file_size} bytes is shorter than a Parquet file's magic and footer"
        )));
    }
    let Some(tail) = trailer.last_chunk::<8>() else {
        return Err(not_parquet("fewer than 8 trailing bytes were read".into()));
    };
    if &tail[4..] == ENCRYPTED_MAGIC {
        return Err(ParquetError::Unsupported {
            what: "an encrypted footer (magic PARE)".into(),
        });
    }
    if &tail[4..] != MAGIC {
        return Err(not_parquet(format!(
            "it ends in {:?}, not the magic \"PAR1\"",
            String::from_utf8_lossy(&tail[4..])
        )));
    }
    let length = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    let end = file_size - TRAILER_BYTES;
    // The leading magic comes first: the metadata cannot reach into it.
    if length > end.saturating_sub(MAGIC.len() as u64) {
        return Err(ParquetError::Footer {
            why: format!(
                "the footer claims {length} bytes of metadata; the file has {file_size} bytes"
            ),
        });
    }
    if length > MAX_FOOTER_BYTES {
        return Err(ParquetError::FooterTooLarge {
            bytes: length,
            max: MAX_FOOTER_BYTES,
        });
    }
    Ok(end - length..end)
}

/// The range of the file's first GET: its tail.
pub fn tail_range(file_size: u64) -> Range<u64> {
    file_size.saturating_sub(TAIL_READ_BYTES)..file_size
}

/// A parsed footer whose every row group's column chunks lie inside the
/// file.
#[derive(Debug)]
pub struct Footer {
    pub metadata: ParquetMetaData,
    pub file_size: u64,
}

/// One row group as the index keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowGroupSpan {
    pub rows: u64,
    /// The row group's column chunks, first byte to last.
    pub bytes: Range<u64>,
    /// What its column chunks hold once decompressed.
    pub uncompressed: u64,
}

impl Footer {
    /// Parses `metadata` (the bytes [`metadata_range`] named) and checks
    /// it against the file's size.
    pub fn parse(metadata: &[u8], file_size: u64) -> Result<Self, ParquetError> {
        // Bytes that would keep the crate's decoder looping are refused
        // first, and so is more metadata than a footer may hold parsed.
        let chunks = super::thrift_guard::check_footer(metadata)
            .map_err(|why| ParquetError::Footer { why })?;
        if chunks > MAX_FOOTER_COLUMN_CHUNKS {
            return Err(ParquetError::FooterTooManyChunks {
                chunks,
                max: MAX_FOOTER_COLUMN_CHUNKS,
            });
        }
        // The crate's decoder is third-party code over untrusted bytes: a
        // panic in it is a damaged footer, not a dead reader.
        let decoded = std::panic::catch_unwind(|| ParquetMetaDataReader::decode_metadata(metadata))
            .map_err(|_| ParquetError::Footer {
                why: "the footer decoder failed on its bytes".into(),
            })?;
        let metadata = decoded.map_err(|e| ParquetError::Footer { why: e.to_string() })?;
        let footer = Self {
            metadata,
            file_size,
        };
        for group in 0..footer.metadata.num_row_groups() {
            footer.span(group)?;
        }
        Ok(footer)
    }

    /// Parses the footer out of the file's tail, or says which range more
    /// it needs (`Err(Ok(range))`) when the tail is shorter than it.
    pub fn from_tail(
        tail: &[u8],
        file_size: u64,
    ) -> Result<Self, Result<Range<u64>, ParquetError>> {
        let range = metadata_range(tail, file_size).map_err(Err)?;
        let tail_start = file_size - tail.len() as u64;
        if range.start < tail_start {
            return Err(Ok(range));
        }
        let at = (range.start - tail_start) as usize;
        let length = (range.end - range.start) as usize;
        Self::parse(&tail[at..at + length], file_size).map_err(Err)
    }

    pub fn row_groups(&self) -> usize {
        self.metadata.num_row_groups()
    }

    /// Row group `group`'s rows and bytes, checked.
    pub fn span(&self, group: usize) -> Result<RowGroupSpan, ParquetError> {
        let meta = self.group(group)?;
        let rows = u64::try_from(meta.num_rows())
            .ok()
            .filter(|&rows| rows <= MAX_ROW_GROUP_ROWS)
            .ok_or_else(|| ParquetError::Footer {
                why: format!(
                    "row group {group} claims {} rows; at most {MAX_ROW_GROUP_ROWS} are read",
                    meta.num_rows()
                ),
            })?;
        let mut bytes: Option<Range<u64>> = None;
        let mut uncompressed = 0u64;
        for column in 0..meta.num_columns() {
            let chunk = self.chunk_range(group, column)?;
            uncompressed = uncompressed.saturating_add(
                u64::try_from(meta.column(column).uncompressed_size()).unwrap_or(u64::MAX),
            );
            bytes = Some(match bytes {
                Some(b) => b.start.min(chunk.start)..b.end.max(chunk.end),
                None => chunk,
            });
        }
        Ok(RowGroupSpan {
            rows,
            bytes: bytes.unwrap_or(0..0),
            uncompressed,
        })
    }

    /// Where column chunk `column` of row group `group` lies, checked
    /// against the file (the metadata's own `byte_range` panics on a
    /// negative offset).
    pub fn chunk_range(&self, group: usize, column: usize) -> Result<Range<u64>, ParquetError> {
        let chunk = self.group(group)?.column(column);
        let start = chunk
            .dictionary_page_offset()
            .unwrap_or_else(|| chunk.data_page_offset());
        let length = chunk.compressed_size();
        let past = |why: String| ParquetError::Footer {
            why: format!("row group {group}, column {}: {why}", chunk.column_path()),
        };
        let (Ok(start), Ok(length)) = (u64::try_from(start), u64::try_from(length)) else {
            return Err(past(format!(
                "offset {start} or length {length} is negative"
            )));
        };
        let end = start.saturating_add(length);
        if end > self.file_size.saturating_sub(TRAILER_BYTES) || start < MAGIC.len() as u64 {
            return Err(past(format!(
                "bytes {start}..{end} lie outside the file's {} bytes of data",
                self.file_size
            )));
        }
        Ok(start..end)
    }

    fn group(&self, group: usize) -> Result<&RowGroupMetaData, ParquetError> {
        self.metadata
            .row_groups()
            .get(group)
            .ok_or_else(|| ParquetError::Footer {
                why: format!("row group {group} of {}", self.metadata.num_row_groups()),
            })
    }

    /// The class names the Hugging Face `datasets` library stores in the
    /// schema's metadata (`huggingface` → `info.features.<column>.names`,
    /// a `ClassLabel`): those of `column`, else of the file's only
    /// `ClassLabel`.
    pub fn class_names(&self, column: &str) -> Vec<String> {
        let Some(pairs) = self.metadata.file_metadata().key_value_metadata() else {
            return Vec::new();
        };
        let Some(text) = pairs
            .iter()
            .find(|pair| pair.key == "huggingface")
            .and_then(|pair| pair.value.as_deref())
        else {
            return Vec::new();
        };
        hf_class_names(text, column)
    }
}

/// [`Footer::class_names`] of the `huggingface` metadata's JSON text.
pub fn hf_class_names(text: &str, column: &str) -> Vec<String> {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(text) else {
        return Vec::new();
    };
    let Some(features) = value.pointer("/info/features").and_then(|f| f.as_object()) else {
        return Vec::new();
    };
    let names = |feature: &serde_json::Value| -> Option<Vec<String>> {
        let names = feature.get("names")?.as_array()?;
        names
            .iter()
            .map(|n| n.as_str().map(str::to_string))
            .collect()
    };
    if let Some(found) = features.get(column).and_then(names) {
        return found;
    }
    let labels: Vec<Vec<String>> = features
        .values()
        .filter(|f| f.get("_type").and_then(|t| t.as_str()) == Some("ClassLabel"))
        .filter_map(names)
        .collect();
    match <[Vec<String>; 1]>::try_from(labels) {
        Ok([only]) => only,
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trailer_names_the_metadata_or_says_why_not() {
        let mut trailer = 100u32.to_le_bytes().to_vec();
        trailer.extend_from_slice(b"PAR1");
        assert_eq!(metadata_range(&trailer, 1_000), Ok(892..992));
        assert!(matches!(
            metadata_range(&trailer, 50),
            Err(ParquetError::Footer { .. })
        ));
        let mut tar = vec![0u8; 4];
        tar.extend_from_slice(b"\0\0\0\0");
        assert!(matches!(
            metadata_range(&tar, 1_000),
            Err(ParquetError::NotParquet { .. })
        ));
        let mut encrypted = 10u32.to_le_bytes().to_vec();
        encrypted.extend_from_slice(b"PARE");
        assert!(matches!(
            metadata_range(&encrypted, 1_000),
            Err(ParquetError::Unsupported { .. })
        ));
        assert!(matches!(
            metadata_range(b"PAR1", 4),
            Err(ParquetError::NotParquet { .. })
        ));
        let mut huge = u32::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(b"PAR1");
        assert!(matches!(
            metadata_range(&huge, 1 << 40),
            Err(ParquetError::FooterTooLarge { .. })
        ));
    }

    #[test]
    fn class_names_come_from_the_named_class_label_or_the_only_one() {
        let hf = r#"{"info": {"features": {
            "image": {"_type": "Image"},
            "label": {"names": ["cat", "dog"], "_type": "ClassLabel"}}}}"#;
        assert_eq!(hf_class_names(hf, "label"), ["cat", "dog"]);
        assert_eq!(hf_class_names(hf, "fine_label"), ["cat", "dog"]);
        let two = r#"{"info": {"features": {
            "coarse": {"names": ["a"], "_type": "ClassLabel"},
            "fine": {"names": ["b", "c"], "_type": "ClassLabel"}}}}"#;
        assert_eq!(hf_class_names(two, "fine"), ["b", "c"]);
        assert!(hf_class_names(two, "label").is_empty(), "ambiguous: none");
        assert!(hf_class_names("not json", "label").is_empty());
    }
}
