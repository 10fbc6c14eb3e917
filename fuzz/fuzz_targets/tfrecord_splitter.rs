//! TFRecord bytes through the sample splitter and the index scan, chunked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shardfeed::dev::fuzz::tfrecord_splitter(data);
});
