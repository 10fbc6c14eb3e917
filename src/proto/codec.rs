//! The service's protobuf codec: prost, with each message's buffer reserved
//! at its exact encoded size before encoding.
//!
//! tonic's stock codec lets the buffer grow as prost writes into it; for a
//! ~19 MB batch that is a chain of reallocations, each copying what was
//! written so far into fresh pages (a third of the server's page faults in
//! a profile of a 224x224 stream).
//!
//! Its decoder answers bytes that are not the message (a `string` field
//! that is not UTF-8, a truncated field) with `INVALID_ARGUMENT`: tonic's
//! maps them to `INTERNAL`, which tells a caller the server failed where
//! its own request was at fault.

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

impl<T, U> Codec for SizedProstCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
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

impl<U: Message + Default> Decoder for StrictProstDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(|error| {
            Status::invalid_argument(format!("the message is not valid protobuf: {error}"))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}
