//! The service's protobuf codec: prost, with each message's buffer reserved
//! at its exact encoded size before encoding.
//!
//! tonic's stock codec lets the buffer grow as prost writes into it; for a
//! ~19 MB batch that is a chain of reallocations, each copying what was
//! written so far into fresh pages (a third of the server's page faults in
//! a profile of a 224x224 stream).
//!
//! Its decoder names whose fault bytes that are not the message are (a
//! `string` field that is not UTF-8, a truncated field): a request the
//! server reads is its caller's (`INVALID_ARGUMENT`; tonic's stock codec
//! says `INTERNAL`, telling the caller the server failed); an answer a
//! client reads is its peer's (`INTERNAL`, so the pool client treats a
//! garbled worker answer as that worker failing, not as its own unit being
//! wrong). Each message says which it is through [`Received`]: one list,
//! checked by the compiler for every message a stub decodes.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

#[derive(Debug, Clone)]
pub struct SizedProstCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SizedProstCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

/// Whose fault it is when bytes received as this message do not decode.
pub trait Received {
    const MALFORMED: tonic::Code;
}

macro_rules! received {
    ($code:ident: $($message:path),+ $(,)?) => {
        $(impl Received for $message {
            const MALFORMED: tonic::Code = tonic::Code::$code;
        })+
    };
}

// Requests: read by the server, written by its caller.
received!(InvalidArgument:
    super::v1::StreamBatchesRequest,
    super::v1::DescribeRequest,
    super::v1::ClientDecodeReport,
    super::pool::v1::DecodeUnit,
);
// Answers: read by a client, written by the peer it called.
received!(Internal:
    super::v1::Batch,
    super::v1::DescribeResponse,
    super::v1::ClientDecodeReportResponse,
    super::pool::v1::DecodedUnit,
);

impl<T, U> Codec for SizedProstCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Received + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = SizedProstEncoder<T>;
    type Decoder = StrictProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        SizedProstEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictProstDecoder(PhantomData)
    }
}

#[derive(Debug, Clone)]
pub struct SizedProstEncoder<T>(PhantomData<T>);

impl<T: Message> Encoder for SizedProstEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode(buf)
            .map_err(|e| Status::internal(format!("encoding a response: {e}")))
    }
}

#[derive(Debug, Clone)]
pub struct StrictProstDecoder<U>(PhantomData<U>);

impl<U: Message + Received + Default> Decoder for StrictProstDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(|error| {
            Status::new(
                U::MALFORMED,
                format!("the message is not valid protobuf: {error}"),
            )
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

#[cfg(test)]
mod tests {
    use super::super::pool::v1 as pb;
    use bytes::Bytes;
    use tokio::net::TcpListener;

    /// A peer that answers every call with a well-framed gRPC message whose
    /// bytes are not protobuf (field 1 as a varint of eleven 0xff bytes).
    async fn garbling_peer() -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            let mut connection = h2::server::handshake(socket).await.unwrap();
            while let Some(Ok((_request, mut respond))) = connection.accept().await {
                let head = tonic::codegen::http::Response::builder()
                    .header("content-type", "application/grpc")
                    .body(())
                    .unwrap();
                let mut body = respond.send_response(head, false).unwrap();
                let garbage = [
                    0x08u8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                ];
                let mut frame = vec![0u8];
                frame.extend_from_slice(&(garbage.len() as u32).to_be_bytes());
                frame.extend_from_slice(&garbage);
                body.send_data(Bytes::from(frame), false).unwrap();
                let mut trailers = tonic::codegen::http::HeaderMap::new();
                trailers.insert("grpc-status", "0".parse().unwrap());
                body.send_trailers(trailers).unwrap();
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_garbled_answer_is_the_peers_fault_not_the_callers_request() {
        let addr = garbling_peer().await;
        let mut client =
            pb::decode_pool_client::DecodePoolClient::connect(format!("http://{addr}"))
                .await
                .unwrap();
        let status = client.decode(pb::DecodeUnit::default()).await.unwrap_err();
        // INVALID_ARGUMENT would tell the pool client its unit was wrong and
        // send it home (`AttemptError::Rejected`) instead of to another worker.
        assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
        assert!(
            status.message().contains("not valid protobuf"),
            "{status:?}"
        );
    }
}
