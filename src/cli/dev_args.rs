//! Arguments of the dev tooling's commands (feature `dev`: demo,
//! benchmarks, the in-memory S3 server): none of it is in the sidecar.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::RangedU64ValueParser;
use clap::Args;

use super::pool_args::PoolArgs;
use super::store_args::{ReadArgs, S3Args};
use super::values::ConfigError;
use crate::engine;
use crate::pipeline::PipelineConfig;

#[derive(Args, Debug)]
pub struct DemoArgs {
    #[arg(long, default_value_t = 8, value_parser = RangedU64ValueParser::<usize>::new().range(1..=10_000))]
    pub shards: usize,
    #[arg(long, default_value_t = 192, value_parser = RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    pub samples_per_shard: usize,
    #[arg(long, default_value_t = 2)]
    pub epochs: u64,
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub batch_size: u32,
    #[arg(long, default_value_t = 224, value_parser = clap::value_parser!(u32).range(8..=crate::decode::MAX_SIZE as i64))]
    pub image_size: u32,
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub decode_threads: Option<usize>,
    /// Read through a disk cache in this directory.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// s3://bucket/prefix/ or file:///abs/dir/ (omit with --synthetic).
    pub uri: Option<String>,
    /// Benchmark a synthetic photo-like dataset served from memory.
    #[arg(long)]
    pub synthetic: bool,
    /// Synthetic dataset: shards and samples per shard.
    #[arg(long, default_value_t = 16)]
    pub shards: usize,
    #[arg(long, default_value_t = 256)]
    pub samples_per_shard: usize,
    /// Synthetic dataset: delay before every GET response, like S3's time to first byte.
    #[arg(long, default_value_t = 0)]
    pub get_delay_ms: u64,
    /// Synthetic dataset: run twice without and twice with this GET delay,
    /// alternating, and print the throughput ratio.
    #[arg(long)]
    pub compare_get_delay_ms: Option<u64>,
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub batch_size: u32,
    #[arg(long, default_value_t = 224, value_parser = clap::value_parser!(u32).range(8..=crate::decode::MAX_SIZE as i64))]
    pub image_size: u32,
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub decode_threads: Option<usize>,
    /// Shard readers started ahead of the ones in use (as `serve`'s flag).
    #[arg(long, default_value_t = crate::pipeline::DEFAULT_PREFETCH_SHARDS,
          value_parser = RangedU64ValueParser::<usize>::new().range(0..=64))]
    pub prefetch_shards: usize,
    /// Stop after this many batches (0: one whole epoch).
    #[arg(long, default_value_t = 0)]
    pub max_batches: u64,
    /// The transform measured: `center` (the covering center crop), `eval`
    /// (Resize(size x 256/224) + CenterCrop), `train` (RandomResizedCrop +
    /// flip, torchvision's defaults), or `train` and then the ops of a
    /// recipe: `trivial` (TrivialAugmentWide, bilinear, + RandomErasing
    /// 0.1: torchvision's ResNet-50 V2), `rand` (RandAugment(2, 9): its
    /// ViT), `auto` (AutoAugment ImageNet + RandomErasing 0.2: its
    /// MobileNetV3), `jitter` (ColorJitter(0.4, 0.4, 0.4) + grayscale 0.2),
    /// `dino` (DINOv2's global crop's ops: RandomApply(ColorJitter) 0.8,
    /// grayscale 0.2, GaussianBlur(9, 0.1-2)), `deit` (timm's
    /// rand-m9-mstd0.5-inc1 + RandomErasing(0.25, pixel): DeiT's, with
    /// `--interpolation bicubic`).
    #[arg(long, default_value = "center",
          value_parser = ["center", "eval", "train", "trivial", "rand", "auto", "jitter", "dino",
                          "deit"])]
    pub augment: String,
    /// How the crop is resized (antialiased, as torchvision's and PIL's).
    #[arg(long, default_value = "bilinear", value_parser = ["bilinear", "bicubic"])]
    pub interpolation: String,
    #[command(flatten)]
    pub s3: S3Args,
    #[command(flatten)]
    pub read: ReadArgs,
}

impl BenchArgs {
    fn output(&self) -> crate::decode::OutputSpec {
        use crate::decode::{Crop, HorizontalFlip, Ops, OutputSpec, RandomResizedCrop, Resample};
        let resample = match self.interpolation.as_str() {
            "bicubic" => Resample::Bicubic,
            _ => Resample::Bilinear,
        };
        let center = OutputSpec {
            resample,
            ..OutputSpec::center(self.image_size, self.image_size)
        };
        let train = OutputSpec {
            crop: Crop::RandomResized(RandomResizedCrop::default()),
            ops: Ops::default().with(HorizontalFlip(0.5)),
            ..center
        };
        match self.augment.as_str() {
            "train" => train,
            recipe @ ("trivial" | "rand" | "auto" | "jitter" | "dino" | "deit") => OutputSpec {
                ops: recipe_ops(recipe, train.ops),
                ..train
            },
            "eval" => OutputSpec {
                crop: Crop::Center {
                    resize: Some((f64::from(self.image_size) * 256.0 / 224.0).round() as u32),
                },
                ..center
            },
            _ => center,
        }
    }

    pub fn source(&self) -> Result<crate::dev::bench::BenchSource, ConfigError> {
        use crate::dev::bench::BenchSource;
        let mut problems = Vec::new();
        if self.synthetic == self.uri.is_some() {
            problems.push("give either a dataset URI or --synthetic".to_string());
        }
        if self.compare_get_delay_ms.is_some() && !self.synthetic {
            problems.push("--compare-get-delay-ms needs --synthetic".into());
        }
        if !problems.is_empty() {
            return Err(ConfigError(problems));
        }
        Ok(match &self.uri {
            Some(uri) => BenchSource::Uri {
                uri: uri.clone(),
                s3: self.s3.config(),
            },
            None => BenchSource::Synthetic {
                data: crate::dev::synthetic::SyntheticSpec {
                    shards: self.shards,
                    samples_per_shard: self.samples_per_shard,
                    ..Default::default()
                },
                get_delay: Duration::from_millis(self.get_delay_ms),
                compare_get_delay: self.compare_get_delay_ms.map(Duration::from_millis),
            },
        })
    }

    pub fn spec(&self) -> crate::dev::bench::EntitlementSpec {
        crate::dev::bench::EntitlementSpec {
            batch_size: self.batch_size,
            output: self.output(),
            decode_threads: self
                .decode_threads
                .unwrap_or_else(engine::default_decode_threads),
            pipeline: PipelineConfig {
                read: self.read.read_config(),
                prefetch_shards: self.prefetch_shards,
                ..PipelineConfig::default()
            },
            max_batches: self.max_batches,
        }
    }
}

#[derive(Args, Debug)]
pub struct ShuffleQualityArgs {
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub classes: u32,
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..))]
    pub samples_per_class: u64,
    /// Shards hold 1-2 classes when this is at most samples_per_class.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u64).range(1..))]
    pub samples_per_shard: u64,
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch_size: u32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(Args, Debug)]
pub struct TierBenchArgs {
    #[arg(long, default_value_t = 64, value_parser = RangedU64ValueParser::<usize>::new().range(1..=10_000))]
    pub samples: usize,
    /// Passes over the samples per timed measurement.
    #[arg(long, default_value_t = 5, value_parser = RangedU64ValueParser::<usize>::new().range(1..=1_000))]
    pub rounds: usize,
}

/// The synthetic photos and the stream shape of the in-process stream benchmarks.
#[derive(Args, Debug)]
pub struct SyntheticStreamArgs {
    #[arg(long, default_value_t = 10, value_parser = RangedU64ValueParser::<usize>::new().range(2..=1_000))]
    pub shards: usize,
    #[arg(long, default_value_t = 192, value_parser = RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    pub samples_per_shard: usize,
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub batch_size: u32,
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub decode_threads: Option<usize>,
}

impl SyntheticStreamArgs {
    pub fn data(&self) -> crate::dev::synthetic::SyntheticSpec {
        crate::dev::synthetic::SyntheticSpec {
            shards: self.shards,
            samples_per_shard: self.samples_per_shard,
            ..Default::default()
        }
    }

    pub fn decode_threads(&self) -> usize {
        self.decode_threads
            .unwrap_or_else(engine::default_decode_threads)
    }
}

#[derive(Args, Debug)]
pub struct MixBenchArgs {
    #[command(flatten)]
    pub stream: SyntheticStreamArgs,
    #[arg(long, default_value_t = 3, value_parser = RangedU64ValueParser::<usize>::new().range(1..=100))]
    pub rounds: usize,
}

#[derive(Args, Debug)]
pub struct ParquetBenchArgs {
    #[command(flatten)]
    pub stream: SyntheticStreamArgs,
    #[arg(long, default_value_t = 3, value_parser = RangedU64ValueParser::<usize>::new().range(1..=100))]
    pub rounds: usize,
    /// Milliseconds before every GET's response (S3's time to first byte).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub get_delay_ms: u64,
    /// Files of the planning run (0: none).
    #[arg(long, default_value_t = 10_000, value_parser = RangedU64ValueParser::<usize>::new().range(0..=1_000_000))]
    pub plan_files: usize,
}

#[derive(Args, Debug)]
pub struct DeliveryBenchArgs {
    #[command(flatten)]
    pub stream: SyntheticStreamArgs,
    #[arg(long, default_value_t = 3, value_parser = RangedU64ValueParser::<usize>::new().range(1..=100))]
    pub rounds: usize,
}

#[derive(Args, Debug)]
pub struct PoolBenchArgs {
    #[command(flatten)]
    pub stream: SyntheticStreamArgs,
    #[arg(long, default_value_t = 3, value_parser = RangedU64ValueParser::<usize>::new().range(1..=100))]
    pub rounds: usize,
    #[command(flatten)]
    pub pool: PoolArgs,
}

#[derive(Args, Debug)]
pub struct TierStreamBenchArgs {
    #[command(flatten)]
    pub stream: SyntheticStreamArgs,
    /// The stored sources' shorter side.
    #[arg(long, default_value_t = 320, value_parser = clap::value_parser!(u32).range(64..=4096))]
    pub shorter_side: u32,
}

#[derive(Args, Debug)]
pub struct CacheScaleArgs {
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub entries: u64,
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    pub object_bytes: u64,
    /// Parent of the cache directory (made, and removed after).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    pub dir: PathBuf,
    #[arg(long, default_value_t = 4)]
    pub readers: usize,
    /// Seconds each measured phase runs.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
}

#[derive(Args, Debug)]
pub struct DevS3Args {
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Delay before every GET response, like S3's time to first byte.
    #[arg(long, default_value_t = 0)]
    pub get_delay_ms: u64,
    /// Fail every Nth GET with 503 SlowDown, as a throttled bucket does (0: never).
    #[arg(long, default_value_t = 0)]
    pub slow_down_every: u64,
    /// Send each GET's body at this many MiB/s at most, as one connection
    /// to S3 does (tens of MB/s); 0: as fast as loopback goes.
    #[arg(long, default_value_t = 0)]
    pub get_mib_per_second: u64,
    /// Fail this percentage of all requests (500 or 503 SlowDown), for soak tests.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=100))]
    pub fail_percent: u64,
    /// Publish the demo's synthetic photo dataset (this many shards) before
    /// listening, so benchmarks elsewhere read the same data as `shardfeed bench --synthetic`.
    #[arg(long, default_value_t = 0)]
    pub synthetic_shards: usize,
    #[arg(long, default_value_t = crate::dev::synthetic::SyntheticSpec::default().samples_per_shard)]
    pub samples_per_shard: usize,
    /// Also publish the same photos as loose objects, one per image, in
    /// class folders (`s3://demo/loose/`).
    #[arg(long, requires = "synthetic_shards")]
    pub synthetic_loose: bool,
    /// Answer ListObjectsV2 without ETags, as some S3-compatible servers do
    /// (HEAD and GET still carry them).
    #[arg(long)]
    pub list_without_etags: bool,
}

/// The ops after the flip of the benchmark's named recipes (`--augment`).
fn recipe_ops(recipe: &str, flip: crate::decode::Ops) -> crate::decode::Ops {
    use crate::decode::{
        AutoAugment, ColorJitter, EraseValue, Grayscale, Interpolation, Kernel, Policy,
        RandomErasing,
    };
    const MEAN: [f64; 3] = [0.485, 0.456, 0.406];
    const STD: [f64; 3] = [0.229, 0.224, 0.225];
    let policy = |policy, interpolation| AutoAugment {
        policy,
        interpolation: Some(interpolation),
        ..AutoAugment::default()
    };
    match recipe {
        "trivial" => flip
            .with(policy(
                Policy::TrivialAugmentWide { bins: 31 },
                Interpolation::Bilinear,
            ))
            .with(RandomErasing::new(0.1, EraseValue::Mean, MEAN, STD)),
        "rand" => flip.with(policy(
            Policy::RandAugment {
                num_ops: 2,
                magnitude: 9,
                bins: 31,
            },
            Interpolation::Nearest,
        )),
        "auto" => flip
            .with(policy(Policy::AutoAugmentImageNet, Interpolation::Nearest))
            .with(RandomErasing::new(0.2, EraseValue::Mean, MEAN, STD)),
        // DINOv2's first global crop's ops (its crop: --interpolation
        // bicubic): RandomApply(ColorJitter(0.4, 0.4, 0.2, 0.1), 0.8),
        // RandomGrayscale(0.2), GaussianBlur(9, 0.1-2.0) always.
        "dino" => flip
            .with(ColorJitter::symmetric(0.4, 0.4, 0.2, 0.1).with_p(0.8))
            .with(Grayscale.coin(0.2))
            .with(crate::decode::GaussianBlur {
                kernel: (9, 9),
                sigma: (0.1, 2.0),
                p: 1.0,
            }),
        // DeiT's, as timm's create_transform builds it for 224²: the
        // policy's fill is the ImageNet mean in levels, the erasing timm's
        // (area to 1/3, aspect 0.3 to 1/0.3, per-value normal noise).
        "deit" => flip
            .with(crate::decode::TimmRandAugment {
                fill: crate::decode::Fill::colour([124, 116, 104]),
                ..crate::decode::TimmRandAugment::new(9.0, 2, 0.5, true)
            })
            .with(RandomErasing {
                scale: (0.02, 1.0 / 3.0),
                ratio: (0.3, 1.0 / 0.3),
                ..RandomErasing::new(0.25, EraseValue::Random, MEAN, STD)
            }),
        _ => flip
            .with(ColorJitter::symmetric(0.4, 0.4, 0.4, 0.0))
            .with(Grayscale.coin(0.2)),
    }
}
