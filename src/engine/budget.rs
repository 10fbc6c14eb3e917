//! The host's memory budget: what one stream costs by the stated formula,
//! and admission of streams against `--memory-limit`.
//!
//! A stream's memory is fixed when it is opened: every queue and buffer of
//! its pipeline has a bound (see `pipeline`), so its peak is a formula of the
//! request and the server's settings. The engine computes it, before
//! planning or allocating anything, and reserves it from the budget for the
//! life of the stream; a stream that cannot fit is refused with the term that
//! dominates, so the caller knows which field to lower.
//!
//! The budget splits `--memory-limit` (default: the cgroup's limit, else the
//! machine's memory) three ways:
//!
//! ```text
//! streams        = limit * 3/4 - decode scratch
//! decode scratch = min(limit / 8, 1 GiB)     (full-size decodes, all threads)
//! the rest       = limit / 4                 (runtime, indexes, gRPC, allocator slack),
//!                                            of which idle datasets' indexes ≤ limit / 8
//!                                            and an index build's scans
//!                                            ≤ max(256 MiB, 4 × part size)
//! ```

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics;
use crate::pipeline::PipelineConfig;

/// Admission counts in KiB so that budgets of terabytes fit the semaphore's
/// `u32` requests.
const UNIT: u64 = 1 << 10;
const MAX_DECODE_SCRATCH: u64 = 1 << 30;

/// The memory limit the server plans for when `--memory-limit` is not
/// given: this process's cgroup limit (v1, v2 or hybrid; see
/// [`super::cgroup`]), at most the machine's memory, else the machine's.
pub fn detect_memory_limit() -> Option<u64> {
    match (
        super::cgroup::memory_limit(Path::new("/")),
        machine_memory(),
    ) {
        (Some(limit), Some(machine)) => Some(limit.min(machine)),
        (limit, machine) => limit.or(machine),
    }
}

/// Where [`detect_memory_limit`]'s value comes from.
pub fn memory_limit_source() -> super::sizing::Source {
    match super::cgroup::memory_limit(Path::new("/")) {
        Some(_) => super::sizing::Source::CgroupMemory,
        None => super::sizing::Source::MachineMemory,
    }
}

fn machine_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// How `--memory-limit` is shared out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryConfig {
    /// Bytes all streams together may reserve.
    pub streams: u64,
    /// Bytes of full-size decode buffers all decode threads may hold at once.
    pub decode_scratch: u64,
    /// Bytes of dataset indexes kept for datasets no stream uses (part of
    /// the quarter left to the runtime and indexes).
    pub idle_indexes: u64,
    /// Bytes the decoded-source tier's index may take (also of that
    /// quarter): it caps the tier's records.
    pub decoded_index: u64,
    /// How long a stream that does not fit waits for streams that end to
    /// give memory back before it is refused.
    pub admission_wait: Duration,
}

/// A stream a client just broke out of gives its memory back once its
/// decode in flight is done (seconds with large batches): a stream opened
/// right after it waits that long rather than be refused.
pub const ADMISSION_WAIT: Duration = Duration::from_secs(10);

impl MemoryConfig {
    pub fn from_limit(limit: u64) -> Self {
        let decode_scratch = (limit / 8).min(MAX_DECODE_SCRATCH);
        Self {
            streams: (limit / 4 * 3).saturating_sub(decode_scratch),
            decode_scratch,
            idle_indexes: limit / 8,
            decoded_index: limit / 32,
            admission_wait: ADMISSION_WAIT,
        }
    }

    /// From the detected limit; 12 GiB (the chart's default) when none can
    /// be read.
    pub fn detect() -> Self {
        Self::from_limit(detect_memory_limit().unwrap_or(12 << 30))
    }
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self::detect()
    }
}

/// The terms of one stream's peak memory, in bytes (docs/reference/memory.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamCost {
    /// `(interleave + prefetch_shards) * (parts_in_flight + 2) * part_size`:
    /// parts in flight, the part being handed to the parser, and the
    /// parser's own buffer (up to a part plus the member it straddles),
    /// where `parts_in_flight` is the flag's count, or sized,
    /// `clamp(32 MiB / part_size, 2, 16)`.
    /// For loose objects, `(interleave + prefetch_shards) *
    /// (object_requests + 1) * S`: whole objects in flight and the one
    /// being handed on, where `object_requests` is the flag's count, or
    /// sized, `clamp(32 MiB / S, 16, 128)`.
    /// For Parquet row groups, `(interleave + prefetch_shards) * max(parts
    /// term, R)` where `R` is the largest row group's `compressed + 2 ×
    /// uncompressed` bytes: its chunks, their pages and the rows copied out.
    pub readers: u64,
    /// `(interleave + prefetch_shards) * reader_queue * S`
    pub reader_queues: u64,
    /// `shuffle_buffer * S`
    pub shuffle_buffer: u64,
    /// `(decode_ahead + ready_batches + 3) * batch_size * H * W * 3`
    pub batches: u64,
    /// What one reader holds for the largest Parquet row group (0: none):
    /// part of `readers`, kept apart because no request field shrinks it.
    pub row_group: u64,
}

/// The inputs of [`StreamCost`] a request chooses.
#[derive(Debug, Clone, Copy)]
pub struct StreamShape {
    pub interleave: u32,
    pub shuffle_buffer: u32,
    pub batch_bytes: u64,
    /// Mean compressed sample size of the dataset (`S`).
    pub mean_sample_bytes: u64,
    /// The dataset is loose objects: readers hold whole objects, not parts.
    pub loose_objects: bool,
    /// What a reader holds to read the dataset's largest Parquet row group
    /// (0: no row groups).
    pub row_group_bytes: u64,
}

impl StreamCost {
    pub fn new(config: &PipelineConfig, shape: StreamShape) -> Self {
        let readers = u64::from(shape.interleave) + config.prefetch_shards as u64;
        let s = shape.mean_sample_bytes;
        let per_reader = if shape.loose_objects {
            (config.read.object_requests_ceiling(s) as u64 + 1).saturating_mul(s)
        } else {
            (config.read.parts_per_reader() as u64 + 2)
                .saturating_mul(config.read.part_size)
                .max(shape.row_group_bytes)
        };
        let batches = (config.decode_ahead + config.ready_batches + 3) as u64;
        Self {
            readers: readers.saturating_mul(per_reader),
            reader_queues: readers
                .saturating_mul(config.reader_queue as u64)
                .saturating_mul(s),
            shuffle_buffer: u64::from(shape.shuffle_buffer).saturating_mul(s),
            batches: batches.saturating_mul(shape.batch_bytes),
            row_group: shape.row_group_bytes,
        }
    }

    /// A mixed stream's: each source's readers, queues (plus a batch of
    /// samples queued for the mixer) and shuffle buffer, and one stream's
    /// batches (`sources[0].batch_bytes`).
    pub fn mixed(config: &PipelineConfig, sources: &[StreamShape], batch_size: u32) -> Self {
        let mut total = Self {
            readers: 0,
            reader_queues: 0,
            shuffle_buffer: 0,
            batches: 0,
            row_group: 0,
        };
        for (k, shape) in sources.iter().enumerate() {
            let one = Self::new(config, *shape);
            total.readers = total.readers.saturating_add(one.readers);
            total.reader_queues = total
                .reader_queues
                .saturating_add(one.reader_queues)
                .saturating_add(u64::from(batch_size).saturating_mul(shape.mean_sample_bytes));
            total.shuffle_buffer = total.shuffle_buffer.saturating_add(one.shuffle_buffer);
            total.row_group = total.row_group.max(one.row_group);
            if k == 0 {
                total.batches = one.batches;
            }
        }
        total
    }

    pub fn total(&self) -> u64 {
        self.readers
            .saturating_add(self.reader_queues)
            .saturating_add(self.shuffle_buffer)
            .saturating_add(self.batches)
    }

    /// The request field whose term dominates, to name in a refusal.
    pub fn dominant_field(&self) -> &'static str {
        let terms = [
            (self.batches, "batch_size x height x width"),
            (self.shuffle_buffer, "shuffle_buffer"),
            (
                self.readers.saturating_add(self.reader_queues),
                "interleave",
            ),
        ];
        terms
            .iter()
            .max_by_key(|(bytes, _)| *bytes)
            .map_or("batch_size", |(_, field)| field)
    }
}

impl std::fmt::Display for StreamCost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (readers {} + reader queues {} + shuffle buffer {} + batches {})",
            mib(self.total()),
            mib(self.readers),
            mib(self.reader_queues),
            mib(self.shuffle_buffer),
            mib(self.batches)
        )
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / f64::from(1 << 20))
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum BudgetError {
    #[error(
        "this stream needs {cost}, more than the {budget} all streams may use \
         (--memory-limit); lower {field}"
    )]
    NeverFits {
        cost: StreamCost,
        budget: String,
        field: &'static str,
    },
    #[error(
        "the dataset's largest Parquet row group needs {bytes} bytes in memory to read \
         (compressed + 2 x uncompressed of its columns, + {per_row} a row), more than the \
         {budget} all streams may use (--memory-limit); write smaller row groups (pyarrow: \
         row_group_size) or raise --memory-limit",
        per_row = crate::shard::parquet::BYTES_PER_ROW
    )]
    RowGroupNeverFits { bytes: u64, budget: String },
    #[error(
        "this stream needs {cost}; {free} of the {budget} stream memory budget is free \
         (--memory-limit). Retry when a stream ends, or lower {field}"
    )]
    Busy {
        cost: StreamCost,
        free: String,
        budget: String,
        field: &'static str,
    },
}

/// The streams' share of the memory limit, reserved stream by stream.
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    total: u64,
    free: Arc<Semaphore>,
    admission_wait: Duration,
}

/// Memory reserved for one stream; returned when dropped.
#[derive(Debug)]
pub struct Reservation {
    _permit: OwnedSemaphorePermit,
    _gauge: metrics::GaugeGuard,
}

impl MemoryBudget {
    pub fn new(bytes: u64) -> Self {
        let units = (bytes / UNIT).min(Semaphore::MAX_PERMITS as u64);
        ::metrics::gauge!(metrics::MEMORY_BUDGET).set(bytes as f64);
        Self {
            total: units * UNIT,
            free: Arc::new(Semaphore::new(units as usize)),
            admission_wait: Duration::ZERO,
        }
    }

    /// A budget whose [`MemoryBudget::admit`] waits up to `wait`.
    pub fn with_admission_wait(mut self, wait: Duration) -> Self {
        self.admission_wait = wait;
        self
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn free(&self) -> u64 {
        self.free.available_permits() as u64 * UNIT
    }

    /// Reserves `cost`, waiting up to the admission wait for streams that
    /// end to give memory back (first come, first served: the semaphore is
    /// fair); says why not after that. A caller that goes away stops
    /// waiting and holds nothing.
    pub async fn admit(&self, cost: StreamCost) -> Result<Reservation, BudgetError> {
        match self.reserve(cost) {
            Err(BudgetError::Busy { .. }) if !self.admission_wait.is_zero() => {
                let units = u32::try_from(cost.total().div_ceil(UNIT)).unwrap_or(u32::MAX);
                let waited = tokio::time::timeout(
                    self.admission_wait,
                    self.free.clone().acquire_many_owned(units),
                )
                .await;
                match waited {
                    Ok(Ok(permit)) => Ok(Reservation::new(permit)),
                    // Still busy: the refusal says what is free now.
                    _ => self.reserve(cost),
                }
            }
            other => other,
        }
    }

    /// Reserves `cost` or says why not; never waits.
    pub fn reserve(&self, cost: StreamCost) -> Result<Reservation, BudgetError> {
        let bytes = cost.total();
        let units = bytes.div_ceil(UNIT);
        let field = cost.dominant_field();
        if cost.row_group > self.total {
            // No request field shrinks a row group: the file is what to change.
            return Err(BudgetError::RowGroupNeverFits {
                bytes: cost.row_group,
                budget: mib(self.total),
            });
        }
        if bytes > self.total {
            return Err(BudgetError::NeverFits {
                cost,
                budget: mib(self.total),
                field,
            });
        }
        let permit = u32::try_from(units)
            .ok()
            .and_then(|units| self.free.clone().try_acquire_many_owned(units).ok())
            .ok_or_else(|| BudgetError::Busy {
                cost,
                free: mib(self.free()),
                budget: mib(self.total),
                field,
            })?;
        Ok(Reservation::new(permit))
    }
}

impl Reservation {
    /// Holds `permit` (its units of the budget), counted in the gauge.
    fn new(permit: OwnedSemaphorePermit) -> Self {
        let bytes = permit.num_permits() as u64 * UNIT;
        Self {
            _permit: permit,
            _gauge: metrics::GaugeGuard::new(metrics::MEMORY_RESERVED, bytes as f64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(shuffle_buffer: u32, batch_bytes: u64) -> StreamShape {
        StreamShape {
            interleave: 4,
            shuffle_buffer,
            batch_bytes,
            mean_sample_bytes: 110_000,
            loose_objects: false,
            row_group_bytes: 0,
        }
    }

    #[test]
    fn the_default_stream_costs_what_the_readme_says() {
        let cost = StreamCost::new(
            &PipelineConfig::default(),
            shape(2_000, 128 * 224 * 224 * 3),
        );
        // docs/reference/memory.md: 288 MiB + 42 MB + 220 MB + 7 batches
        // of 19.3 MB; sized, a reader keeps 32 MiB of parts in flight.
        assert_eq!(cost.readers, 6 * (4 + 2) * (8 << 20));
        assert_eq!(cost.reader_queues, 6 * 64 * 110_000);
        assert_eq!(cost.shuffle_buffer, 2_000 * 110_000);
        assert_eq!(cost.batches, 7 * 128 * 224 * 224 * 3);
        assert!(cost.total() > 600 << 20 && cost.total() < 700 << 20);
        let mut fixed = PipelineConfig::default();
        fixed.read.parts_sized = false;
        let cost = StreamCost::new(&fixed, shape(2_000, 128 * 224 * 224 * 3));
        assert_eq!(cost.readers, 6 * (2 + 2) * (8 << 20), "the flag's count");
    }

    #[test]
    fn loose_readers_are_counted_at_their_sized_ceiling_or_the_flag() {
        let loose = StreamShape {
            loose_objects: true,
            row_group_bytes: 0,
            ..shape(2_000, 128 * 224 * 224 * 3)
        };
        // Sized: up to 32 MiB / 110 KB, capped at 128, GETs per reader.
        let cost = StreamCost::new(&PipelineConfig::default(), loose);
        assert_eq!(cost.readers, 6 * (128 + 1) * 110_000);
        let mut fixed = PipelineConfig::default();
        fixed.read.object_requests_in_flight = 24;
        fixed.read.object_requests_sized = false;
        assert_eq!(
            StreamCost::new(&fixed, loose).readers,
            6 * (24 + 1) * 110_000
        );
    }

    #[test]
    fn reservations_are_refused_named_and_returned() {
        let budget = MemoryBudget::new(2 << 30);
        let config = PipelineConfig::default();
        let huge = StreamCost::new(&config, shape(1 << 20, 19 << 20));
        match budget.reserve(huge) {
            Err(BudgetError::NeverFits { field, .. }) => assert_eq!(field, "shuffle_buffer"),
            other => panic!("{other:?}"),
        }
        let one = StreamCost::new(&config, shape(2_000, 128 * 224 * 224 * 3));
        let first = budget.reserve(one).unwrap();
        let second = budget.reserve(one).unwrap();
        let third = budget.reserve(one).unwrap();
        assert!(matches!(budget.reserve(one), Err(BudgetError::Busy { .. })));
        drop((first, second));
        assert!(budget.reserve(one).is_ok());
        drop(third);
        assert_eq!(budget.free(), budget.total());
    }

    #[test]
    fn a_row_group_no_budget_holds_is_the_files_fault_not_a_fields() {
        let budget = MemoryBudget::new(512 << 20);
        let config = PipelineConfig::default();
        let parquet = |row_group_bytes| StreamShape {
            interleave: 1,
            row_group_bytes,
            ..shape(0, 16 * 224 * 224 * 3)
        };
        // One reader cannot hold it at any interleave: write smaller groups.
        match budget.reserve(StreamCost::new(&config, parquet(600 << 20))) {
            Err(BudgetError::RowGroupNeverFits { bytes, .. }) => assert_eq!(bytes, 600 << 20),
            other => panic!("{other:?}"),
        }
        // One reader holds it, the request's readers do not: a lower interleave.
        let wide = StreamShape {
            interleave: 8,
            ..parquet(100 << 20)
        };
        match budget.reserve(StreamCost::new(&config, wide)) {
            Err(BudgetError::NeverFits { field, .. }) => assert_eq!(field, "interleave"),
            other => panic!("{other:?}"),
        }
    }

    /// The sidecar chart's default memory limit, in bytes.
    fn chart_memory_limit() -> u64 {
        let values = include_str!("../../helm/shardfeed/charts/shardfeed-sidecar/values.yaml");
        let mut lines = values.lines().skip_while(|line| *line != "  limits:");
        lines.next();
        let quantity = lines
            .next()
            .and_then(|line| line.trim().strip_prefix("memory: "))
            .expect("resources.limits.memory in the chart's values");
        let gib: u64 = quantity.strip_suffix("Gi").unwrap().parse().unwrap();
        gib << 30
    }

    /// A host of 8 GPUs runs 8 training streams and, during evaluation, 8
    /// more (no shuffle: one reader, no buffer): the chart's default admits
    /// them all with 110 KB samples; the former 8 GiB did not.
    #[test]
    fn the_chart_default_admits_eight_training_and_eight_evaluation_streams() {
        let config = PipelineConfig::default();
        let training = StreamCost::new(&config, shape(2_000, 128 * 224 * 224 * 3));
        let evaluation = StreamCost::new(
            &config,
            StreamShape {
                interleave: 1,
                ..shape(0, 128 * 224 * 224 * 3)
            },
        );
        let admitted = |limit: u64| {
            let budget = MemoryBudget::new(MemoryConfig::from_limit(limit).streams);
            let held: Vec<_> = std::iter::repeat_n(training, 8)
                .chain(std::iter::repeat_n(evaluation, 8))
                .map_while(|cost| budget.reserve(cost).ok())
                .collect();
            held.len()
        };
        assert_eq!(admitted(chart_memory_limit()), 16);
        assert!(admitted(8 << 30) < 16);
    }

    #[test]
    fn the_limit_is_shared_out_as_documented() {
        let config = MemoryConfig::from_limit(8 << 30);
        assert_eq!(config.decode_scratch, 1 << 30);
        assert_eq!(config.streams, 5 << 30);
        let small = MemoryConfig::from_limit(1 << 30);
        assert_eq!(small.decode_scratch, 128 << 20);
        assert!(detect_memory_limit().is_some_and(|limit| limit > 0));
    }
}
