//! Shard bytes through the tar sample splitter, in chunks and whole.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shardfeed::dev::fuzz::tar_splitter(data);
});
