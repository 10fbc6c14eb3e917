//! A whole Parquet file through the footer parser and the row reader.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shardfeed::dev::fuzz::parquet_file(data);
});
