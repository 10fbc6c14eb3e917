//! The command line: clap definitions, grouped under help headings, and
//! their conversion into the library's plain config structs. Every flag is
//! also a `SHARDFEED_*` environment variable. clap checks ranges; what needs
//! more than one flag is checked in `*_config`, which reports every problem
//! at once. [`run`] carries out a parsed command.

mod args;
#[cfg(feature = "dev")]
mod dev_args;
#[cfg(feature = "dev")]
mod dev_run;
mod pool_args;
mod progress;
mod run;
mod settings;
mod signals;
mod store_args;
mod values;

pub use args::{
    Cli, Command, HealthArgs, IndexArgs, LogFormat, PackArgs, PrepareCacheDirArgs, ServeArgs,
    ServeConfig, StreamArgs, WarmArgs,
};
#[cfg(feature = "dev")]
pub use dev_args::*;
pub use pool_args::{PoolArgs, PoolWorkerArgs};
pub use run::run;
pub use store_args::{BadShardArg, CacheArgs, PolicyArg, ReadArgs, S3Args};
pub use values::{parse_size, CliError, ConfigError};
