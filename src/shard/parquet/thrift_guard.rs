//! A check of a footer's and each page header's Thrift bytes before the
//! parquet crate parses them, so that a hostile file costs time in
//! proportion to its bytes.
//!
//! The crate skips a field it does not know element by element, and a
//! boolean element costs it no byte: a list header claiming 2^31 booleans
//! is 2^31 turns of its loop, nine bytes make another such field, and a
//! 754-byte footer holding three pinned a thread for two minutes (under the
//! fuzzer's instrumentation; libFuzzer found the page-header form). The
//! walk here reads the bytes as the crate will: the fields the crate knows
//! with the types it reads them as, the others skipped as it skips them.
//! It refuses a list, set or map of booleans, which the format's footer
//! and page headers never hold (a valid one would not survive the crate's
//! skip anyway), and a known field sent as another type. What it accepts,
//! the crate reads in at most one loop turn per byte.

use super::chunk::ChunkBytes;

/// Deeper nesting than any footer has; the crate's own skip stops at 64.
const MAX_DEPTH: usize = 64;

/// Thrift compact protocol's type codes.
mod wire {
    pub const BOOL_TRUE: u8 = 1;
    pub const BOOL_FALSE: u8 = 2;
    pub const BYTE: u8 = 3;
    pub const I16: u8 = 4;
    pub const I32: u8 = 5;
    pub const I64: u8 = 6;
    pub const DOUBLE: u8 = 7;
    pub const BINARY: u8 = 8;
    pub const LIST: u8 = 9;
    pub const SET: u8 = 10;
    pub const MAP: u8 = 11;
    pub const STRUCT: u8 = 12;
    pub const UUID: u8 = 13;
}

/// What the crate reads a known field as.
#[derive(Clone, Copy)]
enum Kind {
    Bool,
    Byte,
    I16,
    I32,
    I64,
    Double,
    Binary,
    Struct(&'static [Field]),
    List(&'static Kind),
}

#[derive(Clone, Copy)]
struct Field(i16, Kind);

impl Kind {
    /// The type code this kind travels as inside a list (a field's bool
    /// travels in its header instead).
    fn element_code(self) -> u8 {
        match self {
            Kind::Bool => wire::BOOL_TRUE,
            Kind::Byte => wire::BYTE,
            Kind::I16 => wire::I16,
            Kind::I32 => wire::I32,
            Kind::I64 => wire::I64,
            Kind::Double => wire::DOUBLE,
            Kind::Binary => wire::BINARY,
            Kind::Struct(_) => wire::STRUCT,
            Kind::List(_) => wire::LIST,
        }
    }
}

// The format's structures (parquet.thrift) as far as the crate reads them.
use Kind::{Binary, Bool, Byte, Double, List, Struct, I16, I32, I64};

const EMPTY: &[Field] = &[];
const KEY_VALUE: &[Field] = &[Field(1, Binary), Field(2, Binary)];
const STATISTICS: &[Field] = &[
    Field(1, Binary),
    Field(2, Binary),
    Field(3, I64),
    Field(4, I64),
    Field(5, Binary),
    Field(6, Binary),
    Field(7, Bool),
    Field(8, Bool),
];
const DECIMAL: &[Field] = &[Field(1, I32), Field(2, I32)];
const TIME_UNIT: &[Field] = &[
    Field(1, Struct(EMPTY)),
    Field(2, Struct(EMPTY)),
    Field(3, Struct(EMPTY)),
];
const TIME: &[Field] = &[Field(1, Bool), Field(2, Struct(TIME_UNIT))];
const INTEGER: &[Field] = &[Field(1, Byte), Field(2, Bool)];
const VARIANT: &[Field] = &[Field(1, Byte)];
const GEOMETRY: &[Field] = &[Field(1, Binary)];
const GEOGRAPHY: &[Field] = &[Field(1, Binary), Field(2, I32)];
const LOGICAL_TYPE: &[Field] = &[
    Field(1, Struct(EMPTY)),
    Field(2, Struct(EMPTY)),
    Field(3, Struct(EMPTY)),
    Field(4, Struct(EMPTY)),
    Field(5, Struct(DECIMAL)),
    Field(6, Struct(EMPTY)),
    Field(7, Struct(TIME)),
    Field(8, Struct(TIME)),
    Field(10, Struct(INTEGER)),
    Field(11, Struct(EMPTY)),
    Field(12, Struct(EMPTY)),
    Field(13, Struct(EMPTY)),
    Field(14, Struct(EMPTY)),
    Field(15, Struct(EMPTY)),
    Field(16, Struct(VARIANT)),
    Field(17, Struct(GEOMETRY)),
    Field(18, Struct(GEOGRAPHY)),
];
const SCHEMA_ELEMENT: &[Field] = &[
    Field(1, I32),
    Field(2, I32),
    Field(3, I32),
    Field(4, Binary),
    Field(5, I32),
    Field(6, I32),
    Field(7, I32),
    Field(8, I32),
    Field(9, I32),
    Field(10, Struct(LOGICAL_TYPE)),
];
const PAGE_ENCODING_STATS: &[Field] = &[Field(1, I32), Field(2, I32), Field(3, I32)];
const SIZE_STATISTICS: &[Field] = &[Field(1, I64), Field(2, List(&I64)), Field(3, List(&I64))];
const BOUNDING_BOX: &[Field] = &[
    Field(1, Double),
    Field(2, Double),
    Field(3, Double),
    Field(4, Double),
    Field(5, Double),
    Field(6, Double),
    Field(7, Double),
    Field(8, Double),
];
const GEOSPATIAL_STATISTICS: &[Field] = &[Field(1, Struct(BOUNDING_BOX)), Field(2, List(&I32))];
const COLUMN_META_DATA: &[Field] = &[
    Field(1, I32),
    Field(2, List(&I32)),
    Field(3, List(&Binary)),
    Field(4, I32),
    Field(5, I64),
    Field(6, I64),
    Field(7, I64),
    Field(8, List(&Struct(KEY_VALUE))),
    Field(9, I64),
    Field(10, I64),
    Field(11, I64),
    Field(12, Struct(STATISTICS)),
    Field(13, List(&Struct(PAGE_ENCODING_STATS))),
    Field(14, I64),
    Field(15, I32),
    Field(16, Struct(SIZE_STATISTICS)),
    Field(17, Struct(GEOSPATIAL_STATISTICS)),
];
const COLUMN_KEY: &[Field] = &[Field(1, List(&Binary)), Field(2, Binary)];
const COLUMN_CRYPTO: &[Field] = &[Field(1, Struct(EMPTY)), Field(2, Struct(COLUMN_KEY))];
const COLUMN_CHUNK: &[Field] = &[
    Field(1, Binary),
    Field(2, I64),
    Field(3, Struct(COLUMN_META_DATA)),
    Field(4, I64),
    Field(5, I32),
    Field(6, I64),
    Field(7, I32),
    Field(8, Struct(COLUMN_CRYPTO)),
    Field(9, Binary),
];
const SORTING_COLUMN: &[Field] = &[Field(1, I32), Field(2, Bool), Field(3, Bool)];
const ROW_GROUP: &[Field] = &[
    Field(1, List(&Struct(COLUMN_CHUNK))),
    Field(2, I64),
    Field(3, I64),
    Field(4, List(&Struct(SORTING_COLUMN))),
    Field(5, I64),
    Field(6, I64),
    Field(7, I16),
];
const COLUMN_ORDER: &[Field] = &[Field(1, Struct(EMPTY))];
const AES: &[Field] = &[Field(1, Binary), Field(2, Binary), Field(3, Bool)];
const ENCRYPTION: &[Field] = &[Field(1, Struct(AES)), Field(2, Struct(AES))];
const FILE_META_DATA: &[Field] = &[
    Field(1, I32),
    Field(2, List(&Struct(SCHEMA_ELEMENT))),
    Field(3, I64),
    Field(4, List(&Struct(ROW_GROUP))),
    Field(5, List(&Struct(KEY_VALUE))),
    Field(6, Binary),
    Field(7, List(&Struct(COLUMN_ORDER))),
    Field(8, Struct(ENCRYPTION)),
    Field(9, Binary),
];
const DATA_PAGE: &[Field] = &[
    Field(1, I32),
    Field(2, I32),
    Field(3, I32),
    Field(4, I32),
    Field(5, Struct(STATISTICS)),
];
const DICTIONARY_PAGE: &[Field] = &[Field(1, I32), Field(2, I32), Field(3, Bool)];
const DATA_PAGE_V2: &[Field] = &[
    Field(1, I32),
    Field(2, I32),
    Field(3, I32),
    Field(4, I32),
    Field(5, I32),
    Field(6, I32),
    Field(7, Bool),
    Field(8, Struct(STATISTICS)),
];
/// Field 3 is the page's compressed size: where the next header starts.
const PAGE_HEADER: &[Field] = &[
    Field(1, I32),
    Field(2, I32),
    Field(3, I32),
    Field(4, I32),
    Field(5, Struct(DATA_PAGE)),
    Field(6, Struct(EMPTY)),
    Field(7, Struct(DICTIONARY_PAGE)),
    Field(8, Struct(DATA_PAGE_V2)),
];

/// Bytes read front to back.
trait Source {
    fn byte(&mut self) -> Result<u8, String>;
    fn skip(&mut self, n: u64) -> Result<(), String>;
    fn remaining(&self) -> u64;
}

struct Slice<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Source for Slice<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let byte = *self.bytes.get(self.at).ok_or("it ends inside a value")?;
        self.at += 1;
        Ok(byte)
    }

    fn skip(&mut self, n: u64) -> Result<(), String> {
        if n > self.remaining() {
            return Err(format!("a value claims {n} bytes past its end"));
        }
        self.at += n as usize;
        Ok(())
    }

    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.at) as u64
    }
}

struct Walk<'s, S> {
    source: &'s mut S,
    /// The page header's compressed size (field 3 at the top level).
    compressed_size: Option<i64>,
    /// The page header's uncompressed size (field 2 at the top level).
    uncompressed_size: Option<i64>,
    /// A v2 data page's definition and repetition level bytes (its fields
    /// 5 and 6), stored uncompressed ahead of its values.
    levels: i64,
    /// A v2 data page's `is_compressed` (field 7; absent means true).
    values_compressed: bool,
    /// Column chunks the footer's row groups list, counted from their
    /// lists' headers.
    column_chunks: u64,
    /// The next list header read is a row group's column chunks.
    counting_chunks: bool,
    /// The id of the field being read: a structure's parent, for those it
    /// holds. (The field tables are consts, whose addresses are not
    /// theirs alone: a structure is known by where it sits, not by
    /// pointer.)
    field_id: i64,
}

impl<'s, S> Walk<'s, S> {
    fn new(source: &'s mut S) -> Self {
        Self {
            source,
            compressed_size: None,
            uncompressed_size: None,
            levels: 0,
            values_compressed: true,
            column_chunks: 0,
            counting_chunks: false,
            field_id: 0,
        }
    }
}

impl<S: Source> Walk<'_, S> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.source.byte()?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("a varint runs past ten bytes".into())
    }

    fn zigzag(&mut self) -> Result<i64, String> {
        let raw = self.varint()?;
        Ok((raw >> 1) as i64 ^ -((raw & 1) as i64))
    }

    /// A collection's element count, each element at least a byte.
    fn count(&mut self, count: u64) -> Result<u64, String> {
        if count > self.source.remaining() {
            return Err(format!(
                "a collection claims {count} elements in {} bytes",
                self.source.remaining()
            ));
        }
        Ok(count)
    }

    /// A list or set header: (element type, count).
    fn list_header(&mut self) -> Result<(u8, u64), String> {
        let header = self.source.byte()?;
        let size = u64::from(header >> 4);
        let size = if size == 15 { self.varint()? } else { size };
        let count = self.count(size)?;
        Ok((header & 0x0f, count))
    }

    fn structure(&mut self, fields: &[Field], depth: usize, top: bool) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("structures nest deeper than 64".into());
        }
        let parent = self.field_id;
        // A page header's DataPageHeaderV2 (its field 8), and a footer's
        // RowGroup (an element of its field 4).
        let v2_page = depth == 1 && parent == 8;
        let row_group = depth == 2 && parent == 4;
        let mut last_id = 0i64;
        loop {
            let header = self.source.byte()?;
            if header == 0 {
                return Ok(());
            }
            let code = header & 0x0f;
            let delta = i64::from(header >> 4);
            let id = if delta == 0 {
                self.zigzag()?
            } else {
                last_id + delta
            };
            last_id = id;
            match fields.iter().find(|field| i64::from(field.0) == id) {
                Some(&Field(_, kind)) => {
                    self.counting_chunks = row_group && id == 1;
                    self.field_id = id;
                    let value = self.field(kind, code, depth)?;
                    match (top, v2_page, id) {
                        (true, _, 2) => self.uncompressed_size = value,
                        (true, _, 3) => self.compressed_size = value,
                        (false, true, 5 | 6) => {
                            self.levels = self.levels.saturating_add(value.unwrap_or(0));
                        }
                        (false, true, 7) => self.values_compressed = code == wire::BOOL_TRUE,
                        _ => {}
                    }
                }
                None => self.skip(code, depth + 1)?,
            }
        }
    }

    /// A known field as the crate reads it; an integer's value.
    fn field(&mut self, kind: Kind, code: u8, depth: usize) -> Result<Option<i64>, String> {
        let sent_as = match kind {
            Kind::Bool => code == wire::BOOL_TRUE || code == wire::BOOL_FALSE,
            other => code == other.element_code(),
        };
        if !sent_as {
            return Err(format!("a known field is sent as type {code}"));
        }
        if let Kind::Bool = kind {
            return Ok(None);
        }
        self.value(kind, depth)
    }

    /// A value of a known kind (a list's element, or a field's value).
    fn value(&mut self, kind: Kind, depth: usize) -> Result<Option<i64>, String> {
        match kind {
            Kind::Bool => {
                self.source.byte()?;
            }
            Kind::Byte => {
                self.source.byte()?;
            }
            Kind::I16 | Kind::I32 | Kind::I64 => return self.zigzag().map(Some),
            Kind::Double => self.source.skip(8)?,
            Kind::Binary => {
                let len = self.varint()?;
                self.source.skip(len)?;
            }
            Kind::Struct(fields) => self.structure(fields, depth + 1, false)?,
            Kind::List(element) => {
                let (code, count) = self.list_header()?;
                if std::mem::take(&mut self.counting_chunks) {
                    self.column_chunks = self.column_chunks.saturating_add(count);
                }
                if count > 0 && code != element.element_code() {
                    return Err(format!("a known list holds type {code}"));
                }
                // Each element is held by the list's field.
                let list_field = self.field_id;
                for _ in 0..count {
                    self.field_id = list_field;
                    self.value(*element, depth + 1)?;
                }
            }
        }
        Ok(None)
    }

    /// An unknown field, skipped as the crate skips it: a boolean costs it
    /// no byte, so a collection of them is refused.
    fn skip(&mut self, code: u8, depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("structures nest deeper than 64".into());
        }
        match code {
            wire::BOOL_TRUE | wire::BOOL_FALSE => {}
            wire::BYTE => {
                self.source.byte()?;
            }
            wire::I16 | wire::I32 | wire::I64 => {
                self.varint()?;
            }
            wire::DOUBLE => self.source.skip(8)?,
            wire::BINARY => {
                let len = self.varint()?;
                self.source.skip(len)?;
            }
            wire::UUID => self.source.skip(16)?,
            wire::STRUCT => self.structure(&[], depth, false)?,
            wire::LIST | wire::SET => {
                let (element, count) = self.list_header()?;
                if count > 0 && matches!(element, wire::BOOL_TRUE | wire::BOOL_FALSE) {
                    return Err(format!("an unknown field is a list of {count} booleans"));
                }
                for _ in 0..count {
                    self.skip(element, depth + 1)?;
                }
            }
            wire::MAP => {
                let size = self.varint()?;
                if size > 0 {
                    let types = self.source.byte()?;
                    let (key, value) = (types >> 4, types & 0x0f);
                    let boolean = |code| matches!(code, wire::BOOL_TRUE | wire::BOOL_FALSE);
                    if boolean(key) && boolean(value) {
                        return Err(format!("an unknown field is a map of {size} booleans"));
                    }
                    for _ in 0..self.count(size)? {
                        self.skip(key, depth + 1)?;
                        self.skip(value, depth + 1)?;
                    }
                }
            }
            other => return Err(format!("a field has the unknown type {other}")),
        }
        Ok(())
    }
}

/// Checks a footer's metadata (the Thrift `FileMetaData`) and returns the
/// column chunks its row groups list: what parsing it will hold in
/// memory, known before it is parsed.
pub fn check_footer(metadata: &[u8]) -> Result<u64, String> {
    let mut source = Slice {
        bytes: metadata,
        at: 0,
    };
    let mut walk = Walk::new(&mut source);
    walk.structure(FILE_META_DATA, 0, false)
        .map_err(|why| format!("the footer's metadata is malformed: {why}"))?;
    Ok(walk.column_chunks)
}

/// Reads a column chunk front to back as the page reader will.
struct ChunkSource<'a> {
    chunk: &'a ChunkBytes,
    at: u64,
}

impl Source for ChunkSource<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let byte = self
            .chunk
            .byte_at(self.at)
            .ok_or("it ends inside a value")?;
        self.at += 1;
        Ok(byte)
    }

    fn skip(&mut self, n: u64) -> Result<(), String> {
        if n > self.remaining() {
            return Err(format!("a value claims {n} bytes past its end"));
        }
        self.at += n;
        Ok(())
    }

    fn remaining(&self) -> u64 {
        self.chunk.chunk_len() - self.at
    }
}

/// One page as its header describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageClaim {
    /// Its bytes decompressed, v2 levels included (the header's field 2).
    pub decompressed: u64,
    /// Where its body lies in the chunk, `(start, length)`; `None` where
    /// the header gives no length or the body runs past the chunk (the
    /// crate reports either itself, in bytes it reads).
    pub body: Option<(u64, u64)>,
    /// Level bytes stored uncompressed at the body's start (v2 pages).
    pub levels: u64,
    /// Whether the rest of the body goes through the chunk's codec.
    pub compressed: bool,
}

/// Checks every page header of a column chunk, each where the one before
/// says its page ends, and hands each page's claim to `each` before the
/// next header is read: the caller holds the claims to the footer's
/// figure (headers not counted: the footer's figure counts them, and a
/// writer that leaves them out is still within it) and bounds what the
/// body expands to, before any page is decompressed, since a decompressor
/// sizes its output by the claim. A page size the crate cannot follow
/// stops the walk: the crate reports that itself, in bytes it reads.
pub fn check_page_headers(
    chunk: &ChunkBytes,
    mut each: impl FnMut(&PageClaim) -> Result<(), String>,
) -> Result<(), String> {
    let mut source = ChunkSource { chunk, at: 0 };
    while source.remaining() > 0 {
        let mut walk = Walk::new(&mut source);
        walk.structure(PAGE_HEADER, 0, true)
            .map_err(|why| format!("a page header is malformed: {why}"))?;
        let claim = |size: Option<i64>| size.map(|size| u64::try_from(size).unwrap_or(u64::MAX));
        let decompressed = claim(walk.uncompressed_size).unwrap_or(0);
        let stored = claim(walk.compressed_size);
        let levels = u64::try_from(walk.levels).unwrap_or(u64::MAX);
        let compressed = walk.values_compressed;
        let start = source.at;
        let body = stored.filter(|&size| size <= source.remaining());
        each(&PageClaim {
            decompressed,
            body: body.map(|size| (start, size)),
            levels,
            compressed,
        })?;
        match body {
            Some(size) => source.skip(size)?,
            None => return Ok(()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list_of_booleans_field(id_zigzag: u8) -> Vec<u8> {
        // A long-form field header (type list), then a list header of
        // 2^31 - 1 booleans.
        vec![
            wire::LIST,
            id_zigzag,
            0x01,
            0xF1,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
            0x07,
        ]
    }

    #[test]
    fn a_list_of_booleans_in_an_unknown_field_is_refused_before_the_crate_loops_on_it() {
        let mut footer = list_of_booleans_field(0xC8);
        footer.push(0);
        let why = check_footer(&footer).unwrap_err();
        assert!(why.contains("claims 2147483647 elements"), "{why}");
        // Within its bytes it still names the booleans.
        let mut footer = vec![wire::LIST, 0xC8, 0x01, 0x31, 1, 0, 1, 0];
        footer.push(0);
        let why = check_footer(&footer).unwrap_err();
        assert!(why.contains("list of 3 booleans"), "{why}");
    }

    #[test]
    fn unknown_fields_of_other_types_are_skipped_as_the_crate_skips_them() {
        // Field 100: a list of two i32; field 101 (delta 1): a binary of 3.
        let footer = [
            wire::LIST,
            0xC8,
            0x01,
            0x25,
            0x02,
            0x04,
            0x18 | wire::BINARY,
            3,
            b'a',
            b'b',
            b'c',
            0,
        ];
        check_footer(&footer).unwrap();
    }

    #[test]
    fn a_known_field_sent_as_another_type_is_refused() {
        // FileMetaData field 3 (num_rows, i64) sent as a list.
        let footer = [0x30 | wire::LIST, 0x00, 0];
        assert!(check_footer(&footer)
            .unwrap_err()
            .contains("sent as type 9"));
    }

    /// A data page header of `data` bytes (uncompressed, one value),
    /// `extra` before its stop byte.
    fn page(data: &[u8], extra: &[u8]) -> Vec<u8> {
        let size = (data.len() as u8) << 1;
        let mut bytes = vec![0x15, 0x00, 0x15, size, 0x15, size];
        // Field 5: the DataPageHeader (num_values 1, encodings 0).
        bytes.extend([0x2C, 0x15, 0x02, 0x15, 0x00, 0x15, 0x00, 0x15, 0x00, 0x00]);
        bytes.extend(extra);
        bytes.push(0);
        bytes.extend(data);
        bytes
    }

    fn chunk(pages: &[Vec<u8>]) -> ChunkBytes {
        let joined: Vec<u8> = pages.concat();
        // In two parts, as the reader's GETs deliver them.
        let half = joined.len() / 2;
        let joined = bytes::Bytes::from(joined);
        ChunkBytes::new(4, vec![joined.slice(..half), joined.slice(half..)])
    }

    #[test]
    fn every_page_header_of_a_chunk_is_walked_where_the_one_before_ends() {
        let good = chunk(&[page(b"abcd", &[]), page(b"efghij", &[])]);
        // The pages' claimed (here: their real) data, and where each lies.
        let mut claims = Vec::new();
        check_page_headers(&good, |page| {
            claims.push((page.decompressed, page.body));
            Ok(())
        })
        .unwrap();
        let second = page(b"abcd", &[]).len() as u64;
        assert_eq!(
            claims,
            [(4, Some((second - 4, 4))), (6, Some((2 * second - 4, 6)))]
        );
        // A caller's refusal stops the walk there.
        let mut seen = 0;
        let why = check_page_headers(&good, |_| {
            seen += 1;
            Err("held".into())
        });
        assert_eq!((why, seen), (Err("held".into()), 1));
        // The second page's header carries the booleans.
        let booleans = list_of_booleans_field(0xC8);
        let bad = chunk(&[page(b"abcd", &[]), page(b"efgh", &booleans)]);
        let why = check_page_headers(&bad, |_| Ok(())).unwrap_err();
        assert!(
            why.contains("page header") && why.contains("claims"),
            "{why}"
        );
        let short = chunk(&[
            page(b"abcd", &[]),
            page(b"efgh", &[0x09, 0xC8, 0x01, 0x21, 1, 0]),
        ]);
        let why = check_page_headers(&short, |_| Ok(())).unwrap_err();
        assert!(why.contains("list of 2 booleans"), "{why}");
    }

    #[test]
    fn a_v2_pages_level_bytes_and_compression_flag_are_read_from_its_header() {
        let body = b"lvlsdfvalues";
        let size = (body.len() as u8) << 1;
        // DATA_PAGE_V2 (3), sizes, then field 8: num_values 1, nulls 0,
        // rows 1, encoding 0, definition levels 4 bytes, repetition 2,
        // is_compressed false.
        let mut v2 = vec![0x15, 0x06, 0x15, size, 0x15, size, 0x5C];
        v2.extend([0x15, 0x02, 0x15, 0x00, 0x15, 0x02, 0x15, 0x00]);
        v2.extend([0x15, 0x08, 0x15, 0x04, 0x12, 0x00, 0x00]);
        v2.extend(body);
        let mut claims = Vec::new();
        check_page_headers(&chunk(&[v2]), |claim| {
            claims.push(*claim);
            Ok(())
        })
        .unwrap();
        assert_eq!(claims.len(), 1);
        assert_eq!((claims[0].levels, claims[0].compressed), (6, false));
        assert_eq!(claims[0].decompressed, body.len() as u64);
        // A v1 page's own fields 5 and 6 are not levels.
        let mut claims = Vec::new();
        check_page_headers(&chunk(&[page(b"abcd", &[])]), |claim| {
            claims.push(*claim);
            Ok(())
        })
        .unwrap();
        assert_eq!((claims[0].levels, claims[0].compressed), (0, true));
    }

    #[test]
    #[cfg(feature = "dev")] // files written by the dev writer
    fn a_footers_column_chunks_are_counted_before_it_is_parsed() {
        use crate::dev::parquet_files::{self, Layout, Row};
        let rows: Vec<Row> = (0..7)
            .map(|i| Row {
                image: Some(vec![i; 10]),
                path: Some(format!("{i}.jpg")),
                label: Some(i64::from(i)),
            })
            .collect();
        // 3 row groups (3, 3, 1 rows) of 3 columns: image.bytes,
        // image.path, label.
        let layout = Layout {
            rows_per_group: 3,
            ..Layout::default()
        };
        let file = parquet_files::write(&rows, &layout).unwrap();
        let size = file.len() as u64;
        let range = crate::shard::parquet::footer::metadata_range(&file, size).unwrap();
        let metadata = &file[range.start as usize..range.end as usize];
        assert_eq!(check_footer(metadata), Ok(9));
    }

    #[test]
    fn truncated_bytes_are_refused_not_read_past() {
        assert!(check_footer(&[0x18 | wire::BINARY, 0x7f]).is_err());
        assert!(check_footer(&[0x15, 0xff]).is_err());
        assert!(check_footer(&[]).is_err());
    }
}
