//! The on-disk form of one decoded-source record: its full key, the
//! source's geometry and pixels, and a CRC-32 of all of it.

use crate::decode::source::{SourceForm, SourceKind, StoredSource};

const MAGIC: &[u8; 8] = b"SFDSRC01";
/// Most bytes a record's key may have.
const MAX_KEY_BYTES: usize = 4096;

/// Which derivation made a record: bumped whenever a release derives other
/// bytes from the same original, so a tier kept across an upgrade never
/// mixes the two in one epoch (the old records are not found, and age
/// out). 2: DCT-scaled boxes mapped by the exact factor.
const DERIVATION: u32 = 2;

/// A record's full key: the sample (its shard's location and ETag, its
/// key), the form and the derivation.
pub(super) fn full_key(record: &str, form: &SourceForm) -> String {
    format!("{record}\n{form}\nderivation {DERIVATION}")
}

pub(super) fn record_name(key: &str) -> u64 {
    crate::hash::fmix64(crate::hash::fnv1a(key.bytes()))
}

fn kind_code(kind: SourceKind) -> (u8, u8) {
    match kind {
        SourceKind::Raw => (0, 0),
        SourceKind::Yuv420 => (1, 0),
        SourceKind::Jpeg { quality } => (2, quality),
    }
}

/// `MAGIC, key length u32, key, kind u8, quality u8, width, height, original
/// width, original height (u32 each), payload length u64, payload, CRC-32 of
/// all before it` (little endian).
pub(super) fn encode_record(key: &str, form: &SourceForm, source: &StoredSource) -> Vec<u8> {
    let (kind, quality) = kind_code(form.kind);
    let mut out = Vec::with_capacity(64 + key.len() + source.bytes.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&[kind, quality]);
    for side in [
        source.width,
        source.height,
        source.original_width,
        source.original_height,
    ] {
        out.extend_from_slice(&side.to_le_bytes());
    }
    out.extend_from_slice(&(source.bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(&source.bytes);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

pub(super) fn parse_record(
    data: &[u8],
    key: &str,
    form: &SourceForm,
) -> Result<StoredSource, &'static str> {
    let body_len = data.len().checked_sub(4).ok_or("truncated")?;
    let (body, crc) = data.split_at(body_len);
    if crc32fast::hash(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
        return Err("checksum mismatch");
    }
    let mut reader = Reader { data: body, at: 0 };
    if reader.take(MAGIC.len())? != MAGIC {
        return Err("not a decoded-source record");
    }
    let key_len = reader.u32()? as usize;
    if key_len > MAX_KEY_BYTES || reader.take(key_len)? != key.as_bytes() {
        return Err("another sample's record");
    }
    let (kind, quality) = kind_code(form.kind);
    if reader.take(2)? != [kind, quality] {
        return Err("another form's record");
    }
    let kind = form.kind;
    let (width, height) = (reader.u32()?, reader.u32()?);
    let (original_width, original_height) = (reader.u32()?, reader.u32()?);
    let payload = reader.u64()? as usize;
    let bytes = reader.take(payload)?.to_vec();
    if reader.at != body.len() {
        return Err("trailing bytes");
    }
    Ok(StoredSource {
        kind,
        width,
        height,
        original_width,
        original_height,
        bytes,
    })
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        let end = self.at.checked_add(n).ok_or("truncated")?;
        let slice = self.data.get(self.at..end).ok_or("truncated")?;
        self.at = end;
        Ok(slice)
    }

    fn u32(&mut self) -> Result<u32, &'static str> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, &'static str> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::tier::records) fn form() -> SourceForm {
        SourceForm {
            shorter_side: 64,
            kind: SourceKind::Raw,
        }
    }

    pub(in crate::tier::records) fn source(seed: u8) -> StoredSource {
        StoredSource {
            kind: SourceKind::Raw,
            width: 8,
            height: 4,
            original_width: 16,
            original_height: 8,
            bytes: vec![seed; 8 * 4 * 3],
        }
    }

    #[test]
    fn a_record_round_trips_and_any_damage_is_caught() {
        let key = full_key("s3://b/shard-0.tar\netag\nk1", &form());
        let record = encode_record(&key, &form(), &source(7));
        assert_eq!(parse_record(&record, &key, &form()).unwrap(), source(7));
        for at in [0, 12, record.len() / 2, record.len() - 1] {
            let mut damaged = record.clone();
            damaged[at] ^= 1;
            assert!(parse_record(&damaged, &key, &form()).is_err(), "byte {at}");
        }
        assert_eq!(
            parse_record(&record[..record.len() - 9], &key, &form()),
            Err("checksum mismatch")
        );
        let other = full_key("s3://b/shard-0.tar\nnew-etag\nk1", &form());
        assert_eq!(
            parse_record(&record, &other, &form()),
            Err("another sample's record")
        );
    }

    #[test]
    fn a_record_of_another_derivation_is_neither_found_nor_accepted() {
        let key = full_key("s3://b/shard-0.tar\netag\nk1", &form());
        let current = format!("derivation {DERIVATION}");
        for derivation in [1, DERIVATION + 1] {
            let older = key.replace(&current, &format!("derivation {derivation}"));
            assert_ne!(older, key);
            // Another file name: a lookup never opens it...
            assert_ne!(record_name(&older), record_name(&key));
            // ...and were the names to collide, its key would refuse it.
            let record = encode_record(&older, &form(), &source(7));
            assert_eq!(
                parse_record(&record, &key, &form()),
                Err("another sample's record")
            );
        }
    }
}
