//! What a JPEG's headers say, read by walking its marker segments: the
//! frame (size, process, components), whether the file is whole, and
//! whether it defines the tables its first scan uses. No decoder state, no
//! copy: every sample's headers are read before its crop box is chosen.

use super::error::DecodeError;

/// A JPEG's size from its frame header, found by walking the marker
/// segments: no copy and no decoder state, where the `image` crate's reader
/// copies the whole file first (every sample's size is read before its box
/// is chosen). None when no frame header comes before the scan data.
pub fn jpeg_dimensions(data: &[u8]) -> Option<(u32, u32)> {
    jpeg_frame(data).map(|frame| (frame.width, frame.height))
}

/// What a JPEG's frame header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegFrame {
    pub width: u32,
    pub height: u32,
    /// The SOF marker's low nibble: 0 baseline, 1 extended sequential,
    /// 2 progressive, 3 lossless, 9.. arithmetic-coded.
    pub process: u8,
    pub precision: u8,
    pub components: u8,
}

impl JpegFrame {
    /// Huffman-coded sequential 8-bit grey or YCbCr: what every JPEG
    /// decoder takes, GPU hardware engines included (they refuse
    /// progressive, arithmetic, 12-bit and CMYK images).
    pub fn is_baseline(&self) -> bool {
        self.process <= 1 && self.precision == 8 && matches!(self.components, 1 | 3)
    }
}

/// The frame header of a JPEG (see [`jpeg_dimensions`]).
pub fn jpeg_frame(data: &[u8]) -> Option<JpegFrame> {
    let (marker, at) = jpeg_segments(data).find(|&(marker, _)| {
        // SOF0..SOF15, except DHT, JPG and DAC, which share the range.
        marker == 0xDA || matches!(marker, 0xC0..=0xCF) && !matches!(marker, 0xC4 | 0xC8 | 0xCC)
    })?;
    if marker == 0xDA {
        return None; // start of scan before any frame header
    }
    let field = |offset: usize| data.get(at + 4 + offset).copied();
    let precision = field(0)?;
    let height = u16::from_be_bytes([field(1)?, field(2)?]);
    let width = u16::from_be_bytes([field(3)?, field(4)?]);
    let components = field(5)?;
    (width > 0 && height > 0).then_some(JpegFrame {
        width: u32::from(width),
        height: u32::from(height),
        process: marker & 0x0F,
        precision,
        components,
    })
}

/// Checks that a JPEG is whole and its scans well-formed, by walking the
/// entropy-coded data after the first start-of-scan to the end-of-image
/// marker (data some writers append after it is allowed).
///
/// Whole: a JPEG cut short (a truncated upload or copy) is not the image;
/// libjpeg-turbo warns "premature end of data", other decoders fill the
/// missing rows in. Well-formed: inside a scan a `FF` byte may only be
/// followed by a stuffed `00`, a fill `FF` or a restart marker in sequence
/// (`D0`, `D1`, ... `D7`, `D0` ...); between scans come only the segments a
/// multi-scan image carries (tables, restart interval, comments,
/// application data, the next scan's header). Anything else is corrupt
/// entropy-coded data, which libjpeg refuses ("Unsupported marker type",
/// "Corrupt JPEG data") but a GPU decoder such as nvJPEG decodes into
/// garbage pixels without an error: encoded delivery sends compressed only
/// images this check passes, so no decoder sees what the server's refuses
/// for it. (Damage that keeps the marker syntax, such as a bad Huffman
/// code, is not seen here: telling it needs the full entropy decode.)
pub fn check_jpeg_complete(data: &[u8]) -> Result<(), DecodeError> {
    let premature =
        || DecodeError::Corrupt("premature end of JPEG data (no end-of-image marker)".into());
    let (_, scan) = jpeg_segments(data)
        .find(|&(marker, _)| marker == 0xDA)
        .ok_or_else(premature)?;
    let mut at = segment_end(data, scan).ok_or_else(premature)?;
    let mut next_restart = 0xD0u8;
    loop {
        let here =
            at + memchr::memchr(0xFF, data.get(at..).unwrap_or_default()).ok_or_else(premature)?;
        let marker = *data.get(here + 1).ok_or_else(premature)?;
        at = match marker {
            0x00 => here + 2,
            0xFF => here + 1,
            0xD0..=0xD7 if marker == next_restart => {
                next_restart = if marker == 0xD7 { 0xD0 } else { marker + 1 };
                here + 2
            }
            0xD9 => return end_of_image(data, here),
            0xC4 | 0xDA | 0xDB | 0xDD | 0xE0..=0xEF | 0xFE => {
                if marker == 0xDA {
                    next_restart = 0xD0;
                }
                segment_end(data, here).ok_or_else(premature)?
            }
            _ => {
                return Err(DecodeError::Corrupt(format!(
                    "corrupt JPEG data: marker 0xFF{marker:02X} inside the entropy-coded data at byte {here}"
                )))
            }
        };
    }
}

/// The scan's end-of-image marker at `at`: the image's end, unless what
/// follows it is more scan data ending in the real one (corrupt bytes that
/// happen to read `FF D9`). Data appended after the end (padding, a
/// trailer, a second image from `FF D8` on) is allowed.
fn end_of_image(data: &[u8], at: usize) -> Result<(), DecodeError> {
    let rest = &data[at + 2..];
    if rest.len() > 2 && rest.ends_with(&[0xFF, 0xD9]) && !rest.starts_with(&[0xFF, 0xD8]) {
        return Err(DecodeError::Corrupt(format!(
            "corrupt JPEG data: an end-of-image marker inside the entropy-coded data at byte {at}"
        )));
    }
    Ok(())
}

/// Where the marker segment whose `FF` is at `at` ends; None when its
/// length is malformed or runs past the data.
fn segment_end(data: &[u8], at: usize) -> Option<usize> {
    let length = usize::from(u16::from_be_bytes([*data.get(at + 2)?, *data.get(at + 3)?]));
    let end = at + 2 + length;
    (length >= 2 && end <= data.len()).then_some(end)
}

/// Whether the headers define the Huffman tables the first scan uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JpegTables {
    Complete,
    /// Huffman tables left to the decoder's defaults (Motion-JPEG frames).
    DefaultHuffman,
}

/// Checks that a JPEG's headers define every quantization table its frame
/// names, and says whether they define the Huffman tables its first scan
/// uses. libjpeg keeps the tables of the last image a decompressor read, to
/// serve abbreviated streams: a reused handle would decode an image that
/// lacks them with another image's tables, so the output would depend on
/// what the thread decoded before. An image without its quantization tables
/// is corrupt (every decoder but that one refuses it); one without Huffman
/// tables takes the standard ones, which only a fresh decoder applies.
pub fn check_jpeg_tables(data: &[u8]) -> Result<JpegTables, DecodeError> {
    let mut quantization = [false; 4];
    let mut huffman = [[false; 4]; 2];
    let mut frame: Option<(u8, Vec<u8>)> = None;
    for (marker, at) in jpeg_segments(data) {
        let payload = segment_payload(data, at);
        match marker {
            0xDB => {
                let mut rest = payload;
                while let Some((&spec, tail)) = rest.split_first() {
                    quantization[usize::from(spec & 0x03)] = true;
                    let size = if spec >> 4 == 0 { 64 } else { 128 };
                    rest = tail.get(size..).unwrap_or_default();
                }
            }
            0xC4 => {
                let mut rest = payload;
                while let Some((&spec, tail)) = rest.split_first() {
                    huffman[usize::from((spec >> 4) & 1)][usize::from(spec & 0x03)] = true;
                    let codes: usize = tail.iter().take(16).map(|&n| usize::from(n)).sum();
                    rest = tail.get(16 + codes..).unwrap_or_default();
                }
            }
            0xC0..=0xCF if !matches!(marker, 0xC4 | 0xC8 | 0xCC) => {
                let tables = payload
                    .get(6..)
                    .unwrap_or_default()
                    .chunks_exact(3)
                    .map(|component| component[2] & 0x03)
                    .collect();
                frame = Some((marker, tables));
            }
            0xDA => {
                let Some((sof, tables)) = &frame else {
                    return Ok(JpegTables::Complete);
                };
                if let Some(missing) = tables.iter().find(|&&t| !quantization[usize::from(t)]) {
                    return Err(DecodeError::Corrupt(format!(
                        "quantization table {missing} is not defined before the first scan"
                    )));
                }
                // Arithmetic-coded frames (C9-CB, CD-CF) use no Huffman tables.
                if !matches!(sof, 0xC0..=0xC3) {
                    return Ok(JpegTables::Complete);
                }
                let count = usize::from(payload.first().copied().unwrap_or(0));
                let components = payload.get(1..1 + 2 * count).unwrap_or_default();
                let spectral_start = payload.get(1 + 2 * count).copied().unwrap_or(0);
                // A progressive scan codes DC (spectral start 0) or AC only.
                let (dc, ac) = match sof {
                    0xC2 => (spectral_start == 0, spectral_start != 0),
                    _ => (true, true),
                };
                let defined = components.chunks_exact(2).all(|c| {
                    (!dc || huffman[0][usize::from(c[1] >> 4 & 0x03)])
                        && (!ac || huffman[1][usize::from(c[1] & 0x03)])
                });
                return Ok(if defined {
                    JpegTables::Complete
                } else {
                    JpegTables::DefaultHuffman
                });
            }
            _ => {}
        }
    }
    Ok(JpegTables::Complete)
}

/// A marker segment's payload (after its length), clipped to the data.
fn segment_payload(data: &[u8], at: usize) -> &[u8] {
    let length = data
        .get(at + 2..at + 4)
        .map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])));
    data.get(at + 4..(at + 2 + length).min(data.len()))
        .unwrap_or_default()
}

/// The marker segments of a JPEG's headers, as (marker, offset of its
/// `FF`), up to and including the first start of scan; none past a
/// malformed one or the end of the image.
fn jpeg_segments(data: &[u8]) -> impl Iterator<Item = (u8, usize)> + '_ {
    let mut at = if data.get(..2) == Some(&[0xFF, 0xD8][..]) {
        Some(2)
    } else {
        None
    };
    std::iter::from_fn(move || loop {
        let here = at?;
        if *data.get(here)? != 0xFF {
            at = None;
            return None;
        }
        let marker = *data.get(here + 1)?;
        match marker {
            // Fill bytes and markers without a length.
            0xFF => at = Some(here + 1),
            0x01 | 0xD0..=0xD7 => at = Some(here + 2),
            0xD9 => {
                at = None;
                return None;
            }
            0xDA => {
                at = None;
                return Some((marker, here));
            }
            _ => {
                let length = usize::from(u16::from_be_bytes([
                    *data.get(here + 2)?,
                    *data.get(here + 3)?,
                ]));
                at = (length >= 2).then_some(here + 2 + length);
                return Some((marker, here));
            }
        }
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn photo() -> Vec<u8> {
        let image =
            image::RgbImage::from_fn(40, 32, |x, y| image::Rgb([x as u8 * 6, y as u8 * 7, 80]));
        let mut out = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90)
            .encode_image(&image)
            .unwrap();
        out
    }

    /// `jpeg` without its `marker` segments (DQT or DHT) before the scan.
    pub(crate) fn without(jpeg: &[u8], marker: u8) -> Vec<u8> {
        let mut out = jpeg[..2].to_vec();
        let mut at = 2;
        while at < jpeg.len() {
            let length = usize::from(u16::from_be_bytes([jpeg[at + 2], jpeg[at + 3]]));
            if jpeg[at + 1] == 0xDA {
                out.extend_from_slice(&jpeg[at..]);
                break;
            }
            if jpeg[at + 1] != marker {
                out.extend_from_slice(&jpeg[at..at + 2 + length]);
            }
            at += 2 + length;
        }
        out
    }

    #[test]
    fn a_whole_jpeg_defines_its_tables() {
        assert_eq!(check_jpeg_tables(&photo()), Ok(JpegTables::Complete));
    }

    #[test]
    fn a_jpeg_without_quantization_tables_is_corrupt() {
        let error = check_jpeg_tables(&without(&photo(), 0xDB)).unwrap_err();
        assert!(
            matches!(&error, DecodeError::Corrupt(m) if m.contains("quantization table 0")),
            "{error:?}"
        );
    }

    #[test]
    fn a_jpeg_without_huffman_tables_takes_the_standard_ones() {
        assert_eq!(
            check_jpeg_tables(&without(&photo(), 0xC4)),
            Ok(JpegTables::DefaultHuffman)
        );
    }

    #[test]
    fn truncated_headers_are_not_a_panic() {
        let jpeg = photo();
        for cut in 0..jpeg.len().min(700) {
            let _ = check_jpeg_tables(&jpeg[..cut]);
        }
    }

    #[test]
    fn an_end_marker_inside_the_scan_is_corrupt_and_an_appended_image_is_not() {
        let jpeg = photo();
        // An end marker read from corrupt bytes, the real one after it.
        let early_end = spliced(&jpeg, &[0xFF, 0xD9, 0x12, 0x34]);
        assert!(check_jpeg_complete(&early_end).is_err());
        // A second image appended after the first's end is not scan data.
        let appended = [&jpeg[..], &photo()[..]].concat();
        assert_eq!(check_jpeg_complete(&appended), Ok(()));
    }

    /// `jpeg` with `inserted` spliced into its entropy-coded data (the
    /// pixels are no longer the image's; the syntax is what is checked).
    fn spliced(jpeg: &[u8], inserted: &[u8]) -> Vec<u8> {
        let (_, scan) = jpeg_segments(jpeg).find(|&(m, _)| m == 0xDA).unwrap();
        let data_start = segment_end(jpeg, scan).unwrap();
        // After a byte that is not FF, so the splice starts a marker.
        let at = (data_start + 10..jpeg.len() - 2)
            .find(|&i| jpeg[i - 1] != 0xFF)
            .unwrap();
        [&jpeg[..at], inserted, &jpeg[at..]].concat()
    }

    #[test]
    fn restart_markers_must_come_in_sequence() {
        let jpeg = photo();
        let in_order = spliced(
            &jpeg,
            &[0xFF, 0xD0, 0x12, 0xFF, 0xD1, 0x34, 0xFF, 0xFF, 0xD2],
        );
        assert_eq!(check_jpeg_complete(&in_order), Ok(()));
        let wrapped: Vec<u8> = (0..10u8).flat_map(|n| [0xFF, 0xD0 + n % 8, 0x55]).collect();
        assert_eq!(check_jpeg_complete(&spliced(&jpeg, &wrapped)), Ok(()));
        let skipped = spliced(&jpeg, &[0xFF, 0xD0, 0x12, 0xFF, 0xD2]);
        assert!(check_jpeg_complete(&skipped).is_err());
    }

    #[test]
    fn segments_between_scans_are_walked_over() {
        let jpeg = photo();
        // A comment, then a table whose bytes hold FF D9: not an end marker.
        let between = spliced(
            &jpeg,
            &[
                0xFF, 0xFE, 0x00, 0x04, 0xAB, 0xCD, 0xFF, 0xDD, 0x00, 0x04, 0xFF, 0xD9,
            ],
        );
        assert_eq!(check_jpeg_complete(&between), Ok(()));
        // A segment whose length runs past the data.
        let long = spliced(&jpeg, &[0xFF, 0xE1, 0xFF, 0xF0]);
        assert!(check_jpeg_complete(&long).is_err());
        for stray in [0x01, 0x02, 0xC0, 0xC2, 0xD8, 0x8E] {
            let error = check_jpeg_complete(&spliced(&jpeg, &[0xFF, stray])).unwrap_err();
            assert!(
                matches!(&error, DecodeError::Corrupt(m) if m.contains(&format!("0xFF{stray:02X}"))),
                "{stray:#x}: {error:?}"
            );
        }
    }

    #[test]
    fn scans_cut_anywhere_are_not_a_panic() {
        let jpeg = photo();
        for cut in 0..jpeg.len() {
            let _ = check_jpeg_complete(&jpeg[..cut]);
        }
    }
}
