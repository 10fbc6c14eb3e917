//! What a JPEG's headers say, read by walking its marker segments: the
//! frame (size, process, components), whether the file is whole, and
//! whether it defines the tables its first scan uses. No decoder state, no
//! copy: every sample's headers are read before its crop box is chosen.

use super::DecodeError;

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

/// A JPEG whose scan data is not followed by an end-of-image marker was cut
/// short (a truncated upload or copy): libjpeg-turbo warns "premature end
/// of data" and other decoders fill the missing rows in. Either way it is
/// not the image, so it counts as corrupt.
///
/// The marker is looked for after the first start-of-scan, from the end
/// (it is almost always the last two bytes; data some writers append
/// after it is allowed). Entropy-coded data never holds `FF D9`: a `FF`
/// there is followed by a stuffed `00` or a restart marker.
pub fn check_jpeg_complete(data: &[u8]) -> Result<(), DecodeError> {
    let premature =
        || DecodeError::Corrupt("premature end of JPEG data (no end-of-image marker)".into());
    let (_, scan) = jpeg_segments(data)
        .find(|&(marker, _)| marker == 0xDA)
        .ok_or_else(premature)?;
    let ends = data[scan..]
        .windows(2)
        .rev()
        .any(|pair| pair == [0xFF, 0xD9]);
    if ends {
        Ok(())
    } else {
        Err(premature())
    }
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
}
