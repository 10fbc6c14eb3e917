//! Fuzzing entry points: what `fuzz/` (cargo fuzz, libFuzzer) and the
//! property tests feed arbitrary bytes into. Each must return, quickly,
//! without panicking, whatever the input.

use std::sync::Arc;

use prost::Message;

use crate::decode::{self, Crop, SampleKey};
use crate::engine::budget::{StreamCost, StreamShape};
use crate::pipeline::PipelineConfig;
use crate::plan::{self, ShuffleConfig};
use crate::server::pb;
use crate::shard::splitter::SampleSplitter;
use crate::shard::tf_example::{parse_example, FeatureNames};
use crate::shard::{ImageFormat, SampleLayout, StreamedFormat, DEFAULT_MAX_MEMBER_BYTES};

/// Tar bytes of a shard, pushed in chunks whose sizes come from the input's
/// first byte, through the sample splitter; then the whole shard at once
/// through the indexer. Both must agree: chunking never changes the result.
pub fn tar_splitter(data: &[u8]) {
    let Some((&chunking, tar)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunking).max(1) * 7;
    let chunked = split_in_chunks(tar, chunk);
    let whole = crate::dataset::index_shard_bytes(tar, None);
    match (chunked, whole) {
        (Ok(keys), Ok(index)) => {
            assert_eq!(keys, index.keys, "chunking changed the samples");
            assert!(index.starts.iter().zip(&index.ends).all(|(s, e)| s <= e));
        }
        (Err(_), Err(_)) => {}
        (chunked, whole) => panic!(
            "chunked and whole parses disagree: {:?} vs {:?}",
            chunked.map(|k| k.len()),
            whole.map(|i| i.keys.len())
        ),
    }
}

fn split_in_chunks(tar: &[u8], chunk: usize) -> Result<Vec<String>, crate::shard::ShardError> {
    let mut splitter = SampleSplitter::new(0, DEFAULT_MAX_MEMBER_BYTES);
    let mut keys = Vec::new();
    for piece in tar.chunks(chunk) {
        splitter.push(piece);
        while let Some(sample) = splitter.next_sample()? {
            keys.push(sample.key);
        }
    }
    while let Some(sample) = splitter.finish()? {
        keys.push(sample.key);
    }
    Ok(keys)
}

/// TFRecord bytes of a shard, pushed in chunks whose sizes come from the
/// input's first byte, through the splitter that reads samples (each
/// record's Example walked) and the one an index scan uses (frames only):
/// they must agree on how many records there are and, when both end
/// cleanly, on their keys' count.
pub fn tfrecord_splitter(data: &[u8]) {
    let Some((&chunking, records)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunking).max(1) * 5;
    let read = |frames_only: bool| -> Result<usize, crate::shard::ShardError> {
        let layout = Arc::new(SampleLayout::default());
        let mut splitter =
            SampleSplitter::for_format(StreamedFormat::TfRecord, 0, 0, 1 << 20, layout);
        if frames_only {
            splitter = splitter.frames_only();
        }
        let mut count = 0;
        for piece in records.chunks(chunk) {
            splitter.push(piece);
            while splitter.next_sample()?.is_some() {
                count += 1;
            }
        }
        while splitter.finish()?.is_some() {
            count += 1;
        }
        Ok(count)
    };
    if let (Ok(samples), Ok(frames)) = (read(false), read(true)) {
        assert_eq!(samples, frames, "reading and scanning disagree");
    }
    let _ = parse_example(
        bytes::Bytes::copy_from_slice(records),
        &FeatureNames::default(),
        &["txt".to_string()],
    );
}

/// Image bytes through every header check a sample meets before decode
/// (the JPEG frame, tables and scan checks, each format's header), then
/// the bounded decode itself into a small output: whatever the bytes say,
/// a bounded answer.
pub fn image_headers(data: &[u8]) {
    let frame = decode::jpeg_frame(data);
    if let (Some(frame), Some(size)) = (&frame, decode::jpeg_dimensions(data)) {
        assert_eq!(
            (frame.width, frame.height),
            size,
            "two header reads disagree"
        );
    }
    let _ = decode::check_jpeg_complete(data);
    let _ = decode::check_jpeg_tables(data);
    let Some(format) = ImageFormat::sniff(data) else {
        return;
    };
    let _ = decode::source_dimensions(format, data);
    let spec = decode::OutputSpec {
        height: 16,
        width: 16,
        crop: Crop::Stretch,
        resample: crate::decode::Resample::Bilinear,
        ops: decode::Ops::NONE,
    };
    let mut out = vec![0u8; spec.bytes()];
    let budget = decode::ScratchBudget::new(FUZZ_SCRATCH_BYTES);
    let key = SampleKey {
        seed: 1,
        epoch: 0,
        sample: 2,
        copy: 0,
    };
    let _ = decode::decode_bounded(
        decode::default_decoder().as_ref(),
        &budget,
        format,
        data,
        &spec,
        &key,
        &mut out,
    );
}

/// The decode scratch a fuzzed image may use: enough for the seeds, small
/// enough that a header claiming more is refused, not allocated.
const FUZZ_SCRATCH_BYTES: u64 = 64 << 20;

/// Index and manifest bytes as the sidecar reads them from a dataset's
/// prefix; the first byte picks the reader: the summary index, a shard's
/// index (tar or loose), `classes.txt`, a CSV or a JSON-lines manifest.
pub fn dataset_index(data: &[u8]) {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    match which % 6 {
        0 => {
            if let Ok(index) = crate::dataset::parse_summary(bytes, "fuzz") {
                let _ = (index.samples(), index.bytes(), index.identity());
            }
        }
        1 | 2 => {
            let samples = bytes.first().map_or(0, |&b| u64::from(b));
            let _ = crate::dataset::parse_shard_index(bytes, "fuzz", samples, which % 6 == 2);
        }
        3 => {
            let _ = crate::dataset::parse_classes(bytes);
        }
        4 => {
            let _ = crate::dataset::manifest::parse_manifest("manifest.csv", bytes);
        }
        _ => {
            let _ = crate::dataset::manifest::parse_manifest("manifest.jsonl", bytes);
        }
    }
}

/// A pool unit's bytes as a worker takes them, past the token (a
/// certified peer's): decoded, checked against the default bounds and
/// decoded sample by sample into its buffer; then a worker's answer as the
/// sidecar takes it, for a unit of the first byte's sample count.
pub fn pool_unit(data: &[u8]) {
    use crate::pool::wire::{self, pb as pool_pb};
    use crate::pool::worker;
    if let Ok(unit) = pool_pb::DecodeUnit::decode(data) {
        // Small bounds keep each run short; the checks are the worker's.
        if let Ok(spec) = worker::check_unit(&unit, 16, 1 << 20) {
            let budget = decode::ScratchBudget::new(FUZZ_SCRATCH_BYTES);
            let answer = worker::decode_unit(
                decode::default_decoder().as_ref(),
                &budget,
                &spec,
                &unit,
                &|| false,
            );
            let checked = wire::answers_from_wire(&answer, unit.samples.len(), &spec);
            assert!(checked.is_some(), "a worker's own answer is refused");
        }
    }
    if let Some((&samples, rest)) = data.split_first() {
        if let Ok(answer) = pool_pb::DecodedUnit::decode(rest) {
            let _ = wire::answers_from_wire(
                &answer,
                usize::from(samples % 8),
                &crate::decode::OutputSpec::center(4, 4).into(),
            );
        }
    }
}

/// Shard sample counts the request fuzzer plans against.
const DATASET: &[u64] = &[100, 37, 250, 1, 64];

/// A `StreamBatchesRequest` as protobuf bytes, through the server's checks,
/// the stream's memory cost and planning (with the first batch's position).
pub fn stream_request(data: &[u8]) {
    let Ok(request) = pb::StreamBatchesRequest::decode(data) else {
        return;
    };
    check_request(&request);
}

/// The checks and planning a decoded request goes through.
pub fn check_request(request: &pb::StreamBatchesRequest) {
    let Ok(request) = crate::server::service::stream_request(request, ShuffleConfig::default())
    else {
        return;
    };
    if plan::validate_shuffle(request.plan.shuffle).is_err() {
        return;
    }
    let shuffle = request.plan.shuffle.effective();
    let cost = StreamCost::new(
        &PipelineConfig::default(),
        StreamShape {
            interleave: shuffle.interleave,
            shuffle_buffer: shuffle.buffer,
            batch_bytes: request.output.spec.bytes() as u64 * u64::from(request.plan.batch_size),
            mean_sample_bytes: 110_000,
            loose_objects: false,
            row_group_bytes: 0,
        },
    );
    let _ = cost.total();
    if let Ok(stream) = plan::plan_stream(DATASET, &request.plan) {
        if stream.batches > 0 {
            let first = stream.first_batch;
            let _ = stream.position_after(first);
            let _ = stream.global_samples_after(first);
        }
        let _ = plan::next_epoch_shard_sequence(DATASET, &request.plan);
    }
}

/// A whole Parquet file: its footer found and parsed, checked against the
/// file's size, and its first row groups' rows read with the Hugging Face
/// column names (and the path as a field), as a reader would read them.
pub fn parquet_file(data: &[u8]) {
    use crate::shard::parquet::{
        footer, read_rows, ChunkBytes, ClassNames, ColumnNames, Footer, Projection, RowGroupInput,
    };
    let size = data.len() as u64;
    let Ok(range) = footer::metadata_range(data, size) else {
        return;
    };
    let Ok(footer) = Footer::parse(&data[range.start as usize..range.end as usize], size) else {
        return;
    };
    let _ = footer.class_names("label");
    let schema = footer.metadata.file_metadata().schema_descr();
    let fields = ["image.path".to_string()];
    let Ok(projection) = Projection::resolve(schema, &ColumnNames::default(), &fields)
        .or_else(|_| Projection::resolve(schema, &ColumnNames::default(), &[]))
    else {
        return;
    };
    for group in 0..footer.row_groups().min(4) {
        let Ok(span) = footer.span(group) else {
            continue;
        };
        let chunks: Result<Vec<_>, _> = projection
            .leaves()
            .into_iter()
            .map(|column| {
                footer.chunk_range(group, column).map(|r| {
                    let data =
                        bytes::Bytes::copy_from_slice(&data[r.start as usize..r.end as usize]);
                    // In two parts, as a reader's GETs deliver them.
                    let half = data.len() / 2;
                    let parts = vec![data.slice(..half), data.slice(half..)];
                    (column, ChunkBytes::new(r.start, parts))
                })
            })
            .collect();
        let Ok(chunks) = chunks else {
            continue;
        };
        let input = RowGroupInput {
            footer: &footer,
            group,
            first_row: 0,
            projection: &projection,
            chunks,
            classes: &ClassNames::default(),
            max_field_bytes: 1 << 20,
        };
        if let Ok(rows) = read_rows(&input, 0, span.rows.min(1024)) {
            assert!(
                rows.len() as u64 <= span.rows,
                "more rows than the group has"
            );
        }
    }
}
