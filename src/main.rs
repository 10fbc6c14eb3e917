//! The `shardfeed` binary: parses the command line, starts logging and the
//! async runtime, and hands the command to the library (`shardfeed::cli`).

use anyhow::Context;
use clap::Parser;

use shardfeed::cli::{Cli, LogFormat};

fn init_logging(format: LogFormat, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SHARDFEED_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(cli.log_format, cli.command.default_log_level());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("shardfeed-io")
        .build()
        .context("starting the async runtime")?;
    runtime
        .block_on(shardfeed::cli::run(cli.command))
        .map_err(|error| anyhow::anyhow!(error))
}
