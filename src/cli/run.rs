//! Carries out a parsed command by calling into the library.

use std::sync::Arc;

use super::args::{Command, IndexArgs, PackArgs, ServeArgs, WarmArgs};
#[cfg(feature = "dev")]
use super::dev_run;
use super::pool_args::PoolWorkerArgs;
use super::progress;
use super::signals;
use super::values::CliError;
use crate::dataset::{
    build_index_reporting, write_index, DatasetLayout, DatasetLocation, DatasetRegistry, DatasetUri,
};
use crate::engine::{warm, Engine};
use crate::server::{self, Listener, ShardfeedService};
use crate::store::cache::DiskCache;
use crate::tier::records::DecodedCache;

/// Runs `command` to completion.
pub async fn run(command: Command) -> Result<(), CliError> {
    match command {
        Command::Serve(args) => serve(*args).await,
        Command::Index(args) => index(args).await,
        Command::Warm(args) => warm_cache(args).await,
        Command::Pack(args) => pack(args).await,
        Command::PoolWorker(args) => pool_worker(args).await,
        Command::Health(args) => {
            if server::check_health(&args.listen).await? {
                Ok(())
            } else {
                Err(format!("{} is not SERVING", args.listen).into())
            }
        }
        Command::PrepareCacheDir(args) => {
            let (uid, gid) = args.owner;
            crate::store::cache::prepare_dir(&args.dir, uid, gid)?;
            println!("{} is owned by {uid}:{gid}, mode 0750", args.dir.display());
            Ok(())
        }
        #[cfg(feature = "dev")]
        Command::Demo(args) => dev_run::demo(args).await,
        #[cfg(feature = "dev")]
        Command::Bench(args) => dev_run::bench(args).await,
        #[cfg(feature = "dev")]
        Command::CacheBench => dev_run::cache_bench().await,
        #[cfg(feature = "dev")]
        Command::MixBench(args) => dev_run::mix_bench(args).await,
        #[cfg(feature = "dev")]
        Command::ParquetBench(args) => dev_run::parquet_bench(args).await,
        #[cfg(feature = "dev")]
        Command::PoolBench(args) => dev_run::pool_bench(args).await,
        #[cfg(feature = "dev")]
        Command::DeliveryBench(args) => dev_run::delivery_bench(args).await,
        #[cfg(feature = "dev")]
        Command::TierStreamBench(args) => dev_run::tier_stream_bench(args).await,
        #[cfg(feature = "dev")]
        Command::TierBench(args) => dev_run::tier_bench(args).await,
        #[cfg(feature = "dev")]
        Command::CacheScaleBench(args) => dev_run::cache_scale_bench(args).await,
        #[cfg(feature = "dev")]
        Command::ShuffleQuality(args) => dev_run::shuffle_quality(args).await,
        #[cfg(feature = "dev")]
        Command::DevS3(args) => dev_run::dev_s3(args).await,
    }
}

async fn serve(args: ServeArgs) -> Result<(), CliError> {
    if let Some(parent) = args.exit_with_parent {
        signals::exit_with_parent(parent)?;
    }
    let config = args.config()?;
    let metrics_listen = install_metrics(config.metrics_listen).await?;
    args.record_settings(&config);

    let registry = Arc::new(
        DatasetRegistry::new(config.s3.clone(), config.retry.clone(), config.read)
            .with_bad_shard_policy(config.engine.pipeline.on_bad_shard)
            .with_index_budget(config.engine.memory.idle_indexes)
            .with_index_limit(config.engine.memory.idle_indexes),
    );
    let engine = Engine::new(registry.clone(), config.engine.clone())
        .map_err(|e| format!("starting the decode pool: {e}"))?;
    let engine = match &config.pool {
        Some(pool) => {
            tracing::info!(
                targets = ?pool.targets,
                share = ?pool.share,
                unit_samples = pool.unit_samples,
                "sending the decode shortfall to the pool"
            );
            let client = crate::pool::PoolClient::start(pool.clone(), engine.decoder_name());
            engine.with_pool(client)
        }
        None => engine,
    };
    let tier_slot = engine.decoded_cache_slot();
    #[cfg(feature = "dev")]
    let engine = if args.dev_synthetic_batches {
        tracing::warn!("--dev-synthetic-batches: streams send pattern batches, not the dataset's");
        engine.with_stream_producer(crate::dev::transport::spawn_synthetic_stream)
    } else {
        engine
    };
    let service = ShardfeedService::new(engine, config.service.clone());
    let listener = Listener::bind(&config.listen).await?;
    // The cache is opened after the listener is bound: adopting millions of
    // entries takes a while, and meanwhile health answers NOT_SERVING.
    // So is the decoded-source tier: waiting for a free slot of its
    // directory (a pod replacing another drains first), it answers
    // NOT_SERVING rather than not at all.
    let startup = {
        let cache = config.cache.clone();
        let (tier_args, index_memory) = (args.cache.clone(), config.engine.memory.decoded_index);
        async move {
            if let Some(dir) = &tier_args.decoded_cache_dir {
                // Earlier records are taken in on a thread of their own.
                let tier = open_tier(dir, &tier_args, true)
                    .await
                    .map_err(|e| e.to_string())?;
                tier.limit_index_memory(index_memory);
                tracing::info!(
                    dir = %dir.display(),
                    index_memory_mib = index_memory >> 20,
                    "decoded-source tier opened"
                );
                let _ = tier_slot.set(tier);
            }
            let Some(cache) = cache else {
                return Ok(());
            };
            let cache = DiskCache::open_waiting(cache)
                .await
                .map_err(|e| e.to_string())?;
            registry.set_cache(cache);
            Ok(())
        }
    };
    tracing::info!(
        listen = %listener.local_addr(),
        metrics = %metrics_listen,
        decode_threads = config.engine.decode_threads,
        max_streams = config.service.max_streams,
        stream_memory_mib = config.engine.memory.streams >> 20,
        decode_scratch_mib = config.engine.memory.decode_scratch >> 20,
        allow = ?config.service.allow,
        "shardfeed serving"
    );
    server::serve(
        listener,
        service,
        startup,
        signals::shutdown_signal(),
        config.shutdown_grace,
    )
    .await?;
    tracing::info!("shut down");
    Ok(())
}

/// Serves /metrics on `addr` with the shared buckets and help texts,
/// behind the listener bounds of `net::metrics_listener`, and returns the
/// address served: port 0 becomes a free port, so the start-up log can say
/// where (a local `serve()` from Python asks for port 0 and reads it back).
async fn install_metrics(addr: std::net::SocketAddr) -> Result<std::net::SocketAddr, CliError> {
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("_seconds".into()),
            crate::metrics::SECONDS_BUCKETS,
        )?
        .install_recorder()
        .map_err(|e| format!("installing the metrics recorder: {e}"))?;
    crate::metrics::describe();
    let bounds = crate::net::metrics_listener::MetricsBounds::DEFAULT;
    // The task serves for the process's life.
    let (bound, _served) = crate::net::metrics_listener::bind_and_serve(addr, handle, bounds)
        .await
        .map_err(|e| format!("starting the metrics listener on {addr}: {e}"))?;
    Ok(bound)
}

async fn pool_worker(args: PoolWorkerArgs) -> Result<(), CliError> {
    let config = args.config()?;
    let metrics_listen = install_metrics(args.metrics_listen).await?;
    tracing::info!(metrics = %metrics_listen, "pool worker metrics");
    crate::pool::serve_worker(config, signals::shutdown_signal()).await?;
    Ok(())
}

async fn index(args: IndexArgs) -> Result<(), CliError> {
    let uri = DatasetUri::parse(&args.uri)?;
    let registry = DatasetRegistry::new(
        args.s3.config(),
        args.read.retry_policy(),
        args.read.read_config(),
    );
    let (store, prefix) = registry.store_for(&uri).await;
    let location = DatasetLocation {
        prefix,
        manifest: uri.manifest().map(str::to_string),
    };
    let started = std::time::Instant::now();
    let bar = progress::bytes("scanning shards");
    let (index, shard_indexes) = build_index_reporting(
        store.clone(),
        &location,
        registry.read_config(),
        args.read.on_bad_shard.into(),
        // The tool has the machine to itself; a server opening the index it
        // writes holds the summary to its own share of its memory limit.
        u64::MAX,
        &|p| {
            progress::set_total(&bar, p.bytes_done, p.bytes);
            bar.set_message(format!("{}/{} shards", p.shards_done, p.shards));
        },
    )
    .await?;
    bar.finish_and_clear();
    write_index(store.as_ref(), &location, &index, &shard_indexes).await?;
    let what = match index.layout {
        DatasetLayout::Shards => format!("{} shards", index.shards.len()),
        DatasetLayout::Objects if index.classes.is_empty() => "loose objects".to_string(),
        DatasetLayout::Objects => format!("loose objects in {} classes", index.classes.len()),
    };
    println!(
        "indexed {}: {what}, {} samples, {:.1} MB in {:.1}s; wrote {}",
        args.uri,
        index.samples(),
        index.bytes() as f64 / 1e6,
        started.elapsed().as_secs_f64(),
        store.location(&location.index_root()),
    );
    Ok(())
}

async fn warm_cache(args: WarmArgs) -> Result<(), CliError> {
    let cache_config = args.cache_config()?;
    if let Some(shorter_side) = args.decoded {
        return warm_decoded(&args, shorter_side, cache_config).await;
    }
    let cache_config = cache_config.ok_or("--cache-dir is required")?;
    let cache = DiskCache::open_waiting(cache_config).await?;
    let registry = DatasetRegistry::new(
        args.s3.config(),
        args.read.retry_policy(),
        args.read.read_config(),
    )
    .with_cache(cache.clone());
    let started = std::time::Instant::now();
    let bar = progress::bytes(&format!("warming {}", args.uri));
    let report = warm::warm(
        &registry,
        &args.uri,
        &args.read.read_config(),
        |done, total| progress::set_total(&bar, done, total),
    )
    .await?;
    bar.finish_and_clear();
    if report.complete() {
        println!(
            "all {} shards cached ({:.1} MB) in {} after {:.1}s",
            report.total_shards,
            report.total_bytes as f64 / 1e6,
            cache.config().dir.display(),
            started.elapsed().as_secs_f64()
        );
    } else {
        println!(
            "cache full: {} of {} shards cached ({:.1} MB in {}); the rest is read from S3 during training",
            report.cached_shards,
            report.total_shards,
            report.cache_used_bytes as f64 / 1e6,
            cache.config().dir.display(),
        );
    }
    Ok(())
}

/// `warm --decoded`: streams the dataset once, in stored order, through the
/// decoded-source tier, so every sample's source is kept (and, with
/// `--eval-size`, its evaluation output).
async fn warm_decoded(
    args: &WarmArgs,
    shorter_side: u32,
    cache_config: Option<crate::store::cache::CacheConfig>,
) -> Result<(), CliError> {
    let dir = args
        .cache
        .decoded_cache_dir
        .clone()
        .ok_or("--decoded needs --decoded-cache-dir")?;
    let tier = open_tier(&dir, &args.cache, false).await?;
    // The bound the serving sidecar keeps (where it has the same memory).
    tier.limit_index_memory(crate::engine::budget::MemoryConfig::detect().decoded_index);
    let mut registry = DatasetRegistry::new(
        args.s3.config(),
        args.read.retry_policy(),
        args.read.read_config(),
    );
    if let Some(config) = cache_config {
        registry = registry.with_cache(DiskCache::open_waiting(config).await?);
    }
    let engine = Engine::new(Arc::new(registry), crate::engine::EngineConfig::default())?
        .with_decoded_cache(tier.clone());
    let started = std::time::Instant::now();
    let bar = progress::count("warming the decoded tier");
    bar.set_message("samples");
    let report = crate::engine::warm::warm_decoded(
        &engine,
        &args.uri,
        shorter_side,
        args.eval_size,
        |samples| bar.set_position(samples),
    )
    .await?;
    bar.finish_and_clear();
    let (samples, substituted) = (report.samples, report.substituted);
    println!(
        "decoded tier in {}: {} records, {:.1} MB ({} samples read in {:.1}s{})",
        dir.display(),
        tier.records(),
        tier.bytes() as f64 / 1e6,
        samples,
        started.elapsed().as_secs_f64(),
        if substituted > 0 {
            format!(", {substituted} could not be decoded")
        } else {
            String::new()
        }
    );
    Ok(())
}

async fn pack(args: PackArgs) -> Result<(), CliError> {
    args.check()?;
    let registry = DatasetRegistry::new(
        args.s3.config(),
        args.read.retry_policy(),
        args.read.read_config(),
    );
    let source = match args.source_uri() {
        Some(uri) => crate::pack::PackSource::Objects(registry.open(uri).await?),
        None => crate::pack::PackSource::Folder(args.source.clone()),
    };
    let config = args.config(source);
    let (store, prefix) = registry.store_for(&DatasetUri::parse(&args.dest)?).await;
    let bar = progress::bytes("packing");
    let report = crate::pack::pack(&config, store, &prefix, |p| {
        progress::set_total(&bar, p.bytes_done, p.bytes);
        bar.set_message(format!(
            "{}/{} files, {} shards",
            p.files_done, p.files, p.shards_done
        ));
    })
    .await?;
    bar.finish_and_clear();
    if let Some(path) = &args.report {
        write_pack_report(path, &args.dest, &report)?;
    }
    for skipped in report.skipped.iter().take(20) {
        eprintln!("skipped {}: {}", skipped.path.display(), skipped.reason);
    }
    if report.skipped.len() > 20 {
        eprintln!("… and {} more skipped", report.skipped.len() - 20);
    }
    println!(
        "packed {} samples into {} shards ({:.1} MB) at {} in {:.1}s: {:.0} images/s, {:.1} MB/s; \
         {} classes; {} files skipped",
        report.samples,
        report.shards,
        report.bytes as f64 / 1e6,
        args.dest,
        report.seconds,
        report.samples as f64 / report.seconds.max(1e-9),
        report.bytes as f64 / report.seconds.max(1e-9) / 1e6,
        report.classes.len(),
        report.skipped.len(),
    );
    Ok(())
}

/// `pack --report`: the report as JSON, for tools (Python's `pack()`).
fn write_pack_report(
    path: &std::path::Path,
    dest: &str,
    report: &crate::pack::PackReport,
) -> Result<(), CliError> {
    let skipped: Vec<_> = report
        .skipped
        .iter()
        .map(|s| serde_json::json!({"path": s.path.display().to_string(), "reason": s.reason}))
        .collect();
    let json = serde_json::json!({
        "dataset": dest,
        "samples": report.samples,
        "shards": report.shards,
        "bytes": report.bytes,
        "seconds": report.seconds,
        "classes": report.classes,
        "skipped": skipped,
    });
    std::fs::write(path, format!("{json:#}\n"))
        .map_err(|e| format!("writing the report to {}: {e}", path.display()))?;
    Ok(())
}

/// The decoded-source tier in the first free slot of `dir` (as many slots
/// as the shard cache has), waiting up to `--cache-lock-wait` while every
/// slot is held (the shard cache's wait: `store::cache::wait_for_slot`).
/// `background`: earlier records are taken in while it serves.
async fn open_tier(
    dir: &std::path::Path,
    cache: &super::store_args::CacheArgs,
    background: bool,
) -> Result<Arc<DecodedCache>, CliError> {
    use crate::store::cache::{wait_for_slot, SlotWaitError};
    use crate::tier::records::TierError;
    let (owned, size, slots) = (
        dir.to_path_buf(),
        cache.decoded_cache_size,
        cache.cache_slots,
    );
    let wait = std::time::Duration::from_secs(cache.cache_lock_wait);
    let attempt = move || {
        let opened = if background {
            DecodedCache::open_slot_in_background(&owned, size, slots)
        } else {
            DecodedCache::open_slot(&owned, size, slots).map(Arc::new)
        };
        match opened {
            Err(TierError::SlotsHeld { .. }) => Ok(None),
            other => other.map(Some),
        }
    };
    match wait_for_slot(dir, slots, wait, attempt).await {
        Ok(Ok(tier)) => Ok(tier),
        Ok(Err(_)) => Err(TierError::SlotsHeld {
            dir: dir.to_path_buf(),
            slots: slots.max(1),
        }
        .into()),
        Err(SlotWaitError::Attempt(error)) => Err(error.into()),
        Err(SlotWaitError::Task(error)) => Err(error.to_string().into()),
    }
}
