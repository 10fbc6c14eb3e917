//! Pages the crate would decompress without a bound, run through their
//! decompressor here first into nothing, at most their header's claim.
//!
//! The crate sizes Snappy, LZ4_RAW, Hadoop-framed LZ4 and ZSTD output by
//! the page header's claim (which the caller holds to the footer's figure),
//! but it reads GZIP to its end, and an LZ4 page that is not Hadoop-framed
//! it reads as an LZ4 frame to its end: 75 KB of gzip became 1.2 GB in one
//! buffer. Such a page is decompressed here into a sink, counting at most
//! claim + 1 bytes (the decoder's window and an 8 KiB copy buffer held), and
//! one that yields more is refused before the crate reads it. The price is
//! a GZIP page decompressed twice; the Hub's image datasets are Snappy or
//! ZSTD, which cost nothing here.

use std::io::{self, Read};

use parquet::basic::Compression;

use super::chunk::ChunkBytes;
use super::thrift_guard::PageClaim;

/// Refuses `page` if its body decompresses past its claim, for the codecs
/// the crate runs unbounded.
pub fn check_page_body(
    chunk: &ChunkBytes,
    codec: Compression,
    page: &PageClaim,
) -> Result<(), String> {
    let Some((start, stored)) = page.body else {
        return Ok(());
    };
    // Past its stored bytes, or not compressed: the crate reads no codec
    // (and reports the former itself).
    if !page.compressed || page.levels > stored {
        return Ok(());
    }
    let values = chunk
        .read_from(start.saturating_add(page.levels))
        .take(stored - page.levels);
    let claim = page.decompressed.saturating_sub(page.levels);
    let yielded = match codec {
        Compression::GZIP(_) => {
            // The crate reads every member of a multi-member stream.
            let decoder = flate2::read::MultiGzDecoder::new(values);
            count_up_to(decoder, claim)
                .map_err(|error| format!("a GZIP page does not decompress: {error}"))?
        }
        // Only the crate's fallback after a failed Hadoop read runs
        // unbounded; a frame that fails here fails there too, within the
        // bytes counted, and the crate names it.
        Compression::LZ4 => {
            count_up_to(lz4_flex::frame::FrameDecoder::new(values), claim).unwrap_or(0)
        }
        _ => return Ok(()),
    };
    if yielded > claim {
        return Err(format!(
            "a {codec} page decompresses past the {claim} bytes its header claims"
        ));
    }
    Ok(())
}

/// The bytes `decoder` yields, reading at most `claim + 1`.
fn count_up_to(decoder: impl Read, claim: u64) -> io::Result<u64> {
    io::copy(&mut decoder.take(claim.saturating_add(1)), &mut io::sink())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use bytes::Bytes;

    use super::*;

    fn page(body: &[u8], decompressed: u64) -> (ChunkBytes, PageClaim) {
        // Split in two parts so the body is read across them.
        let (a, b) = body.split_at(body.len() / 2);
        let chunk = ChunkBytes::new(
            100,
            vec![Bytes::copy_from_slice(a), Bytes::copy_from_slice(b)],
        );
        let claim = PageClaim {
            decompressed,
            body: Some((0, body.len() as u64)),
            levels: 0,
            compressed: true,
        };
        (chunk, claim)
    }

    fn gzip_codec() -> Compression {
        Compression::GZIP(Default::default())
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    fn lz4_frame(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::new());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn a_page_within_its_claim_passes_and_one_past_it_is_refused() {
        let values = vec![7u8; 1 << 20];
        for (codec, body) in [
            (gzip_codec(), gzip(&values)),
            (Compression::LZ4, lz4_frame(&values)),
        ] {
            let (chunk, claim) = page(&body, values.len() as u64);
            check_page_body(&chunk, codec, &claim).unwrap();
            let (chunk, claim) = page(&body, 4096);
            let why = check_page_body(&chunk, codec, &claim).unwrap_err();
            assert!(why.contains("past the 4096 bytes"), "{codec}: {why}");
        }
    }

    #[test]
    fn a_v2_pages_levels_are_stored_plain_ahead_of_its_values() {
        let values = vec![3u8; 10_000];
        let mut body = vec![0xAA; 6];
        body.extend(gzip(&values));
        let (chunk, mut claim) = page(&body, 6 + values.len() as u64);
        claim.levels = 6;
        check_page_body(&chunk, gzip_codec(), &claim).unwrap();
        claim.decompressed = 6 + 100;
        assert!(check_page_body(&chunk, gzip_codec(), &claim).is_err());
        // Values stored plain: no codec runs.
        claim.compressed = false;
        check_page_body(&chunk, gzip_codec(), &claim).unwrap();
    }

    #[test]
    fn a_gzip_page_that_is_not_gzip_is_named() {
        let (chunk, claim) = page(b"not gzip at all", 100);
        let why = check_page_body(&chunk, gzip_codec(), &claim).unwrap_err();
        assert!(why.contains("does not decompress"), "{why}");
        // Not an LZ4 frame (a Hadoop page, say): the crate's own reader decides.
        check_page_body(&chunk, Compression::LZ4, &claim).unwrap();
    }
}
