//! Any `:authority` over the Unix socket.
//!
//! Over a Unix socket most gRPC clients send the socket's path as the
//! HTTP/2 `:authority` (grpcio: `/run/shardfeed/sf.sock`; grpc-java and
//! grpc-swift likewise, some percent-encoded). The h2 crate under tonic
//! parses `:authority` as a URI authority and resets every such stream with
//! PROTOCOL_ERROR (hyperium/h2#487, open), so a plain `grpc.insecure_channel(
//! "unix:...")` with the generated stubs could not call the sidecar.
//!
//! [`AnyAuthority`] sits between an accepted socket and the server. Frames
//! the client sends pass through unchanged, except header blocks (HEADERS
//! and their CONTINUATIONs): those are decoded, an authority that is not a
//! valid URI authority becomes `localhost` (the convention of grpc-go and
//! Kubernetes for Unix sockets), and the block is re-encoded as literals
//! without indexing, so the server's HPACK table stays empty and never
//! depends on the client's (which the decoder here follows). Frames the
//! server sends are not touched. A gRPC client sends a few small header
//! blocks per call; data frames are copied once.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, ReadBuf};

/// What a client connection starts with (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The smallest frame size every HTTP/2 peer accepts: re-encoded blocks are
/// split to it. It is also the server's SETTINGS_MAX_FRAME_SIZE (h2's
/// default, which the server keeps), so a larger frame from the client is an
/// error there too: it is refused before it is buffered.
const MAX_FRAME: usize = 16_384;
/// A header block larger than this ends the connection: a gRPC call's
/// headers are a few hundred bytes.
const MAX_HEADER_BLOCK: usize = 64 << 10;
/// Decoded header bytes (RFC 9113's size: name + value + 32 per field) one
/// block may expand to. HPACK lets a one-byte index stand for a table entry
/// of up to the table's size, so a small block can name gigabytes; decoding
/// stops appending past this, before allocating it.
const MAX_HEADER_LIST: usize = 64 << 10;
/// The client's HPACK table may not grow past this (its memory is ours): the
/// SETTINGS_HEADER_TABLE_SIZE the server's h2 advertises (the protocol's
/// default), so a larger size update is an error there too.
const MAX_TABLE_SIZE: usize = 4096;
/// CONTINUATION frames one header block may take. A block within
/// [`MAX_HEADER_BLOCK`] needs 4 of full size; empty ones cost the proxy
/// work and grow nothing, so they are bounded by count.
const MAX_CONTINUATIONS: usize = 64;
/// Where an authority that is not one goes.
const LOCAL_AUTHORITY: &[u8] = b"localhost";

/// A client connection whose header blocks carry only valid authorities.
pub struct AnyAuthority<S> {
    inner: S,
    /// Bytes read from the client, not yet a whole frame.
    input: BytesMut,
    /// Bytes ready for the server.
    output: BytesMut,
    preface_seen: bool,
    /// A header block whose END_HEADERS has not come yet.
    pending: Option<PendingBlock>,
    decoder: loona_hpack::Decoder<'static>,
    client_done: bool,
}

struct PendingBlock {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: BytesMut,
    continuations: usize,
}

impl<S> AnyAuthority<S> {
    pub fn new(inner: S) -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(MAX_TABLE_SIZE);
        Self {
            inner,
            input: BytesMut::new(),
            output: BytesMut::new(),
            preface_seen: false,
            pending: None,
            decoder,
            client_done: false,
        }
    }

    /// Moves every whole frame of `input` to `output`, re-encoding header
    /// blocks.
    fn process(&mut self) -> io::Result<()> {
        if !self.preface_seen {
            if self.input.len() < PREFACE.len() {
                return Ok(());
            }
            // Not HTTP/2 (or not a client): let the server answer it.
            self.output
                .extend_from_slice(&self.input.split_to(PREFACE.len()));
            self.preface_seen = true;
        }
        while self.input.len() >= FRAME_HEADER {
            let header = &self.input[..FRAME_HEADER];
            let length =
                usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            // Checked on the header, before any of the payload is kept.
            if length > MAX_FRAME {
                return Err(invalid(
                    "a frame larger than SETTINGS_MAX_FRAME_SIZE (16384)",
                ));
            }
            if self.input.len() < FRAME_HEADER + length {
                return Ok(());
            }
            let (kind, flags) = (header[3], header[4]);
            let stream =
                u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
            let mut frame = self.input.split_to(FRAME_HEADER + length);
            match kind {
                HEADERS => {
                    if self.pending.is_some() {
                        return Err(invalid("HEADERS while a header block is open"));
                    }
                    frame.advance(FRAME_HEADER);
                    let block = headers_fragment(frame, flags, stream)?;
                    self.continue_block(block, flags)?;
                }
                CONTINUATION => {
                    let Some(mut block) = self.pending.take() else {
                        return Err(invalid("CONTINUATION without a header block"));
                    };
                    if block.stream != stream {
                        return Err(invalid("CONTINUATION of another stream"));
                    }
                    block.continuations += 1;
                    if block.continuations > MAX_CONTINUATIONS {
                        return Err(invalid("a header block of over 64 CONTINUATION frames"));
                    }
                    block.fragment.extend_from_slice(&frame[FRAME_HEADER..]);
                    self.continue_block(block, flags)?;
                }
                _ if self.pending.is_some() => {
                    return Err(invalid("a frame inside a header block"));
                }
                _ => self.output.extend_from_slice(&frame),
            }
        }
        Ok(())
    }

    fn continue_block(&mut self, block: PendingBlock, flags: u8) -> io::Result<()> {
        if block.fragment.len() > MAX_HEADER_BLOCK {
            return Err(invalid("a header block over 64 KiB"));
        }
        if flags & END_HEADERS == 0 {
            self.pending = Some(block);
            return Ok(());
        }
        // Each field is re-encoded as it is decoded (table entries are
        // borrowed, not copied), and nothing is kept past the bound.
        let mut encoded = Vec::with_capacity(block.fragment.len() + 64);
        let mut list_size = 0usize;
        let mut failed: Option<io::Error> = None;
        self.decoder
            .decode_with_cb(&block.fragment, |name, value| {
                if failed.is_some() {
                    return;
                }
                list_size += name.len() + value.len() + 32;
                if list_size > MAX_HEADER_LIST {
                    failed = Some(invalid("a header list over 64 KiB decoded"));
                    return;
                }
                let value: &[u8] = if &*name == b":authority" && !is_authority(&value) {
                    LOCAL_AUTHORITY
                } else {
                    &value
                };
                if let Err(error) = encode_literal(&name, value, &mut encoded) {
                    failed = Some(error);
                }
            })
            .map_err(|error| invalid(&format!("HPACK: {error}")))?;
        if let Some(error) = failed {
            return Err(error);
        }
        write_block(&mut self.output, &block, &encoded);
        Ok(())
    }
}

/// The header block fragment of a HEADERS frame's payload, without padding.
fn headers_fragment(mut payload: BytesMut, flags: u8, stream: u32) -> io::Result<PendingBlock> {
    let padding = if flags & PADDED != 0 {
        if payload.is_empty() {
            return Err(invalid("PADDED HEADERS without a pad length"));
        }
        usize::from(payload.get_u8())
    } else {
        0
    };
    let priority = if flags & PRIORITY != 0 {
        if payload.len() < 5 {
            return Err(invalid("PRIORITY HEADERS too short"));
        }
        let mut fields = [0; 5];
        payload.copy_to_slice(&mut fields);
        Some(fields)
    } else {
        None
    };
    if padding > payload.len() {
        return Err(invalid("HEADERS padding longer than the frame"));
    }
    payload.truncate(payload.len() - padding);
    Ok(PendingBlock {
        stream,
        end_stream: flags & END_STREAM != 0,
        priority,
        fragment: payload,
        continuations: 0,
    })
}

/// `block`'s headers, `encoded`, as one HEADERS frame and CONTINUATIONs.
fn write_block(output: &mut BytesMut, block: &PendingBlock, encoded: &[u8]) {
    let priority_len = if block.priority.is_some() { 5 } else { 0 };
    let first = encoded.len().min(MAX_FRAME - priority_len);
    let mut flags = if block.end_stream { END_STREAM } else { 0 };
    if block.priority.is_some() {
        flags |= PRIORITY;
    }
    if first == encoded.len() {
        flags |= END_HEADERS;
    }
    frame_header(output, priority_len + first, HEADERS, flags, block.stream);
    if let Some(priority) = block.priority {
        output.extend_from_slice(&priority);
    }
    output.extend_from_slice(&encoded[..first]);
    let mut rest = &encoded[first..];
    while !rest.is_empty() {
        let part = rest.len().min(MAX_FRAME);
        let flags = if part == rest.len() { END_HEADERS } else { 0 };
        frame_header(output, part, CONTINUATION, flags, block.stream);
        output.extend_from_slice(&rest[..part]);
        rest = &rest[part..];
    }
}

fn frame_header(output: &mut BytesMut, length: usize, kind: u8, flags: u8, stream: u32) {
    output.put_uint(length as u64, 3);
    output.put_u8(kind);
    output.put_u8(flags);
    output.put_u32(stream);
}

/// An HPACK literal header field without indexing, new name, no Huffman.
fn encode_literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
    out.push(0x00);
    for string in [name, value] {
        loona_hpack::encoder::encode_integer_into(string.len(), 7, 0x00, out)?;
        out.extend_from_slice(string);
    }
    Ok(())
}

/// Whether h2 would take `value` as an `:authority`.
fn is_authority(value: &[u8]) -> bool {
    !value.is_empty() && tonic::codegen::http::uri::Authority::try_from(value).is_ok()
}

fn invalid(why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("HTTP/2 from the client: {why}"),
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for AnyAuthority<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.output.is_empty() {
                let n = buf.remaining().min(this.output.len());
                buf.put_slice(&this.output.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.client_done {
                // A frame cut short by the client's close is dropped: the
                // server sees the connection end, as it would have.
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 16 << 10];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                this.client_done = true;
                continue;
            }
            this.input.extend_from_slice(read.filled());
            this.process()?;
        }
    }
}

// What the server sends is not touched.
crate::net::delegate_async_write!(AnyAuthority, inner);

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for AnyAuthority<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        frame_header(&mut out, payload.len(), kind, flags, stream);
        out.extend_from_slice(payload);
        out.to_vec()
    }

    /// Splits `bytes` (after the preface) into frames: (kind, flags, stream, payload).
    fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let length = (usize::from(bytes[0]) << 16)
                | (usize::from(bytes[1]) << 8)
                | usize::from(bytes[2]);
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            out.push((bytes[3], bytes[4], stream, bytes[9..9 + length].to_vec()));
            bytes = &bytes[9 + length..];
        }
        out
    }

    async fn through(client: Vec<u8>) -> io::Result<Vec<u8>> {
        let mut adapted = AnyAuthority::new(client.as_slice());
        let mut out = Vec::new();
        adapted.read_to_end(&mut out).await?;
        Ok(out)
    }

    #[tokio::test]
    async fn socket_paths_become_localhost_and_everything_else_passes() {
        // Clients index what they send: the first block adds the authority
        // to the client's table (literal with incremental indexing), the
        // second refers to it by index (62, the newest dynamic entry).
        let request = |path: &[u8]| -> Vec<(Vec<u8>, Vec<u8>)> {
            vec![
                (b":authority".to_vec(), b"/run/shardfeed/sf.sock".to_vec()),
                (b":method".to_vec(), b"POST".to_vec()),
                (b":scheme".to_vec(), b"http".to_vec()),
                (b":path".to_vec(), path.to_vec()),
                (b"te".to_vec(), b"trailers".to_vec()),
                (b"x-long".to_vec(), vec![b'v'; 20_000]),
            ]
        };
        let encode = |headers: &[(Vec<u8>, Vec<u8>)], first_indexed: bool| {
            let mut out = Vec::new();
            for (i, (name, value)) in headers.iter().enumerate() {
                if i == 0 && first_indexed {
                    out.push(0x80 | 62);
                    continue;
                }
                encode_literal(name, value, &mut out).unwrap();
                if i == 0 {
                    out[0] = 0x40; // with incremental indexing
                }
            }
            out
        };
        let first = encode(&request(b"/a"), false);
        let second = encode(&request(b"/b"), true);

        let mut client = PREFACE.to_vec();
        client.extend(frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100])); // SETTINGS
                                                                // The first block split over HEADERS (padded, with priority) and a
                                                                // CONTINUATION.
        let (head, tail) = first.split_at(first.len() / 2);
        let mut payload = vec![2u8, 0, 0, 0, 0, 7];
        payload.extend_from_slice(head);
        payload.extend_from_slice(&[0, 0]);
        client.extend(frame(HEADERS, PADDED | PRIORITY, 1, &payload));
        client.extend(frame(CONTINUATION, END_HEADERS, 1, tail));
        client.extend(frame(0x0, END_STREAM, 1, b"request body")); // DATA
                                                                   // Frames are at most the server's SETTINGS_MAX_FRAME_SIZE.
        let (head, tail) = second.split_at(second.len() / 2);
        client.extend(frame(HEADERS, END_STREAM, 3, head));
        client.extend(frame(CONTINUATION, END_HEADERS, 3, tail));

        let out = through(client).await.unwrap();
        assert_eq!(&out[..PREFACE.len()], PREFACE);
        let frames = frames(&out[PREFACE.len()..]);
        let mut decoder = loona_hpack::Decoder::new();
        let mut blocks: Vec<(u32, u8, Vec<u8>)> = Vec::new();
        let mut kinds = Vec::new();
        for (kind, flags, stream, payload) in frames {
            kinds.push(kind);
            match kind {
                HEADERS => {
                    let start = if flags & PRIORITY != 0 { 5 } else { 0 };
                    assert_eq!(flags & PADDED, 0);
                    blocks.push((stream, flags, payload[start..].to_vec()));
                }
                CONTINUATION => blocks.last_mut().unwrap().2.extend(payload),
                0x0 => assert_eq!(payload, b"request body"),
                _ => {}
            }
        }
        assert_eq!(kinds.first(), Some(&0x4), "SETTINGS first, unchanged");
        assert!(
            kinds.contains(&CONTINUATION),
            "a 20 kB block is split at 16 KiB"
        );
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[1].1 & END_STREAM, END_STREAM);
        for ((stream, _, block), path) in blocks.iter().zip([&b"/a"[..], b"/b"]) {
            let headers = decoder.decode(block).unwrap();
            let mut expected = request(path);
            expected[0].1 = b"localhost".to_vec();
            assert_eq!(headers, expected, "stream {stream}");
        }
    }

    #[tokio::test]
    async fn valid_authorities_are_kept_and_bad_framing_is_an_error() {
        let mut encoder = loona_hpack::Encoder::new();
        let block = encoder.encode([(&b":authority"[..], &b"localhost:50051"[..])]);
        let mut client = PREFACE.to_vec();
        client.extend(frame(HEADERS, END_HEADERS, 1, &block));
        let out = through(client).await.unwrap();
        let frames = frames(&out[PREFACE.len()..]);
        let headers = loona_hpack::Decoder::new().decode(&frames[0].3).unwrap();
        assert_eq!(headers[0].1, b"localhost:50051");

        let mut client = PREFACE.to_vec();
        client.extend(frame(CONTINUATION, END_HEADERS, 1, &block));
        let error = through(client).await.unwrap_err();
        assert!(
            error.to_string().contains("CONTINUATION without"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_small_block_naming_huge_table_entries_is_refused_before_it_expands() {
        // A 4 KB entry added to the client's table (a literal with
        // incremental indexing: the table's whole size), then 100 one-byte
        // references to it (the newest dynamic entry is index 62): 400 KB if
        // expanded, and 64 KiB of them would be 260 MB.
        let mut first = vec![0x40];
        for string in [&b"x-big"[..], &vec![b'v'; 4_000][..]] {
            loona_hpack::encoder::encode_integer_into(string.len(), 7, 0x00, &mut first).unwrap();
            first.extend_from_slice(string);
        }
        let mut client = PREFACE.to_vec();
        client.extend(frame(HEADERS, END_HEADERS, 1, &first));
        client.extend(frame(HEADERS, END_HEADERS, 3, &[0x80 | 62; 100]));
        let error = through(client).await.unwrap_err();
        assert!(
            error.to_string().contains("header list over 64 KiB"),
            "{error}"
        );

        // A table larger than the server advertises is refused.
        let mut update = Vec::new();
        loona_hpack::encoder::encode_integer_into(64 << 10, 5, 0x20, &mut update).unwrap();
        update.extend_from_slice(&first);
        let mut client = PREFACE.to_vec();
        client.extend(frame(HEADERS, END_HEADERS, 1, &update));
        let error = through(client).await.unwrap_err();
        assert!(error.to_string().contains("HPACK"), "{error}");

        // A frame over the server's SETTINGS_MAX_FRAME_SIZE is refused whole.
        let mut client = PREFACE.to_vec();
        client.extend(frame(0x0, 0, 1, &vec![0; MAX_FRAME + 1]));
        let error = through(client).await.unwrap_err();
        assert!(error.to_string().contains("MAX_FRAME_SIZE"), "{error}");
    }

    #[tokio::test]
    async fn an_oversized_frame_is_refused_on_its_header_before_its_payload_comes() {
        // A header declaring 8 MiB and only the start of its payload: the
        // connection ends on the header, not after 8 MiB are buffered.
        let mut client = PREFACE.to_vec();
        let mut header = BytesMut::new();
        frame_header(&mut header, 8 << 20, 0x0, 0, 1);
        client.extend_from_slice(&header);
        client.extend_from_slice(&[0; 100]);
        let error = through(client).await.unwrap_err();
        assert!(error.to_string().contains("MAX_FRAME_SIZE"), "{error}");
    }

    #[tokio::test]
    async fn endless_empty_continuations_end_the_connection() {
        let mut client = PREFACE.to_vec();
        client.extend(frame(HEADERS, 0, 1, &[0x82]));
        for _ in 0..1_000 {
            client.extend(frame(CONTINUATION, 0, 1, &[]));
        }
        let error = through(client).await.unwrap_err();
        assert!(error.to_string().contains("CONTINUATION frames"), "{error}");
    }
}
