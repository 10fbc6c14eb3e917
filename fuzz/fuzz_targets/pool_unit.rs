//! Pool unit and answer bytes through the worker's checks and decode.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shardfeed::dev::fuzz::pool_unit(data);
});
