//! The record of what `serve` runs with: each setting, and where it came
//! from, logged once at start and exported as `shardfeed_setting`.

use super::{ServeArgs, ServeConfig};
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
        // A flag that names its default reads as the default.
        let fixed = [
            (
                "part_size_bytes",
                read.part_size as f64,
                read.part_size == read::DEFAULT_PART_SIZE,
            ),
            (
                "parts_in_flight",
                read.parts_in_flight as f64,
                read.parts_in_flight == read::DEFAULT_PARTS_IN_FLIGHT,
            ),
            (
                "prefetch_shards",
                streams.prefetch_shards as f64,
                streams.prefetch_shards == pipeline::DEFAULT_PREFETCH_SHARDS,
            ),
            (
                "ready_batches",
                streams.ready_batches as f64,
                streams.ready_batches == pipeline::DEFAULT_READY_BATCHES,
            ),
            (
                "shuffle_buffer",
                f64::from(streams.shuffle_buffer),
                streams.shuffle_buffer == plan::DEFAULT_SHUFFLE_BUFFER,
            ),
            (
                "interleave",
                f64::from(streams.interleave),
                streams.interleave == plan::DEFAULT_INTERLEAVE,
            ),
        ];
        for (name, value, is_default) in fixed {
            let source = if is_default {
                Source::Default
            } else {
                Source::Flag
            };
            record(name, value, source);
        }
    }
}
