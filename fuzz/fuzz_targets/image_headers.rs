//! Image bytes through the header checks and the bounded decode.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shardfeed::dev::fuzz::image_headers(data);
});
