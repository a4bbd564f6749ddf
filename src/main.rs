//! Entry point: flags → `Config`, logging, `run`, exit code.

use std::io::IsTerminal;
use std::process::ExitCode;

use csi_attacher::config::Config;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let config = match Config::try_parse_go(std::env::args_os()) {
        Ok(config) => config,
        // Help exits 0, usage errors exit 2, as Go's flag package does.
        Err(err) => {
            let _ = err.print();
            return ExitCode::from(if err.use_stderr() { 2 } else { 0 });
        }
    };
    init_logging(&config);
    if config.version {
        let program = std::env::args()
            .next()
            .unwrap_or_else(|| "csi-attacher".into());
        println!("{program} {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    tracing::info!(version = env!("CARGO_PKG_VERSION"), "Version");
    let gates = match config.validate() {
        Ok(gates) => gates,
        Err(err) => {
            tracing::error!(error = %err, "invalid flags");
            return ExitCode::FAILURE;
        }
    };

    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(err) => {
            tracing::error!(error = %err, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(csi_attacher::run(config, gates)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = %err, "exiting");
            ExitCode::FAILURE
        }
    }
}

/// `--v` maps to levels: 0-1 info, 2-4 debug, 5+ trace; `RUST_LOG` overrides.
fn init_logging(config: &Config) {
    let level = match config.v {
        0 | 1 => "info",
        2..=4 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!(
            "{level},h2=info,hyper=info,hyper_util=info,tower=info,rustls=info"
        ))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if config.logging_format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}
