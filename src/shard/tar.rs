//! Incremental tar reader: ustar, GNU long names and PAX paths.
//!
//! [`TarParser::parse`] looks at the front of a buffer and either returns one
//! entry with the number of bytes it spans, or asks for more bytes. It never
//! fails on a short buffer and never copies member data: the caller slices its
//! own buffer with the returned range.

use std::ops::Range;

pub const BLOCK: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TarError {
    #[error("bad tar header checksum at offset {offset}")]
    BadChecksum { offset: u64 },
    #[error("bad numeric field {field} in tar header at offset {offset}")]
    BadNumber { field: &'static str, offset: u64 },
    #[error("tar member at offset {offset} is {size} bytes, over the limit of {limit}")]
    MemberTooLarge { offset: u64, size: u64, limit: u64 },
    #[error("tar stream ends inside an entry at offset {offset}")]
    Truncated { offset: u64 },
}

/// One regular file of the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    /// Offset of the first header block of this member (including any GNU
    /// long-name or PAX headers that precede it), in archive coordinates.
    pub header_offset: u64,
    /// Offset just past the member's padded data.
    pub end_offset: u64,
    /// Member data, relative to the start of the buffer given to `parse`.
    pub data: Range<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// At least this many bytes are needed at the front of the buffer.
    NeedMore(usize),
    /// A regular file; consume `consumed` bytes.
    Member { member: Member, consumed: usize },
    /// A header or entry with no file for the caller (directory, PAX global
    /// header, link, ...); consume `consumed` bytes.
    Skip { consumed: usize },
    /// End-of-archive marker (a zero block).
    End,
}

/// Parser state between entries (pending long names and PAX paths).
#[derive(Debug, Clone)]
pub struct TarParser {
    offset: u64,
    pending_name: Option<String>,
    pending_start: Option<u64>,
    max_member: u64,
}

impl TarParser {
    /// `offset` is the archive offset of the first byte that will be passed in,
    /// which must be a header boundary. `max_member` bounds buffered entries.
    pub fn new(offset: u64, max_member: u64) -> Self {
        Self {
            offset,
            pending_name: None,
            pending_start: None,
            max_member,
        }
    }

    /// Archive offset of the next entry.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn parse(&mut self, buf: &[u8]) -> Result<Parsed, TarError> {
        if buf.len() < BLOCK {
            return Ok(Parsed::NeedMore(BLOCK));
        }
        let header = &buf[..BLOCK];
        if header.iter().all(|&b| b == 0) {
            return Ok(Parsed::End);
        }
        let offset = self.offset;
        verify_checksum(header, offset)?;
        let size = parse_number(&header[124..136], "size", offset)?;
        let kind = header[156];
        // Sizes of headers that carry no data (links, dirs) are ignored.
        let carries_data = matches!(kind, b'0' | 0 | b'7' | b'L' | b'x' | b'g' | b'K');
        let data_len = if carries_data { size } else { 0 };
        if data_len > self.max_member {
            return Err(TarError::MemberTooLarge {
                offset,
                size: data_len,
                limit: self.max_member,
            });
        }
        let padded = (data_len as usize).div_ceil(BLOCK) * BLOCK;
        let total = BLOCK + padded;
        if buf.len() < total {
            return Ok(Parsed::NeedMore(total));
        }
        let data = BLOCK..BLOCK + data_len as usize;
        let first_header = *self.pending_start.get_or_insert(offset);
        self.offset += total as u64;
        match kind {
            b'L' => {
                self.pending_name = Some(c_string(&buf[data]));
                Ok(Parsed::Skip { consumed: total })
            }
            b'x' => {
                if let Some(path) = pax_path(&buf[data]) {
                    self.pending_name = Some(path);
                }
                Ok(Parsed::Skip { consumed: total })
            }
            b'0' | 0 | b'7' => {
                let name = self
                    .pending_name
                    .take()
                    .unwrap_or_else(|| header_name(header));
                self.pending_start = None;
                Ok(Parsed::Member {
                    member: Member {
                        name,
                        header_offset: first_header,
                        end_offset: self.offset,
                        data,
                    },
                    consumed: total,
                })
            }
            _ => {
                // Directories, links, global headers: nothing for the caller.
                self.pending_name = None;
                self.pending_start = None;
                Ok(Parsed::Skip { consumed: total })
            }
        }
    }
}

fn verify_checksum(header: &[u8], offset: u64) -> Result<(), TarError> {
    let stored = parse_number(&header[148..156], "checksum", offset)?;
    let unsigned: u64 = header
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u64::from(b)
            }
        })
        .sum();
    // Some old writers summed signed bytes.
    let signed: i64 = header
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                i64::from(b as i8)
            }
        })
        .sum();
    if stored == unsigned || stored as i64 == signed {
        Ok(())
    } else {
        Err(TarError::BadChecksum { offset })
    }
}

/// Octal (NUL/space terminated) or GNU base-256 (high bit set).
fn parse_number(field: &[u8], name: &'static str, offset: u64) -> Result<u64, TarError> {
    let bad = || TarError::BadNumber {
        field: name,
        offset,
    };
    if field.first().is_some_and(|&b| b & 0x80 != 0) {
        let mut value: u64 = u64::from(field[0] & 0x7f);
        for &b in &field[1..] {
            value = value.checked_mul(256).ok_or_else(bad)? + u64::from(b);
        }
        return Ok(value);
    }
    let mut value: u64 = 0;
    let mut seen_digit = false;
    for &b in field {
        match b {
            b'0'..=b'7' => {
                value = value
                    .checked_mul(8)
                    .and_then(|v| v.checked_add(u64::from(b - b'0')))
                    .ok_or_else(bad)?;
                seen_digit = true;
            }
            b' ' if !seen_digit => {}
            0 | b' ' => break,
            _ => return Err(bad()),
        }
    }
    Ok(value)
}

fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

fn header_name(header: &[u8]) -> String {
    let name = c_string(&header[0..100]);
    let is_ustar = &header[257..262] == b"ustar";
    let prefix = if is_ustar {
        c_string(&header[345..500])
    } else {
        String::new()
    };
    if prefix.is_empty() {
        name
    } else {
        format!("{prefix}/{name}")
    }
}

/// The `path` record of a PAX extended header ("<len> path=<value>\n" records).
fn pax_path(data: &[u8]) -> Option<String> {
    let mut rest = data;
    let mut path = None;
    while !rest.is_empty() {
        let space = rest.iter().position(|&b| b == b' ')?;
        let len: usize = std::str::from_utf8(&rest[..space]).ok()?.parse().ok()?;
        if len <= space || len > rest.len() {
            return None;
        }
        let record = &rest[space + 1..len];
        let record = record.strip_suffix(b"\n").unwrap_or(record);
        if let Some(value) = record.strip_prefix(b"path=") {
            path = Some(String::from_utf8_lossy(value).into_owned());
        }
        rest = &rest[len..];
    }
    path
}

/// Writes archives (`shardfeed pack`, the demo, tests and benchmarks).
/// Headers carry no times or owners, so the same members give the same bytes.
#[derive(Debug, Default)]
pub struct TarWriter {
    out: Vec<u8>,
}

impl TarWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// A writer whose buffer holds `bytes` before it grows.
    pub fn with_capacity(bytes: usize) -> Self {
        Self {
            out: Vec::with_capacity(bytes),
        }
    }

    /// Bytes a member of `size` bytes named `name` adds to the archive.
    pub fn member_bytes(name: &str, size: u64) -> u64 {
        let block = BLOCK as u64;
        let long_name = if name.len() > 99 {
            block + (name.len() as u64 + 1).div_ceil(block) * block
        } else {
            0
        };
        long_name + block + size.div_ceil(block) * block
    }

    pub fn len(&self) -> usize {
        self.out.len()
    }

    pub fn is_empty(&self) -> bool {
        self.out.is_empty()
    }

    /// Appends a regular file. Names longer than 100 bytes get a GNU long-name entry.
    pub fn append(&mut self, name: &str, data: &[u8]) {
        if name.len() > 99 {
            let mut long = name.as_bytes().to_vec();
            long.push(0);
            self.header("././@LongLink", long.len() as u64, b'L');
            self.data(&long);
        }
        self.header(name, data.len() as u64, b'0');
        self.data(data);
    }

    fn header(&mut self, name: &str, size: u64, kind: u8) {
        let mut header = [0u8; BLOCK];
        let name_bytes = name.as_bytes();
        let n = name_bytes.len().min(100);
        header[..n].copy_from_slice(&name_bytes[..n]);
        header[100..108].copy_from_slice(b"0000644\0");
        header[108..116].copy_from_slice(b"0000000\0");
        header[116..124].copy_from_slice(b"0000000\0");
        header[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
        header[136..148].copy_from_slice(b"00000000000\0");
        header[156] = kind;
        header[257..263].copy_from_slice(b"ustar\0");
        header[263..265].copy_from_slice(b"00");
        header[148..156].fill(b' ');
        let sum: u64 = header.iter().map(|&b| u64::from(b)).sum();
        header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        self.out.extend_from_slice(&header);
    }

    fn data(&mut self, data: &[u8]) {
        self.out.extend_from_slice(data);
        let pad = data.len().div_ceil(BLOCK) * BLOCK - data.len();
        self.out.resize(self.out.len() + pad, 0);
    }

    /// Finishes the archive with two zero blocks.
    pub fn finish(mut self) -> Vec<u8> {
        self.out.resize(self.out.len() + 2 * BLOCK, 0);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(bytes: &[u8]) -> Result<Vec<(String, Vec<u8>, u64)>, TarError> {
        let mut parser = TarParser::new(0, 1 << 20);
        let mut pos = 0;
        let mut out = Vec::new();
        loop {
            match parser.parse(&bytes[pos..])? {
                Parsed::NeedMore(_) => return Err(TarError::Truncated { offset: pos as u64 }),
                Parsed::End => return Ok(out),
                Parsed::Skip { consumed } => pos += consumed,
                Parsed::Member { member, consumed } => {
                    let data = bytes[pos..][member.data.clone()].to_vec();
                    out.push((member.name, data, member.header_offset));
                    pos += consumed;
                }
            }
        }
    }

    #[test]
    fn round_trips_members_and_long_names() {
        let long = format!("{}/sample.jpg", "d".repeat(120));
        let mut writer = TarWriter::new();
        writer.append("a.jpg", b"jpeg bytes");
        writer.append("a.cls", b"7");
        writer.append(&long, &[1u8; 1000]);
        let bytes = writer.finish();
        let members = parse_all(&bytes).unwrap();
        assert_eq!(members.len(), 3);
        assert_eq!(members[0], ("a.jpg".into(), b"jpeg bytes".to_vec(), 0));
        assert_eq!(members[1].0, "a.cls");
        assert_eq!(members[2].0, long);
        assert_eq!(members[2].1.len(), 1000);
        // The long-name member starts at its GNU header, not its own.
        assert_eq!(members[2].2, 4 * BLOCK as u64);
    }

    #[test]
    fn asks_for_more_instead_of_failing_on_short_input() {
        let mut writer = TarWriter::new();
        writer.append("x.jpg", &[9u8; 700]);
        let bytes = writer.finish();
        let mut parser = TarParser::new(0, 1 << 20);
        assert_eq!(parser.parse(&bytes[..100]).unwrap(), Parsed::NeedMore(512));
        assert_eq!(
            parser.parse(&bytes[..600]).unwrap(),
            Parsed::NeedMore(512 + 1024)
        );
        assert!(matches!(
            parser.parse(&bytes).unwrap(),
            Parsed::Member { .. }
        ));
    }

    #[test]
    fn rejects_corrupt_headers_and_oversized_members() {
        let mut writer = TarWriter::new();
        writer.append("x.jpg", &[9u8; 700]);
        let mut bytes = writer.finish();
        let mut parser = TarParser::new(0, 100);
        assert!(matches!(
            parser.parse(&bytes),
            Err(TarError::MemberTooLarge { size: 700, .. })
        ));
        bytes[10] ^= 0x55;
        let mut parser = TarParser::new(0, 1 << 20);
        assert_eq!(
            parser.parse(&bytes),
            Err(TarError::BadChecksum { offset: 0 })
        );
    }

    #[test]
    fn reads_pax_paths() {
        let record = b"30 path=dir/long-name.cls\n";
        assert_eq!(record.len(), 26);
        let fixed = b"26 path=dir/long-name.cls\n";
        assert_eq!(pax_path(fixed), Some("dir/long-name.cls".into()));
        assert_eq!(pax_path(record), None);
    }

    #[test]
    fn garbage_never_panics() {
        let mut state = 12345u64;
        for len in [0usize, 1, 511, 512, 513, 1024, 4096] {
            for _ in 0..200 {
                let bytes: Vec<u8> = (0..len)
                    .map(|_| {
                        state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                        (state >> 56) as u8
                    })
                    .collect();
                let mut parser = TarParser::new(0, 1 << 16);
                let _ = parser.parse(&bytes);
            }
        }
    }
}
