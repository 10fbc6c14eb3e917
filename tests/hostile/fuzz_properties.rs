//! The cargo-fuzz entry points (`fuzz/`), exercised on every test run
//! with generated inputs: damaged tars and extreme requests.

use super::*;
use proptest::prelude::*;
use shardfeed::dev::fuzz;

fn valid_tar() -> Vec<u8> {
    tar_of(&simple_dataset(1, 3)[0])
}

fn position(segments: Vec<(u32, u64)>) -> pb::EpochPosition {
    pb::EpochPosition {
        segments: segments
            .into_iter()
            .map(|(world_size, batches)| pb::PositionSegment {
                world_size,
                batches,
            })
            .collect(),
        ..Default::default()
    }
}

fn extreme_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        0u32..8,
        Just(u32::MAX),
        Just(1 << 16),
        Just((1 << 16) + 1),
        any::<u32>()
    ]
}

fn extreme_u64() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..8, Just(u64::MAX), Just(u64::MAX / 2), any::<u64>()]
}

/// Seed inputs for each cargo-fuzz target: honest examples of what
/// each parser reads, for the fuzzer to mutate. Checked in under
/// `fuzz/seeds/<target>/` (written anew with
/// `SHARDFEED_WRITE_FUZZ_SEEDS=1 cargo test --test hostile seeds`).
fn seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    use shardfeed::dataset::{DatasetIndex, DatasetLayout, ShardEntry};
    use shardfeed::pool::wire;
    use shardfeed::shard::{tf_example, tfrecord, ImageFormat};
    let tar = valid_tar();
    let mut records = Vec::new();
    for n in 0..3u64 {
        let example = tf_example::example_bytes(&jpeg(12, 10, n), Some(n as i64), &[]);
        tfrecord::write_record(&mut records, &example);
    }
    let shard_index = shardfeed::dataset::index_shard_bytes(&tar, None).unwrap();
    let summary = DatasetIndex {
        version: shardfeed::dataset::INDEX_VERSION,
        layout: DatasetLayout::Shards,
        shards: vec![ShardEntry {
            name: "shard-00000.tar".into(),
            size: tar.len() as u64,
            etag: Some("\"0a1b\"".into()),
            samples: 3,
            kind: shardfeed::dataset::ShardKind::streamed("shard-00000.tar").unwrap(),
        }],
        classes: vec!["cat".into(), "dog".into()],
    };
    let with = |first: u8, body: Vec<u8>| [vec![first], body].concat();
    let spec = shardfeed::decode::OutputSpec::center(16, 16);
    let unit = wire::unit_to_wire(
        7,
        spec,
        &[wire::UnitSample {
            key: shardfeed::decode::SampleKey {
                seed: 1,
                epoch: 0,
                sample: 3,
                copy: 0,
            },
            format: ImageFormat::Jpeg,
            data: jpeg(24, 18, 5).into(),
        }],
    );
    vec![
        ("tar_splitter", "three-samples", with(3, tar.clone())),
        ("tfrecord_splitter", "three-examples", with(2, records)),
        ("image_headers", "baseline-jpeg", jpeg(24, 18, 1)),
        ("image_headers", "png", png_bytes()),
        (
            "dataset_index",
            "summary",
            with(0, serde_json::to_vec(&summary).unwrap()),
        ),
        (
            "dataset_index",
            "shard-index",
            with(1, serde_json::to_vec(&shard_index).unwrap()),
        ),
        (
            "dataset_index",
            "classes",
            with(3, b"cat\r\ndog\n".to_vec()),
        ),
        (
            "dataset_index",
            "csv-manifest",
            with(
                4,
                b"path,label\nimages/a.jpg,3\nimages/b.jpg,cat\n".to_vec(),
            ),
        ),
        (
            "dataset_index",
            "jsonl-manifest",
            with(5, b"{\"path\": \"a.jpg\", \"label\": 1}\n".to_vec()),
        ),
        (
            "pool_unit",
            "one-jpeg",
            prost::Message::encode_to_vec(&unit),
        ),
        (
            "parquet_file",
            "hub-snappy",
            parquet_seed("snappy", false, false),
        ),
        (
            "parquet_file",
            "zstd-v2-text",
            parquet_seed("zstd", true, true),
        ),
        (
            "parquet_file",
            "gzip-plain",
            parquet_seed("gzip", false, true),
        ),
        (
            "parquet_file",
            "lz4-v2",
            parquet_seed("lz4_raw", true, false),
        ),
    ]
}

/// A small Hub-layout file: a null image, a path-only row, labels.
fn parquet_seed(codec: &str, page_v2: bool, text_labels: bool) -> Vec<u8> {
    use shardfeed::dev::parquet_files::{write, Layout, Row};
    let rows: Vec<Row> = (0..5u64)
        .map(|n| Row {
            image: (n != 2).then(|| jpeg(8, 6, n)),
            path: (n != 3).then(|| format!("img/{n}.jpg")),
            label: Some(n as i64 % 3),
        })
        .collect();
    let layout = Layout {
        rows_per_group: 2,
        codec: codec.into(),
        page_v2,
        dictionary: !page_v2,
        classes: vec!["a".into(), "b".into(), "c".into()],
        text_labels,
        class_metadata: !text_labels,
    };
    write(&rows, &layout).unwrap()
}

fn png_bytes() -> Vec<u8> {
    let image = image::RgbImage::from_fn(9, 7, |x, y| image::Rgb([x as u8 * 20, y as u8 * 30, 90]));
    let mut out = Vec::new();
    image
        .write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png)
        .unwrap();
    out
}

fn entry(target: &str) -> fn(&[u8]) {
    match target {
        "tar_splitter" => fuzz::tar_splitter,
        "tfrecord_splitter" => fuzz::tfrecord_splitter,
        "image_headers" => fuzz::image_headers,
        "dataset_index" => fuzz::dataset_index,
        "pool_unit" => fuzz::pool_unit,
        "stream_request" => fuzz::stream_request,
        "parquet_file" => fuzz::parquet_file,
        other => panic!("no fuzz target {other}"),
    }
}

/// Every input the fuzzers kept (and the seeds) runs clean on every
/// test run: what a fuzzer once found stays found.
#[test]
fn seeds_and_checked_in_corpora_replay_clean() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let write = std::env::var_os("SHARDFEED_WRITE_FUZZ_SEEDS").is_some();
    for (target, name, bytes) in seeds() {
        entry(target)(&bytes);
        if write {
            let folder = root.join(target);
            std::fs::create_dir_all(&folder).unwrap();
            std::fs::write(folder.join(format!("seed-{name}")), &bytes).unwrap();
        }
    }
    let mut replayed = 0;
    for folder in std::fs::read_dir(&root).unwrap() {
        let folder = folder.unwrap().path();
        let run = entry(folder.file_name().unwrap().to_str().unwrap());
        for file in std::fs::read_dir(&folder).unwrap() {
            run(&std::fs::read(file.unwrap().path()).unwrap());
            replayed += 1;
        }
    }
    assert!(replayed >= seeds().len(), "{replayed} corpus files");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn a_damaged_tar_never_panics_and_chunking_never_changes_it(
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..12),
        cut in any::<usize>(),
        chunking in any::<u8>(),
    ) {
        let mut tar = valid_tar();
        for (at, value) in flips {
            let at = at % tar.len();
            tar[at] = value;
        }
        tar.truncate(cut % (tar.len() + 1));
        let mut input = vec![chunking];
        input.extend(tar);
        fuzz::tar_splitter(&input);
    }

    /// The footer and pages of a real file, damaged where the flips
    /// land (mostly in the footer: its offsets and counts are what a
    /// reader trusts), or cut short.
    #[test]
    fn a_damaged_parquet_file_never_panics_its_reader(
        flips in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<bool>()), 0..8),
        cut in any::<usize>(),
        seed in 0usize..4,
    ) {
        let seeds = seeds();
        let mut file = seeds
            .iter()
            .filter(|(target, _, _)| *target == "parquet_file")
            .nth(seed)
            .unwrap()
            .2
            .clone();
        let len = file.len();
        for (at, value, in_footer) in flips {
            let at = if in_footer { len - 1 - at % 400.min(len) } else { at % len };
            file[at] = value;
        }
        if cut % 4 == 0 {
            file.truncate(cut % (len + 1));
        }
        fuzz::parquet_file(&file);
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_parsers(
        data in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        fuzz::tar_splitter(&data);
        fuzz::stream_request(&data);
    }

    #[test]
    fn extreme_requests_are_checked_and_planned_without_panic(
        world_size in extreme_u32(),
        rank in extreme_u32(),
        batch_size in proptest::option::of(extreme_u32()),
        side in extreme_u32(),
        shuffle_buffer in extreme_u32(),
        interleave in extreme_u32(),
        epoch in extreme_u64(),
        start_batch in extreme_u64(),
        segments in proptest::collection::vec((extreme_u32(), extreme_u64()), 0..80),
        partition in 0i32..3,
        resize in 0i32..3,
    ) {
        let request = pb::StreamBatchesRequest {
            dataset: "s3://b/p/".into(),
            world_size,
            rank,
            batch_size,
            height: side,
            width: side / 2,
            shuffle_buffer,
            interleave,
            epoch,
            start_batch,
            partition,
            resize,
            resume_from: Some(position(segments)),
            ..Default::default()
        };
        let started = Instant::now();
        fuzz::check_request(&request);
        prop_assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    }

    #[test]
    fn resume_positions_at_the_edges_are_refused_or_planned_without_panic(
        world_size in 1u32..=4,
        rank in any::<u32>(),
        batch_size in 1u32..=8,
        start_batch in extreme_u64(),
        segments in proptest::collection::vec((1u32..=8, extreme_u64()), 0..80),
    ) {
        let request = pb::StreamBatchesRequest {
            dataset: "s3://b/p/".into(),
            world_size,
            rank: rank % world_size,
            batch_size: Some(batch_size),
            height: 8,
            width: 8,
            start_batch,
            resume_from: Some(position(segments)),
            ..Default::default()
        };
        let started = Instant::now();
        fuzz::check_request(&request);
        prop_assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    }
}
