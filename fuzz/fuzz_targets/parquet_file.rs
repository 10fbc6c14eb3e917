//! A whole Parquet file through the footer parser and the row reader.
#![no_main]

use std::sync::atomic::{AtomicU32, Ordering};

static PANICS_SHOWN: AtomicU32 = AtomicU32::new(0);

libfuzzer_sys::fuzz_target!(
    init: {
        // The parquet crate panics on some damaged pages; the reader catches
        // those and names a damaged page (shard::parquet::rows), as the
        // server must. libfuzzer-sys's own hook aborts on every panic,
        // caught or not, so the first run stopped on a handled one. This
        // hook lets a caught panic pass; an uncaught one still aborts in
        // libfuzzer-sys's catch_unwind around the target, and the first few
        // messages are shown to tell the two apart.
        std::panic::set_hook(Box::new(|info| {
            if PANICS_SHOWN.fetch_add(1, Ordering::Relaxed) < 5 {
                eprintln!("panic (caught by the reader unless the run aborts now): {info}");
            }
        }));
    },
    |data: &[u8]| {
        shardfeed::dev::fuzz::parquet_file(data);
    }
);
