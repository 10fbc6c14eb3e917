//! The record of what `serve` runs with: each setting, and where it came
//! from, logged once at start and exported as `shardfeed_setting`.

use super::args::{ServeArgs, ServeConfig};
use crate::engine;
use crate::engine::sizing::{record, Source};
use crate::pipeline;
use crate::plan;
use crate::store::read;

impl ServeArgs {
    /// Logs each setting the server runs with and where it came from, and
    /// exports it (`shardfeed_setting`).
    pub fn record_settings(&self, config: &ServeConfig) {
        let threads = self.streams.decode_threads_sized();
        record("decode_threads", threads.value as f64, threads.source);
        let memory = match self.streams.memory_limit {
            Some(_) => Source::Flag,
            None => engine::budget::memory_limit_source(),
        };
        let budget = &config.engine.memory;
        record("stream_memory_bytes", budget.streams as f64, memory);
        record("decode_scratch_bytes", budget.decode_scratch as f64, memory);
        let (read, streams) = (&config.read, &self.streams);
        // Sized: the count a loose reader starts at (each stream grows it).
        let objects = if read.object_requests_sized {
            Source::Sized
        } else {
            Source::Flag
        };
        record(
            "object_requests_in_flight",
            read.object_requests_in_flight as f64,
            objects,
        );
        // Sized from the part size where no flag sets it.
        let parts = if read.parts_sized {
            Source::Default
        } else {
            Source::Flag
        };
        record("parts_in_flight", read.parts_per_reader() as f64, parts);
        // A flag that names its default reads as the default.
        let fixed = [
            ("part_size_bytes", read.part_size, read::DEFAULT_PART_SIZE),
            (
                "prefetch_shards",
                streams.prefetch_shards as u64,
                pipeline::DEFAULT_PREFETCH_SHARDS as u64,
            ),
            (
                "ready_batches",
                streams.ready_batches as u64,
                pipeline::DEFAULT_READY_BATCHES as u64,
            ),
            (
                "shuffle_buffer",
                u64::from(streams.shuffle_buffer),
                u64::from(plan::DEFAULT_SHUFFLE_BUFFER),
            ),
            (
                "interleave",
                u64::from(streams.interleave),
                u64::from(plan::DEFAULT_INTERLEAVE),
            ),
        ];
        for (name, value, default) in fixed {
            let source = if value == default {
                Source::Default
            } else {
                Source::Flag
            };
            record(name, value as f64, source);
        }
    }
}
