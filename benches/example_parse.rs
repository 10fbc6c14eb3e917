//! TFRecord Example parsing: `cargo bench --bench example_parse`. The wire
//! walk shardfeed uses against a full protobuf decode (the previous path),
//! on an ImageNet-like record and on a record of many tiny values; prints
//! the bytes each allocates at its peak, then times both.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use prost::Message;
use shardfeed::shard::tf_example::append_empty_values_feature;
use shardfeed::shard::tfrecord::{example, example_bytes, parse_example, FeatureNames};

/// Counts live heap bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Peak heap bytes `work` allocates beyond what was live before it.
fn peak_of<T>(work: impl FnOnce() -> T) -> usize {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    drop(black_box(work()));
    PEAK.load(Ordering::Relaxed) - before
}

/// A record like TensorFlow's ImageNet conversion writes: a ~110 KB JPEG,
/// its label, file name, size and one box.
fn imagenet_record() -> Bytes {
    let jpeg = vec![0x5a; 110_000];
    Bytes::from(example_bytes(
        &jpeg,
        Some(208),
        &[
            ("image/filename", b"n02085620_10074.JPEG"),
            ("image/format", b"JPEG"),
            ("image/class/synset", b"n02085620"),
        ],
    ))
}

/// A 1 MB record whose extra feature holds 500,000 empty values.
fn many_values_record() -> Bytes {
    let mut record = example_bytes(b"\xff\xd8jpeg", Some(1), &[]);
    append_empty_values_feature(&mut record, "noise", 500_000);
    Bytes::from(record)
}

fn example_parse(c: &mut Criterion) {
    let names = FeatureNames::default();
    let wanted = vec!["image/filename".to_string()];
    let mut group = c.benchmark_group("example_parse");
    for (name, record) in [
        ("imagenet", imagenet_record()),
        ("many_values", many_values_record()),
    ] {
        let walk = peak_of(|| parse_example(record.clone(), &names, &wanted).unwrap());
        let decode = peak_of(|| example::Example::decode(record.clone()).unwrap());
        println!(
            "{{\"record\":\"{name}\",\"record_bytes\":{},\"walk_peak_bytes\":{walk},\"decode_peak_bytes\":{decode}}}",
            record.len()
        );
        group.throughput(Throughput::Bytes(record.len() as u64));
        group.bench_function(BenchmarkId::new("walk", name), |b| {
            b.iter(|| parse_example(record.clone(), &names, &wanted).unwrap())
        });
        group.bench_function(BenchmarkId::new("full_decode", name), |b| {
            b.iter(|| example::Example::decode(record.clone()).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, example_parse);
criterion_main!(benches);
