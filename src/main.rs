//! Entry point: flags → `Config`, logging, `run`, exit code.

use std::process::ExitCode;

use csi_attacher::config::{Config, ParseError};
use csi_attacher::metrics::build;

/// mimalloc: the attacher's work is many small, short-lived allocations (watch
/// events, requests); glibc's malloc spent a sixth of the CPU on them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // A removed subcommand must not start the sidecar (it would ignore the word).
    if args.get(1).is_some_and(|a| a == "shadow") {
        eprintln!("csi-attacher shadow was removed (CHANGELOG.md); `csi-attacher check` is the pre-flight");
        return ExitCode::from(2);
    }
    // `csi-attacher check [flags]`: the read-only report for operators.
    let check = args.get(1).is_some_and(|a| a == "check");
    if check {
        args.remove(1);
    }
    let config = match Config::try_parse_go(args) {
        Ok(config) => config,
        // Go's flag package: help exits 0, a usage error prints why and the usage, exit 2.
        Err(err) => {
            match &err {
                ParseError::Help { usage } => print!("{usage}"),
                ParseError::Usage { message, usage } => eprint!("{message}\n{usage}"),
            }
            return ExitCode::from(err.exit_code());
        }
    };
    csi_attacher::logging::init(&config);
    // Upstream's order: logging options, feature gates, --version, the other checks.
    if let Err(err) = config.validate_logging() {
        tracing::error!(error = %err, "invalid flags");
        return ExitCode::FAILURE;
    }
    let gates = config.feature_gates().inspect_err(|err| {
        tracing::error!(error = %err, feature_gates = ?config.feature_gates, "invalid flags");
    });
    let Ok(gates) = gates else {
        return ExitCode::FAILURE;
    };
    config.log_feature_gates();
    if config.version {
        print_version();
        return ExitCode::SUCCESS;
    }
    tracing::info!(
        version = build::VERSION,
        commit = build::GIT_COMMIT,
        build_date = build::BUILD_DATE,
        "Version"
    );
    if let Err(err) = config.validate() {
        tracing::error!(error = %err, "invalid flags");
        // Upstream panics on leader-election timing client-go refuses: exit 2.
        let panics = matches!(err, csi_attacher::config::Error::LeaderElection(_));
        return ExitCode::from(if panics { 2 } else { 1 });
    }

    // One thread: the attacher waits on the API server and the driver; a
    // single-threaded runtime spends less CPU on wake-ups and hand-offs than
    // a work-stealing pool (tools/bench, P2).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let Ok(runtime) =
        runtime.inspect_err(|err| tracing::error!(error = %err, "cannot start the async runtime"))
    else {
        return ExitCode::FAILURE;
    };
    if check {
        return run_check(&runtime, &config);
    }
    match runtime.block_on(csi_attacher::run::run(config, gates)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = %err, "exiting");
            ExitCode::FAILURE
        }
    }
}

/// Upstream's one line `<argv0> <version>`, then the build's identity.
fn print_version() {
    let program = std::env::args()
        .next()
        .unwrap_or_else(|| "csi-attacher".into());
    println!(
        "{program} {} (commit {}, built {}, {})",
        build::VERSION,
        build::GIT_COMMIT,
        build::BUILD_DATE,
        build::RUSTC_VERSION
    );
}

/// Prints the report; exit 0 when clean, 1 when anything needs attention or it failed.
fn run_check(runtime: &tokio::runtime::Runtime, config: &Config) -> ExitCode {
    let report = match runtime.block_on(csi_attacher::check::report(config)) {
        Ok(report) => report,
        Err(err) => {
            eprintln!("check failed: {err}");
            return ExitCode::FAILURE;
        }
    };
    let text = match config.output.as_str() {
        "json" => serde_json::to_string_pretty(&report).map(|json| json + "\n"),
        _ => Ok(report.to_text()),
    };
    match &text {
        Ok(text) => print!("{text}"),
        Err(err) => eprintln!("cannot encode the report: {err}"),
    }
    ExitCode::from(u8::from(!report.is_clean() || text.is_err()))
}
