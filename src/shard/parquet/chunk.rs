//! A column chunk's bytes as fetched: the ranged GETs' parts, kept as they
//! arrived and addressed by file offset, as the page reader asks for them.
//! Pages are sliced out of a part without a copy; only a page that
//! straddles two parts is copied. (Joining the parts first would copy the
//! whole chunk, and for a 1,000-row group of photos take a fresh 110 MB
//! allocation, each time.)

use std::collections::VecDeque;
use std::io::Read;

use bytes::{Buf, Bytes, BytesMut};
use parquet::errors::{ParquetError as CrateError, Result as CrateResult};
use parquet::file::reader::{ChunkReader, Length};

#[derive(Debug, Clone)]
pub struct ChunkBytes {
    /// The file offset of the first part's first byte.
    offset: u64,
    /// Contiguous, in file order.
    parts: Vec<Bytes>,
    /// `starts[i]`: part `i`'s offset from `offset`.
    starts: Vec<u64>,
    len: u64,
}

impl ChunkBytes {
    pub fn new(offset: u64, parts: Vec<Bytes>) -> Self {
        let mut starts = Vec::with_capacity(parts.len());
        let mut len = 0u64;
        for part in &parts {
            starts.push(len);
            len += part.len() as u64;
        }
        Self {
            offset,
            parts,
            starts,
            len,
        }
    }

    pub fn whole(offset: u64, data: Bytes) -> Self {
        Self::new(offset, vec![data])
    }

    /// The chunk's byte `at` (from its start), if it has one.
    pub fn byte_at(&self, at: u64) -> Option<u8> {
        if at >= self.len {
            return None;
        }
        let (part, within) = self.locate(at);
        self.parts.get(part)?.get(within).copied()
    }

    /// The chunk's length in bytes.
    pub fn chunk_len(&self) -> u64 {
        self.len
    }

    /// The chunk's bytes from `at` (from its start) on, without a copy;
    /// empty past its end.
    pub fn read_from(&self, at: u64) -> PartsReader {
        self.get_read(self.offset.saturating_add(at))
            .unwrap_or_default()
    }

    /// The part holding chunk byte `at` and where in it.
    fn locate(&self, at: u64) -> (usize, usize) {
        let part = self.starts.partition_point(|&s| s <= at).saturating_sub(1);
        (
            part,
            (at - self.starts.get(part).copied().unwrap_or(0)) as usize,
        )
    }

    fn outside(&self, start: u64, length: usize) -> CrateError {
        CrateError::EOF(format!(
            "bytes {start}..+{length} are outside the column chunk at {}..{}",
            self.offset,
            self.offset + self.len
        ))
    }
}

impl Length for ChunkBytes {
    fn len(&self) -> u64 {
        self.offset + self.len
    }
}

impl ChunkReader for ChunkBytes {
    type T = PartsReader;

    fn get_read(&self, start: u64) -> CrateResult<PartsReader> {
        let at = start
            .checked_sub(self.offset)
            .filter(|&at| at <= self.len)
            .ok_or_else(|| self.outside(start, 0))?;
        if at == self.len {
            return Ok(PartsReader::default());
        }
        let (part, within) = self.locate(at);
        let mut parts: VecDeque<Bytes> = self.parts[part..].iter().cloned().collect();
        if let Some(first) = parts.front_mut() {
            first.advance(within);
        }
        Ok(PartsReader { parts })
    }

    fn get_bytes(&self, start: u64, length: usize) -> CrateResult<Bytes> {
        let at = start
            .checked_sub(self.offset)
            .filter(|&at| {
                at.checked_add(length as u64)
                    .is_some_and(|end| end <= self.len)
            })
            .ok_or_else(|| self.outside(start, length))?;
        let (part, within) = self.locate(at);
        let first = &self.parts[part];
        if within + length <= first.len() {
            return Ok(first.slice(within..within + length));
        }
        let mut joined = BytesMut::with_capacity(length);
        let mut reader = self.get_read(start)?;
        joined.resize(length, 0);
        reader
            .read_exact(&mut joined)
            .map_err(|e| CrateError::EOF(e.to_string()))?;
        Ok(joined.freeze())
    }
}

/// Reads on across the parts, front to back, without copying them.
#[derive(Debug, Default)]
pub struct PartsReader {
    parts: VecDeque<Bytes>,
}

impl Read for PartsReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while let Some(front) = self.parts.front_mut() {
            if front.is_empty() {
                self.parts.pop_front();
                continue;
            }
            let n = front.len().min(out.len());
            out[..n].copy_from_slice(&front[..n]);
            front.advance(n);
            return Ok(n);
        }
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_come_out_of_one_part_or_joined_across_two() {
        let data: Vec<u8> = (0..100u8).collect();
        let parts = vec![
            Bytes::copy_from_slice(&data[..30]),
            Bytes::copy_from_slice(&data[30..31]),
            Bytes::copy_from_slice(&data[31..]),
        ];
        let chunk = ChunkBytes::new(1_000, parts);
        assert_eq!(chunk.len(), 1_100);
        for (start, length) in [
            (1_000, 10),
            (1_025, 10),
            (1_030, 1),
            (1_029, 3),
            (1_000, 100),
            (1_099, 1),
            (1_100, 0),
        ] {
            let at = (start - 1_000) as usize;
            assert_eq!(
                chunk.get_bytes(start, length).unwrap().as_ref(),
                &data[at..at + length],
                "{start}+{length}"
            );
            let mut read = Vec::new();
            chunk
                .get_read(start)
                .unwrap()
                .read_to_end(&mut read)
                .unwrap();
            assert_eq!(read, &data[at..]);
        }
        assert!(chunk.get_bytes(999, 1).is_err());
        assert!(chunk.get_bytes(1_090, 11).is_err());
        assert!(chunk.get_read(1_101).is_err());
        assert!(chunk.get_bytes(u64::MAX, 2).is_err());
    }
}
