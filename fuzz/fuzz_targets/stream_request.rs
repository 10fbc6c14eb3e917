//! A StreamBatches request (protobuf bytes) through the server's checks,
//! the stream's memory cost and planning.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shardfeed::dev::fuzz::stream_request(data);
});
