//! Index, classes and manifest bytes through the dataset's readers.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shardfeed::dev::fuzz::dataset_index(data);
});
