//! Decompressed pages checked before the parquet crate decodes them.
//!
//! The crate's delta decoders size a buffer by the value count written
//! inside the page's data, unchecked: a damaged `DELTA_BYTE_ARRAY` page
//! claiming petabytes of values made it allocate that much, and a failed
//! allocation aborts the process (libFuzzer found it). Its dictionary
//! reader sizes the dictionary by the page header's count. Each count is
//! checked here against what the page can hold.

use bytes::Bytes;
use parquet::basic::Encoding;
use parquet::column::page::{Page, PageMetadata, PageReader};
use parquet::errors::{ParquetError as CrateError, Result as CrateResult};

/// The most values a delta block may claim: the format writes 128 (a
/// multiple of 128 is required); larger blocks are not written by any
/// writer we know and only serve to size buffers.
const MAX_DELTA_BLOCK: u64 = 1 << 16;

pub struct CheckedPages {
    inner: Box<dyn PageReader>,
    max_def_level: i16,
    max_rep_level: i16,
}

impl CheckedPages {
    pub fn new(inner: Box<dyn PageReader>, max_def_level: i16, max_rep_level: i16) -> Self {
        Self {
            inner,
            max_def_level,
            max_rep_level,
        }
    }

    fn check(&self, page: Option<Page>) -> CrateResult<Option<Page>> {
        if let Some(page) = &page {
            check_page(page, self.max_def_level, self.max_rep_level)
                .map_err(CrateError::General)?;
        }
        Ok(page)
    }
}

impl Iterator for CheckedPages {
    type Item = CrateResult<Page>;

    fn next(&mut self) -> Option<Self::Item> {
        self.get_next_page().transpose()
    }
}

impl PageReader for CheckedPages {
    fn get_next_page(&mut self) -> CrateResult<Option<Page>> {
        let page = self.inner.get_next_page()?;
        self.check(page)
    }

    fn peek_next_page(&mut self) -> CrateResult<Option<PageMetadata>> {
        self.inner.peek_next_page()
    }

    fn skip_next_page(&mut self) -> CrateResult<()> {
        self.inner.skip_next_page()
    }

    fn supports_deferred_dictionary(&self) -> bool {
        self.inner.supports_deferred_dictionary()
    }

    fn take_deferred_dictionary(&mut self) -> CrateResult<Option<Page>> {
        let page = self.inner.take_deferred_dictionary()?;
        self.check(page)
    }

    fn at_record_boundary(&mut self) -> CrateResult<bool> {
        self.inner.at_record_boundary()
    }
}

fn check_page(page: &Page, max_def_level: i16, max_rep_level: i16) -> Result<(), String> {
    match page {
        Page::DictionaryPage {
            buf, num_values, ..
        } => {
            // Every dictionary value the crate reads is at least a byte.
            if u64::from(*num_values) > buf.len() as u64 {
                return Err(format!(
                    "a dictionary page claims {num_values} values in {} bytes",
                    buf.len()
                ));
            }
            Ok(())
        }
        Page::DataPage {
            buf,
            num_values,
            encoding,
            def_level_encoding,
            rep_level_encoding,
            ..
        } => {
            let mut at = 0usize;
            for (max_level, level_encoding) in [
                (max_rep_level, rep_level_encoding),
                (max_def_level, def_level_encoding),
            ] {
                if max_level > 0 {
                    at = at
                        .checked_add(v1_levels_len(
                            &buf[at.min(buf.len())..],
                            *level_encoding,
                            max_level,
                            *num_values,
                        )?)
                        .ok_or("level lengths overflow")?;
                }
            }
            check_values(buf, at, *encoding, *num_values)
        }
        Page::DataPageV2 {
            buf,
            num_values,
            encoding,
            def_levels_byte_len,
            rep_levels_byte_len,
            ..
        } => {
            let at = u64::from(*def_levels_byte_len) + u64::from(*rep_levels_byte_len);
            check_values(buf, at as usize, *encoding, *num_values)
        }
    }
}

/// The bytes a v1 page's level run takes.
fn v1_levels_len(
    buf: &[u8],
    encoding: Encoding,
    max_level: i16,
    num_values: u32,
) -> Result<usize, String> {
    match encoding {
        Encoding::RLE => {
            let prefix: [u8; 4] = buf
                .get(..4)
                .and_then(|b| b.try_into().ok())
                .ok_or("a level run has no length")?;
            Ok(4 + u32::from_le_bytes(prefix) as usize)
        }
        #[allow(deprecated)]
        Encoding::BIT_PACKED => {
            let width = 16 - (max_level as u16).leading_zeros() as u64;
            Ok((u64::from(num_values) * width).div_ceil(8) as usize)
        }
        other => Err(format!("levels encoded as {other}")),
    }
}

fn check_values(buf: &Bytes, at: usize, encoding: Encoding, num_values: u32) -> Result<(), String> {
    let Some(values) = buf.get(at..) else {
        return Err(format!("levels of {at} bytes in a page of {}", buf.len()));
    };
    let limit = u64::from(num_values);
    match encoding {
        Encoding::DELTA_BINARY_PACKED | Encoding::DELTA_LENGTH_BYTE_ARRAY => {
            DeltaStream::read(values, limit).map(|_| ())
        }
        Encoding::DELTA_BYTE_ARRAY => {
            // Prefix lengths, then the suffixes as DELTA_LENGTH_BYTE_ARRAY.
            let prefixes = DeltaStream::read(values, limit)?;
            let suffixes = values
                .get(prefixes.end..)
                .ok_or("the prefixes end past the page")?;
            DeltaStream::read(suffixes, limit).map(|_| ())
        }
        _ => Ok(()),
    }
}

/// A DELTA_BINARY_PACKED stream's header and where its last block ends.
struct DeltaStream {
    end: usize,
}

impl DeltaStream {
    /// Reads the header, refuses a count over `limit` (the page's values)
    /// or an oversized block, and walks the blocks to the stream's end.
    fn read(bytes: &[u8], limit: u64) -> Result<Self, String> {
        let mut at = 0usize;
        let block_size = uleb(bytes, &mut at)?;
        let miniblocks = uleb(bytes, &mut at)?;
        let total = uleb(bytes, &mut at)?;
        uleb(bytes, &mut at)?; // the first value, zigzag
        if total > limit {
            return Err(format!(
                "a delta-encoded run claims {total} values in a page of {limit}"
            ));
        }
        if block_size == 0
            || block_size > MAX_DELTA_BLOCK
            || miniblocks == 0
            || block_size % miniblocks != 0
        {
            return Err(format!(
                "a delta-encoded run has blocks of {block_size} values in {miniblocks} miniblocks"
            ));
        }
        let per_miniblock = block_size / miniblocks;
        let mut left = total.saturating_sub(1);
        while left > 0 {
            uleb(bytes, &mut at)?; // the block's min delta, zigzag
            let widths_at = at;
            at = at
                .checked_add(miniblocks as usize)
                .filter(|&end| end <= bytes.len())
                .ok_or("a delta block's bit widths run past the page")?;
            for m in 0..miniblocks as usize {
                if left == 0 {
                    break;
                }
                let width = u64::from(bytes[widths_at + m]);
                if width > 64 {
                    return Err(format!("a delta miniblock of {width}-bit values"));
                }
                at = at
                    .checked_add((per_miniblock * width / 8) as usize)
                    .filter(|&end| end <= bytes.len())
                    .ok_or("a delta miniblock runs past the page")?;
                left = left.saturating_sub(per_miniblock);
            }
        }
        Ok(Self { end: at })
    }
}

fn uleb(bytes: &[u8], at: &mut usize) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at).ok_or("a delta header runs past the page")?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("a varint runs past ten bytes".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A delta header: blocks of 128 values in `miniblocks`, `total`
    /// values (ULEB128 bytes), first value 0.
    fn header(miniblocks: u8, total: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0x80, 0x01, miniblocks];
        bytes.extend(total);
        bytes.push(0);
        bytes
    }

    #[test]
    fn a_delta_run_claiming_more_values_than_its_page_is_refused() {
        // Total 2^49: the count that made the crate allocate petabytes.
        let huge = header(4, &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]);
        let why = check_values(&Bytes::from(huge), 0, Encoding::DELTA_BYTE_ARRAY, 5).unwrap_err();
        assert!(why.contains("claims"), "{why}");
    }

    #[test]
    fn a_delta_run_of_one_value_has_no_blocks_and_ends_after_its_header() {
        let one = header(4, &[0x01]);
        let stream = DeltaStream::read(&one, 1).unwrap();
        assert_eq!(stream.end, one.len());
    }

    #[test]
    fn a_dictionary_claiming_more_values_than_bytes_is_refused() {
        let page = Page::DictionaryPage {
            buf: Bytes::from_static(b"abc"),
            num_values: 1 << 30,
            encoding: Encoding::PLAIN,
            is_sorted: false,
        };
        assert!(check_page(&page, 0, 0).unwrap_err().contains("dictionary"));
    }
}
