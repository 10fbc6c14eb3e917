//! The dev feature's commands (benchmarks, the demo, the in-process S3):
//! each builds its spec from its arguments and runs it.

use super::dev_args::*;
use super::values::CliError;

pub async fn demo(args: DemoArgs) -> Result<(), CliError> {
    use crate::dev::demo::DemoOptions;
    let defaults = DemoOptions::default();
    crate::dev::demo::run(DemoOptions {
        data: crate::dev::synthetic::SyntheticSpec {
            shards: args.shards,
            samples_per_shard: args.samples_per_shard,
            ..defaults.data
        },
        epochs: args.epochs,
        batch_size: args.batch_size,
        image_size: args.image_size,
        decode_threads: args.decode_threads.unwrap_or(defaults.decode_threads),
        cache_dir: args.cache_dir,
    })
    .await
}

pub async fn bench(args: BenchArgs) -> Result<(), CliError> {
    crate::dev::bench::run(args.source()?, &args.spec()).await
}

pub async fn cache_bench() -> Result<(), CliError> {
    crate::dev::bench::cache_policy(&crate::dev::bench::CacheBenchSpec::default()).await
}

pub async fn mix_bench(args: MixBenchArgs) -> Result<(), CliError> {
    crate::dev::mix_bench::run(&crate::dev::mix_bench::MixBenchSpec {
        data: args.stream.data(),
        batch_size: args.stream.batch_size,
        decode_threads: args.stream.decode_threads(),
        rounds: args.rounds,
    })
    .await
}

pub async fn parquet_bench(args: ParquetBenchArgs) -> Result<(), CliError> {
    crate::dev::parquet_bench::run(&crate::dev::parquet_bench::ParquetBenchSpec {
        data: args.stream.data(),
        batch_size: args.stream.batch_size,
        decode_threads: args.stream.decode_threads(),
        rounds: args.rounds,
        get_delay: std::time::Duration::from_millis(args.get_delay_ms),
        plan_files: args.plan_files,
    })
    .await
}

pub async fn pool_bench(args: PoolBenchArgs) -> Result<(), CliError> {
    let mut problems = Vec::new();
    let pool = args.pool.config(&mut problems);
    let Some(pool) = pool else {
        if args.pool.pool.is_empty() {
            problems.push("pool-bench needs --pool".into());
        }
        return Err(super::values::ConfigError(problems).into());
    };
    crate::dev::pool_bench::run(&crate::dev::pool_bench::PoolBenchSpec {
        data: args.stream.data(),
        batch_size: args.stream.batch_size,
        decode_threads: args.stream.decode_threads(),
        rounds: args.rounds,
        pool,
    })
    .await
}

pub async fn delivery_bench(args: DeliveryBenchArgs) -> Result<(), CliError> {
    crate::dev::delivery_bench::run(&crate::dev::delivery_bench::DeliveryBenchSpec {
        data: args.stream.data(),
        batch_size: args.stream.batch_size,
        decode_threads: args.stream.decode_threads(),
        rounds: args.rounds,
    })
    .await
}

pub async fn tier_stream_bench(args: TierStreamBenchArgs) -> Result<(), CliError> {
    crate::dev::tier_stream::run(&crate::dev::tier_stream::TierStreamSpec {
        data: args.stream.data(),
        batch_size: args.stream.batch_size,
        decode_threads: args.stream.decode_threads(),
        shorter_side: args.shorter_side,
    })
    .await
}

pub async fn tier_bench(args: TierBenchArgs) -> Result<(), CliError> {
    let spec = crate::dev::tier::TierSpec {
        samples: args.samples,
        rounds: args.rounds,
    };
    tokio::task::spawn_blocking(move || crate::dev::tier::run(&spec))
        .await
        .map_err(|e| e.to_string())?
}

pub async fn cache_scale_bench(args: CacheScaleArgs) -> Result<(), CliError> {
    crate::dev::cache_scale::run(&crate::dev::cache_scale::CacheScaleSpec {
        entries: args.entries as usize,
        object_bytes: args.object_bytes as usize,
        dir: args.dir,
        readers: args.readers.max(1),
        seconds: args.seconds,
    })
    .await
}

pub async fn shuffle_quality(args: ShuffleQualityArgs) -> Result<(), CliError> {
    let dataset = crate::dev::shuffle_quality::SortedDataset {
        classes: args.classes,
        samples_per_class: args.samples_per_class,
        samples_per_shard: args.samples_per_shard,
    };
    crate::dev::shuffle_quality::run(&dataset, args.batch_size, args.seed);
    Ok(())
}

pub async fn dev_s3(args: DevS3Args) -> Result<(), CliError> {
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    let server = crate::dev::s3mem::start_on(args.listen)
        .await
        .map_err(|e| format!("listening on {}: {e}", args.listen))?;
    if args.synthetic_shards > 0 {
        let spec = crate::dev::synthetic::SyntheticSpec {
            shards: args.synthetic_shards,
            samples_per_shard: args.samples_per_shard,
            ..Default::default()
        };
        let uri = crate::dev::synthetic::publish(&server, &spec).await?;
        eprintln!("published {uri}");
        if args.synthetic_loose {
            let uri = crate::dev::synthetic::publish_loose(&server, &spec).await?;
            eprintln!("published {uri}");
        }
    }
    // Faults start after publishing, which goes through the same server.
    let faults = &server.state.faults;
    faults.set_get_delay(Duration::from_millis(args.get_delay_ms));
    faults
        .slow_down_every
        .store(args.slow_down_every, Ordering::Relaxed);
    faults
        .get_bytes_per_second
        .store(args.get_mib_per_second << 20, Ordering::Relaxed);
    faults
        .fail_percent
        .store(args.fail_percent, Ordering::Relaxed);
    faults
        .list_without_etags
        .store(args.list_without_etags, Ordering::Relaxed);
    // Tests read this line to learn the port.
    println!("listening on {}", server.endpoint());
    std::io::Write::flush(&mut std::io::stdout())?;
    super::signals::shutdown_signal().await;
    Ok(())
}
