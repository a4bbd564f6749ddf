//! Command-line flags, parsed the way upstream's Go binary parses them.
//!
//! Upstream registers every flag on Go's `flag.CommandLine`, and deployments
//! rely on its syntax. [`Config::try_parse_go`] walks the arguments with Go's
//! rules and hands clap one `--name=value` per flag; the values are read with
//! ports of Go's own parsers (`config/go.rs`).
//!
//! # Go's rules, kept here
//! - `-flag` and `--flag`; `--flag=value` and `--flag value`, except for bools,
//!   which take `--flag` or `--flag=value` (`--flag false` ends the flags).
//!   Parsing stops at the first non-flag argument or after `--`.
//! - A repeated flag: the last value wins, and every value must still parse.
//!   `--feature-gates`, `--leader-election-labels` and `--vmodule` accumulate
//!   instead, as their Go types do (a later key wins within the merged map).
//! - Values: integers in Go literal syntax (`0x10`, `010`, `0b1`, `0o7`,
//!   `1_000`; `--worker-threads` unsigned, `--v` decimal only), floats
//!   (`1e-3`, `inf`, `nan`), bools (`1`, `t`, `TRUE`, ...), durations (`1m30s`,
//!   `-1s`), quantities for the logging buffer sizes.
//! - An unknown flag, a bad value or a missing value is a usage error
//!   ([`ParseError::Usage`], exit 2) worded as Go words it; `-h`, `-help` and
//!   `--help` print the usage (exit 0).
//!
//! # After parsing (exit 1), in upstream's order
//! 1. [`Config::validate_logging`]: component-base's logging validation.
//! 2. [`Config::feature_gates`]: the merged `--feature-gates` map (`config/gates.rs`).
//! 3. `--version` prints and exits 0 (main).
//! 4. [`Config::validate`]: upstream's remaining checks, and ours for values
//!    Go accepts but cannot run with:
//!
//! | Value | Upstream | Here |
//! |---|---|---|
//! | negative `--timeout` | every probe times out at once: never starts | exit 1 |
//! | negative `--resync`, `--reconcile-sync` | the resync / reconcile timer fires in a busy loop | exit 1 |
//! | negative `--retry-interval-start`/`-max` | failed items retry at once, no backoff | exit 1 |
//! | negative or inconsistent `--leader-election-*-duration/-deadline/-period` (with `--leader-election`) | client-go's `RunOrDie` panics after connecting (exit 2) | exit 2 with client-go's message (negative: exit 1) |
//! | negative `--kube-api-burst` with a rate limit | every API request fails | exit 1 |
//! | a label client-go would send but the API server refuses (with `--leader-election`) | never becomes leader | exit 1 |
//!
//! Without `--leader-election` the leader-election values are unused and, as
//! upstream, not checked.
//!
//! # Values upstream accepts but cannot run with sensibly (raised, with a warning)
//! [`Config::try_parse_go`] raises them and [`Config::validate`] logs each change:
//!
//! | Value | Upstream | Here |
//! |---|---|---|
//! | `--timeout` below 100 ms (`0`) | every CSI call fails before it is sent; never starts | 100 ms |
//! | `--retry-interval-start`/`-max` below 100 ms (`0`) | failed VAs retry in a busy loop | 100 ms |
//! | `--reconcile-sync` below 100 ms (`0`) | ListVolumes passes back to back | 100 ms |
//! | `--resync` between 0 and 1 s | client-go raises it to 1 s, with a warning | 1 s (0 still disables) |
//! | `--worker-threads` above 10,000 | one goroutine per worker: memory runs out | 10,000 |
//!
//! `--retry-interval-max` below `--retry-interval-start` is kept, as upstream
//! (every retry waits `--retry-interval-max`), with a warning. Huge durations
//! (up to Go's 292 years) are kept: nothing overflows with them. Zero
//! `--worker-threads` stays an error, as upstream. `docs/bounds.md` has the
//! operator's view.

mod gates;
pub mod go;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Arg, ArgAction, ArgMatches, CommandFactory, FromArgMatches, Parser};

pub use gates::FeatureGates;

/// Where the kubelet reads a container's termination message by default.
pub const DEFAULT_TERMINATION_LOG: &str = "/dev/termination-log";

/// The sidecar's configuration.
///
/// Build it with [`Config::try_parse_go`]: `--feature-gates`,
/// `--leader-election-labels` and `--vmodule` are added and merged there
/// (clap's derive cannot merge repeated values into one map).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "csi-attacher",
    version,
    about = "CSI external-attacher: makes VolumeAttachments true with ControllerPublish/ControllerUnpublish",
    disable_version_flag = true,
    args_override_self = true
)]
pub struct Config {
    /// Address of the CSI driver socket (absolute path, or unix:// and a path).
    #[arg(long, default_value = "/run/csi/socket")]
    pub csi_address: String,

    /// Timeout of waiting for a CSI call (Probe, ControllerPublish/Unpublish, ListVolumes).
    #[arg(long, default_value = "15s", value_parser = duration_flag)]
    pub timeout: Duration,

    /// Absolute path to the kubeconfig file; empty: in-cluster configuration.
    #[arg(long, default_value = "")]
    pub kubeconfig: String,

    /// Resync period for the VolumeAttachment, PersistentVolume and CSINode caches.
    #[arg(long, default_value = "10m", value_parser = duration_flag)]
    pub resync: Duration,

    /// Initial retry interval of a failed attach or detach; doubles per failure.
    #[arg(long, default_value = "1s", value_parser = duration_flag)]
    pub retry_interval_start: Duration,

    /// Maximum retry interval of a failed attach or detach.
    #[arg(long, default_value = "5m", value_parser = duration_flag)]
    pub retry_interval_max: Duration,

    /// Number of attacher worker threads (per lane).
    #[arg(long, default_value = "10", value_parser = uint_flag)]
    pub worker_threads: u64,

    /// fsType of mount volumes whose PV does not set one.
    #[arg(long, default_value = "")]
    pub default_fstype: String,

    /// QPS to use while communicating with the Kubernetes API server (0: 5; < 0: no limit).
    #[arg(long, default_value = "5", value_parser = float_flag)]
    pub kube_api_qps: f64,

    /// Burst to use while communicating with the Kubernetes API server (0: 10).
    #[arg(long, default_value = "10", value_parser = int_flag)]
    pub kube_api_burst: i64,

    /// Period of the ListVolumes-based VolumeAttachment reconciler.
    #[arg(long, default_value = "1m", value_parser = duration_flag)]
    pub reconcile_sync: Duration,

    /// `max_entries` of every ListVolumes request (0: no limit). Go int, cut to 32 bits as upstream does.
    #[arg(long, default_value = "0", value_parser = int32_flag)]
    pub max_entries: i32,

    /// Truncate logged gRPC responses to this many characters (<= 0: no limit).
    #[arg(long, default_value = "-1", value_parser = int_flag)]
    pub max_grpc_log_length: i64,

    /// Feature gates (`--feature-gates`, merged over every occurrence); see [`Config::feature_gates`].
    #[arg(skip)]
    pub feature_gates: BTreeMap<String, bool>,

    /// Enable leader election (a Lease) so that only one replica acts.
    #[arg(long, require_equals = true, default_value = "false", value_parser = bool_flag,
          action = ArgAction::Set)]
    pub leader_election: bool,

    /// Namespace of the leader-election Lease (else $POD_NAMESPACE, the service account's, or default).
    #[arg(long, default_value = "")]
    pub leader_election_namespace: String,

    /// How long a lease is valid after its last renewal.
    #[arg(long, default_value = "15s", value_parser = duration_flag)]
    pub leader_election_lease_duration: Duration,

    /// How long the leader keeps trying to renew before it gives up.
    #[arg(long, default_value = "10s", value_parser = duration_flag)]
    pub leader_election_renew_deadline: Duration,

    /// Pause between leader-election attempts.
    #[arg(long, default_value = "5s", value_parser = duration_flag)]
    pub leader_election_retry_period: Duration,

    /// Labels put on the Lease while leading (`--leader-election-labels`, merged over every occurrence).
    #[arg(skip)]
    pub leader_election_labels: BTreeMap<String, String>,

    /// Leader-election identity (ours; default: the sanitised hostname).
    #[arg(long, default_value = "")]
    pub leader_election_identity: String,

    /// host:port of the HTTP server for metrics and health checks (empty: none).
    #[arg(long, default_value = "")]
    pub http_endpoint: String,

    /// Deprecated: like --http-endpoint but without the leader-election health check.
    #[arg(long, default_value = "")]
    pub metrics_address: String,

    /// Path of the Prometheus metrics.
    #[arg(long, default_value = "/metrics")]
    pub metrics_path: String,

    /// Go only (GOMAXPROCS from the CPU quota); accepted and ignored. `--automaxprocs=` means true.
    #[arg(long, require_equals = true, default_value = "false", value_parser = automaxprocs_flag,
          action = ArgAction::Set)]
    pub automaxprocs: bool,

    /// Go only (per-file verbosity, `pattern=N,...`, merged over every occurrence); accepted and ignored.
    #[arg(skip)]
    pub vmodule: String,

    /// Go only (klog flush period; must be > 0); accepted and ignored.
    #[arg(long, default_value = "5s", value_parser = duration_flag)]
    pub log_flush_frequency: Duration,

    /// Alpha in upstream and disabled there: enabling it is an error.
    #[arg(long, require_equals = true, default_value = "false", value_parser = bool_flag,
          action = ArgAction::Set)]
    pub log_text_split_stream: bool,

    /// Alpha in upstream and disabled there: a non-zero size (a Kubernetes quantity) is an error.
    #[arg(long, default_value = "0", value_parser = quantity_flag)]
    pub log_text_info_buffer_size: String,

    /// Alpha in upstream and disabled there: enabling it is an error.
    #[arg(long, require_equals = true, default_value = "false", value_parser = bool_flag,
          action = ArgAction::Set)]
    pub log_json_split_stream: bool,

    /// Alpha in upstream and disabled there: a non-zero size (a Kubernetes quantity) is an error.
    #[arg(long, default_value = "0", value_parser = quantity_flag)]
    pub log_json_info_buffer_size: String,

    /// Number for the log level verbosity (0-1 info, 2-4 debug, 5+ trace; at most 2^31-1).
    #[arg(long, default_value = "0", value_parser = level_flag)]
    pub v: u32,

    /// Log format: text or json (anything else is refused after parsing, as upstream).
    #[arg(long, default_value = "text")]
    pub logging_format: String,

    /// `check` only: report format, text or json.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,

    /// File that receives the reason of a fatal exit (not in upstream; its path is fixed there).
    #[arg(long, default_value = DEFAULT_TERMINATION_LOG)]
    pub termination_log_path: PathBuf,

    /// Print the version and exit.
    #[arg(long, require_equals = true, default_value = "false", value_parser = bool_flag,
          action = ArgAction::Set)]
    pub version: bool,

    /// Duration flags given a negative value, with the value as given: Go parses them, and
    /// [`Config::validate`] / [`Config::validate_logging`] refuse them (the field holds zero).
    #[arg(skip)]
    pub negative_durations: Vec<(&'static str, String)>,

    /// Values raised to a sane bound by [`Config::try_parse_go`], logged by [`Config::validate`].
    #[arg(skip)]
    pub adjusted: Vec<Adjustment>,

    /// Arguments after the first non-flag argument (ignored, as Go's flag package does).
    #[arg(hide = true, trailing_var_arg = true)]
    pub rest: Vec<String>,
}

/// Why the command line was not accepted (Go's `flag` package exits at this point).
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// `-h`, `-help` or `--help`: print `usage` and exit 0.
    #[error("help requested")]
    Help {
        /// The usage text.
        usage: String,
    },
    /// A usage error: print the message and the usage, exit 2.
    #[error("{message}")]
    Usage {
        /// Go's wording, e.g. `flag provided but not defined: -foo`.
        message: String,
        /// The usage text.
        usage: String,
    },
}

impl ParseError {
    /// Go's exit code: 0 for help, 2 for a usage error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Help { .. } => 0,
            Self::Usage { .. } => 2,
        }
    }
}

/// A flag combination refused after parsing (exit 1, not 2).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `--worker-threads=0`.
    #[error("Option -worker-threads must be greater than zero")]
    NoWorkers,
    /// Both HTTP address flags.
    #[error("only one of `--metrics-address` and `--http-endpoint` can be set")]
    TwoHttpAddresses,
    /// A metrics path no request can have (upstream's HTTP mux panics on it).
    #[error("--metrics-path must start with \"/\", got {0:?}")]
    MetricsPath(String),
    /// An unknown feature gate, or a locked one set against its lock.
    #[error("failed to store flag gates: {0}")]
    FeatureGates(String),
    /// What component-base's logging validation refuses (flush period, format, alpha options).
    #[error("LoggingConfiguration is invalid: {0}")]
    Logging(String),
    /// A negative duration where upstream would break (see the module docs).
    #[error("invalid --{flag}={value}: the duration must not be negative")]
    NegativeDuration {
        /// The flag's name.
        flag: &'static str,
        /// The value as given.
        value: String,
    },
    /// Leader-election timing client-go refuses (upstream panics on it).
    #[error("invalid leader election settings: {0}")]
    LeaderElection(&'static str),
    /// A negative burst with a rate limit: client-go fails every request.
    #[error(
        "invalid --kube-api-burst={0}: must not be negative while --kube-api-qps limits the rate"
    )]
    NegativeBurst(i64),
    /// A Lease label the API server would refuse.
    #[error("invalid --leader-election-labels entry {key:?}:{value:?}: {reason}")]
    LeaseLabel {
        /// The label key.
        key: String,
        /// The label value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// A flag value replaced by a sane bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adjustment {
    /// The flag's name.
    pub flag: &'static str,
    /// The value as parsed (Go's spelling for durations).
    pub given: String,
    /// The value used.
    pub used: String,
    /// Why.
    pub reason: &'static str,
}

/// The smallest `--timeout`, retry interval and `--reconcile-sync` used.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// The smallest non-zero `--resync` (client-go's `minimumResyncPeriod`).
pub const MIN_RESYNC: Duration = Duration::from_secs(1);
/// The most `--worker-threads` used.
pub const MAX_WORKERS: u64 = 10_000;

/// Duration flags: (clap id, flag name).
const DURATIONS: &[(&str, &str)] = &[
    ("timeout", "timeout"),
    ("resync", "resync"),
    ("retry_interval_start", "retry-interval-start"),
    ("retry_interval_max", "retry-interval-max"),
    ("reconcile_sync", "reconcile-sync"),
    (
        "leader_election_lease_duration",
        "leader-election-lease-duration",
    ),
    (
        "leader_election_renew_deadline",
        "leader-election-renew-deadline",
    ),
    (
        "leader_election_retry_period",
        "leader-election-retry-period",
    ),
    ("log_flush_frequency", "log-flush-frequency"),
];

/// client-go's `leaderelection.JitterFactor`.
const LEADER_ELECTION_JITTER: f64 = 1.2;

impl Config {
    /// Parses Go-style arguments (`args[0]` is the program name).
    pub fn try_parse_go<I, T>(args: I) -> Result<Self, ParseError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        let mut command = Self::command_go();
        let usage = command.render_help().to_string();
        let (args, stop) = normalize_args(&command, args.into_iter().map(Into::into).collect());
        // Go reports the first problem in argument order: clap sees the arguments before
        // the one that stopped the walk, so an earlier bad value still wins.
        let matches = command
            .try_get_matches_from_mut(args)
            .map_err(|err| usage_error(&command, &err, &usage))?;
        if let Some(stop) = stop {
            return Err(match stop {
                Stop::Help => ParseError::Help { usage },
                Stop::Usage(message) => ParseError::Usage { message, usage },
            });
        }
        let mut config = Self::from_arg_matches(&matches).map_err(|err| ParseError::Usage {
            message: err.to_string(),
            usage: usage.clone(),
        })?;
        config.feature_gates = merged::<BTreeMap<String, bool>>(&matches, "feature_gates")
            .flatten()
            .collect();
        config.leader_election_labels =
            merged::<BTreeMap<String, String>>(&matches, "leader_election_labels")
                .flatten()
                .collect();
        config.vmodule = merged::<String>(&matches, "vmodule")
            .filter(|items| !items.is_empty())
            .collect::<Vec<_>>()
            .join(",");
        for (id, flag) in DURATIONS {
            let last = matches
                .get_raw(id)
                .and_then(|mut values| values.next_back());
            if let Some(raw) = last.and_then(|raw| raw.to_str()) {
                if go::parse_duration(raw).is_ok_and(|nanos| nanos < 0) {
                    config.negative_durations.push((flag, raw.to_string()));
                }
            }
        }
        config.raise_absurd_values();
        Ok(config)
    }

    /// Replaces values upstream accepts but cannot run with (see the module docs).
    fn raise_absurd_values(&mut self) {
        let negative: Vec<&str> = self.negative_durations.iter().map(|(f, _)| *f).collect();
        let mut adjusted = Vec::new();
        let mut floor = |flag: &'static str, value: &mut Duration, min: Duration, reason| {
            // A negative value is refused by `validate`; say that, not this.
            if *value < min && !negative.contains(&flag) {
                adjusted.push(Adjustment {
                    flag,
                    given: format!("{value:?}"),
                    used: format!("{min:?}"),
                    reason,
                });
                *value = min;
            }
        };
        floor(
            "timeout",
            &mut self.timeout,
            MIN_INTERVAL,
            "a CSI call cannot answer within a shorter deadline",
        );
        floor(
            "retry-interval-start",
            &mut self.retry_interval_start,
            MIN_INTERVAL,
            "failed operations would retry in a busy loop",
        );
        floor(
            "retry-interval-max",
            &mut self.retry_interval_max,
            MIN_INTERVAL,
            "failed operations would retry in a busy loop",
        );
        floor(
            "reconcile-sync",
            &mut self.reconcile_sync,
            MIN_INTERVAL,
            "ListVolumes passes would run back to back",
        );
        if !self.resync.is_zero() {
            floor(
                "resync",
                &mut self.resync,
                MIN_RESYNC,
                "client-go's minimum resync period",
            );
        }
        if self.worker_threads > MAX_WORKERS {
            adjusted.push(Adjustment {
                flag: "worker-threads",
                given: self.worker_threads.to_string(),
                used: MAX_WORKERS.to_string(),
                reason:
                    "more workers than the API rate limit or any driver can use, at a memory cost",
            });
            self.worker_threads = MAX_WORKERS;
        }
        self.adjusted = adjusted;
    }

    /// The derived command plus the flags whose occurrences merge.
    fn command_go() -> clap::Command {
        let merging = |id: &'static str, long: &'static str, value: &'static str| {
            Arg::new(id)
                .long(long)
                .value_name(value)
                .action(ArgAction::Append)
        };
        let mut command = Self::command()
            .arg(
                merging("feature_gates", "feature-gates", "KEY=BOOL,...")
                    .help(
                        "Feature gates (every gate upstream accepts; \
                         ReleaseLeaderElectionOnExit and MutableCSINodeAllocatableCount act here)",
                    )
                    .value_parser(gates::parse_pairs),
            )
            .arg(
                merging(
                    "leader_election_labels",
                    "leader-election-labels",
                    "KEY:VALUE,...",
                )
                .help("Labels put on the Lease while leading")
                .value_parser(labels_flag),
            )
            .arg(
                merging("vmodule", "vmodule", "PATTERN=N,...")
                    .help("Go only (per-file verbosity); accepted and ignored")
                    .value_parser(vmodule_flag),
            );
        command.build(); // adds the generated --help so normalize_args can see it
        command
    }

    /// component-base's logging validation, which upstream runs first (exit 1).
    pub fn validate_logging(&self) -> Result<(), Error> {
        let mut errors = Vec::new();
        let negative_flush = self
            .negative_durations
            .iter()
            .find(|(flag, _)| *flag == "log-flush-frequency");
        if let Some((_, value)) = negative_flush {
            errors.push(format!(
                "flushFrequency: Invalid value: {}: Must be greater than zero",
                go::quote(value)
            ));
        } else if self.log_flush_frequency.is_zero() {
            errors.push("flushFrequency: Invalid value: \"0s\": Must be greater than zero".into());
        }
        let format = self.logging_format.as_str();
        if !matches!(format, "text" | "json") {
            errors.push(format!(
                "format: Invalid value: {}: Unsupported log format",
                go::quote(format)
            ));
        }
        if !self.vmodule.is_empty() && !format.is_empty() && format != "text" {
            errors.push("vmodule: Forbidden: Only supported for text log format".into());
        }
        let alpha = "Forbidden: Feature LoggingAlphaOptions is disabled";
        let nonzero = |size: &str| !go::quantity_is_zero(size).unwrap_or(true);
        for (on, field) in [
            (self.log_text_split_stream, "options.text.splitStream"),
            (
                nonzero(&self.log_text_info_buffer_size),
                "options.text.infoBufferSize",
            ),
            (self.log_json_split_stream, "options.json.splitStream"),
            (
                nonzero(&self.log_json_info_buffer_size),
                "options.json.infoBufferSize",
            ),
        ] {
            if on {
                errors.push(format!("{field}: {alpha}"));
            }
        }
        match errors.as_slice() {
            [] => Ok(()),
            [one] => Err(Error::Logging(one.clone())),
            many => Err(Error::Logging(format!("[{}]", many.join(", ")))),
        }
    }

    /// The feature gates, as upstream's `SetFromMap` resolves the merged map (exit 1 on error).
    pub fn feature_gates(&self) -> Result<FeatureGates, Error> {
        FeatureGates::resolve(&self.feature_gates).map_err(Error::FeatureGates)
    }

    /// Logs what setting the gates means (upstream's GA/deprecated warnings, and the gates
    /// that have no effect here); once, at start.
    pub fn log_feature_gates(&self) {
        gates::log(&self.feature_gates);
    }

    /// Checks what parsing cannot, after `--version` (exit 1).
    pub fn validate(&self) -> Result<(), Error> {
        if !self.http_endpoint.is_empty() && !self.metrics_address.is_empty() {
            return Err(Error::TwoHttpAddresses);
        }
        let serving = !self.http_endpoint.is_empty() || !self.metrics_address.is_empty();
        if serving && !self.metrics_path.starts_with('/') {
            return Err(Error::MetricsPath(self.metrics_path.clone()));
        }
        if self.worker_threads == 0 {
            return Err(Error::NoWorkers);
        }
        let leader_only = |flag: &str| flag.starts_with("leader-election-");
        for (flag, value) in &self.negative_durations {
            if *flag == "log-flush-frequency" || (leader_only(flag) && !self.leader_election) {
                continue;
            }
            return Err(Error::NegativeDuration {
                flag,
                value: value.clone(),
            });
        }
        // client-go: a zero QPS means 5, so any QPS but a negative one (or NaN) limits.
        if self.kube_api_burst < 0 && self.kube_api_qps >= 0.0 {
            return Err(Error::NegativeBurst(self.kube_api_burst));
        }
        if self.leader_election {
            self.validate_leader_election()?;
        }
        for a in &self.adjusted {
            tracing::warn!(
                flag = a.flag,
                given = %a.given,
                used = %a.used,
                reason = a.reason,
                "Flag value out of range; using the nearest sane value"
            );
        }
        if self.retry_interval_max < self.retry_interval_start {
            tracing::warn!(
                retry_interval_start = ?self.retry_interval_start,
                retry_interval_max = ?self.retry_interval_max,
                "--retry-interval-max is below --retry-interval-start: every retry waits --retry-interval-max (as upstream)"
            );
        }
        Ok(())
    }

    /// client-go's `NewLeaderElector` checks, and the API server's label rules for the Lease.
    fn validate_leader_election(&self) -> Result<(), Error> {
        let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        let lease = nanos(self.leader_election_lease_duration);
        let renew = nanos(self.leader_election_renew_deadline);
        let retry = nanos(self.leader_election_retry_period);
        let problem = if lease <= renew {
            Some("leaseDuration must be greater than renewDeadline")
        } else if renew <= (LEADER_ELECTION_JITTER * retry as f64) as i64 {
            Some("renewDeadline must be greater than retryPeriod*JitterFactor")
        } else if lease < 1 {
            Some("leaseDuration must be greater than zero")
        } else if renew < 1 {
            Some("renewDeadline must be greater than zero")
        } else if retry < 1 {
            Some("retryPeriod must be greater than zero")
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(Error::LeaderElection(problem));
        }
        for (key, value) in &self.leader_election_labels {
            let reason = label_key_problem(key).or_else(|| label_value_problem(value));
            if let Some(reason) = reason {
                return Err(Error::LeaseLabel {
                    key: key.clone(),
                    value: value.clone(),
                    reason,
                });
            }
        }
        Ok(())
    }
}

/// Every value given to the merging flag `id`, in order.
fn merged<'a, T: Clone + Send + Sync + 'static>(
    matches: &'a ArgMatches,
    id: &str,
) -> impl Iterator<Item = T> + 'a {
    matches.get_many::<T>(id).into_iter().flatten().cloned()
}

/// Where Go's flag parsing stopped before the arguments ran out.
enum Stop {
    /// `-h`, `-help`, `--help`, with or without a value.
    Help,
    /// A usage error in Go's words.
    Usage(String),
}

/// Walks Go `flag` syntax, rewriting each flag as `--name=value` for clap.
///
/// Knows from `command` which flags take a value, so `--timeout -1s` keeps
/// `-1s` as the value (Go consumes the next argument whatever it looks like)
/// while a bool flag never consumes the next argument. Stops, as Go does, at
/// an unknown flag, bad syntax, a missing value or help; the arguments before
/// it are returned for clap to check their values.
fn normalize_args(command: &clap::Command, args: Vec<OsString>) -> (Vec<OsString>, Option<Stop>) {
    let mut out = Vec::with_capacity(args.len() + 1);
    let mut iter = args.into_iter();
    if let Some(program) = iter.next() {
        out.push(program);
    }
    while let Some(arg) = iter.next() {
        let text = arg.to_string_lossy().into_owned();
        if text.starts_with('-') && arg.to_str().is_none() {
            // Go keeps the bytes; every flag here holds text, so say so rather than mangle it.
            return (
                out,
                Some(Stop::Usage(format!("invalid UTF-8 in argument {text:?}"))),
            );
        }
        if text.len() < 2 || !text.starts_with('-') {
            // First non-flag argument: Go stops parsing here.
            out.push(OsString::from("--"));
            out.push(arg);
            out.extend(iter);
            break;
        }
        if text == "--" {
            out.push(arg);
            out.extend(iter);
            break;
        }
        let body = text.strip_prefix("--").unwrap_or(&text[1..]);
        if body.is_empty() || body.starts_with(['-', '=']) {
            return (out, Some(Stop::Usage(format!("bad flag syntax: {text}"))));
        }
        let (name, value) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (body, None),
        };
        let flag = command
            .get_arguments()
            .find(|a| a.get_long() == Some(name) && !is_help(a));
        let Some(flag) = flag else {
            let stop = if name == "help" || name == "h" {
                Stop::Help
            } else {
                Stop::Usage(format!("flag provided but not defined: -{name}"))
            };
            return (out, Some(stop));
        };
        let mut rewritten = OsString::from(format!("--{name}="));
        match value {
            Some(value) => rewritten.push(value),
            // Bools are the only flags declared with require_equals (Go: no `--flag value` form).
            None if flag.is_require_equals_set() => rewritten.push("true"),
            None => match iter.next() {
                Some(next) => rewritten.push(next),
                None => {
                    return (
                        out,
                        Some(Stop::Usage(format!("flag needs an argument: -{name}"))),
                    )
                }
            },
        }
        out.push(rewritten);
    }
    (out, None)
}

/// clap's generated `-h`/`--help` (Go's help is matched by name, before any lookup).
fn is_help(arg: &Arg) -> bool {
    matches!(
        arg.get_action(),
        ArgAction::Help | ArgAction::HelpLong | ArgAction::HelpShort
    )
}

/// A clap error in Go's words: `invalid value "x" for flag -name: why`.
fn usage_error(command: &clap::Command, err: &clap::Error, usage: &str) -> ParseError {
    let usage = usage.to_string();
    if err.kind() == ErrorKind::DisplayHelp {
        return ParseError::Help { usage };
    }
    let context = |kind| match err.get(kind) {
        Some(ContextValue::String(text)) => Some(text.clone()),
        _ => None,
    };
    let name = context(ContextKind::InvalidArg).map(|arg| {
        arg.trim_start_matches('-')
            .split(|c: char| !(c.is_alphanumeric() || c == '-'))
            .next()
            .unwrap_or_default()
            .to_string()
    });
    let message = match (err.kind(), name, context(ContextKind::InvalidValue)) {
        (ErrorKind::ValueValidation | ErrorKind::InvalidValue, Some(name), Some(value)) => {
            let why = std::error::Error::source(err)
                .map(ToString::to_string)
                .unwrap_or_else(|| "parse error".to_string());
            let is_bool = command
                .get_arguments()
                .any(|a| a.get_long() == Some(name.as_str()) && a.is_require_equals_set());
            if is_bool {
                format!(
                    "invalid boolean value {} for -{name}: {why}",
                    go::quote(&value)
                )
            } else {
                format!(
                    "invalid value {} for flag -{name}: {why}",
                    go::quote(&value)
                )
            }
        }
        _ => err.to_string().trim_end().to_string(),
    };
    ParseError::Usage { message, usage }
}

/// Duration flags: Go's `time.ParseDuration`. A negative value parses (as Go) and is kept
/// as zero here; [`Config::try_parse_go`] records it for validation.
fn duration_flag(s: &str) -> Result<Duration, String> {
    go::parse_duration(s)
        .map(|nanos| Duration::from_nanos(u64::try_from(nanos).unwrap_or(0)))
        .map_err(|_| "parse error".to_string())
}

/// `flag.Uint`.
fn uint_flag(s: &str) -> Result<u64, String> {
    go::parse_uint(s).map_err(|e| e.to_string())
}

/// `flag.Int`.
fn int_flag(s: &str) -> Result<i64, String> {
    go::parse_int(s).map_err(|e| e.to_string())
}

/// `flag.Int`, then Go's `int32(n)` (upstream's ListVolumes lister keeps the low 32 bits).
fn int32_flag(s: &str) -> Result<i32, String> {
    int_flag(s).map(|n| n as i32)
}

/// `flag.Float64`.
fn float_flag(s: &str) -> Result<f64, String> {
    go::parse_float(s).map_err(|e| e.to_string())
}

/// `flag.Bool`.
fn bool_flag(s: &str) -> Result<bool, String> {
    go::parse_bool(s).ok_or_else(|| "parse error".to_string())
}

/// csi-lib-utils' `--automaxprocs` (`flag.BoolFunc`): an empty value also means true.
fn automaxprocs_flag(s: &str) -> Result<bool, String> {
    if s.is_empty() {
        return Ok(true);
    }
    go::parse_bool(s).ok_or_else(|| {
        format!(
            "strconv.ParseBool: parsing {}: invalid syntax",
            go::quote(s)
        )
    })
}

/// klog's `--v`.
fn level_flag(s: &str) -> Result<u32, String> {
    go::parse_level(s)
}

/// Logging buffer sizes: Kubernetes quantities, kept as given.
fn quantity_flag(s: &str) -> Result<String, String> {
    go::quantity_is_zero(s)
        .map(|_| s.to_string())
        .map_err(str::to_string)
}

/// One `--vmodule` value, as component-base reads it: `pattern=N` items, empty items skipped.
/// Returns the items, comma-joined.
fn vmodule_flag(value: &str) -> Result<String, String> {
    let mut items = Vec::new();
    for item in value.split(',').filter(|item| !item.is_empty()) {
        let parts: Vec<&str> = item.split('=').collect();
        let [pattern, level] = parts.as_slice() else {
            return Err(format!(
                "{} does not have the pattern=N format",
                go::quote(item)
            ));
        };
        if pattern.is_empty() || level.is_empty() {
            return Err(format!(
                "{} does not have the pattern=N format",
                go::quote(item)
            ));
        }
        go::parse_level(level)
            .map_err(|err| format!("parsing verbosity in {}: {err}", go::quote(item)))?;
        items.push(item);
    }
    Ok(items.join(","))
}

/// One `--leader-election-labels` value, as csi-lib-utils reads it: every comma-separated
/// item (empty ones too) must be exactly `key:value`; any key, even empty, parses.
fn labels_flag(value: &str) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    for item in value.split(',') {
        let parts: Vec<&str> = item.split(':').collect();
        let [key, value] = parts.as_slice() else {
            return Err(format!("malformed item in list of labels: {item}"));
        };
        labels.insert((*key).to_string(), (*value).to_string());
    }
    Ok(labels)
}

/// Why the API server would refuse `key` as a label key (apimachinery `IsQualifiedName`).
fn label_key_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split('/').collect::<Vec<_>>().as_slice() {
        [name] => (None, *name),
        [prefix, name] => (Some(*prefix), *name),
        _ => return Some("a label key has at most one '/'".into()),
    };
    if let Some(prefix) = prefix {
        if !is_dns_subdomain(prefix) {
            return Some(
                "the prefix must be a DNS subdomain (lowercase alphanumerics, '-', '.'; at most 253)"
                    .into(),
            );
        }
    }
    if name.is_empty() {
        return Some("the name part must not be empty".into());
    }
    label_value_problem(name)
}

/// Why the API server would refuse `value` as a label value (apimachinery `IsValidLabelValue`).
fn label_value_problem(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let inner_ok = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.');
    let ok = bytes.is_empty()
        || (bytes.len() <= 63
            && bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric()
            && bytes.iter().all(inner_ok));
    (!ok).then(|| {
        "at most 63 characters, alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
            .into()
    })
}

/// apimachinery `IsDNS1123Subdomain`.
fn is_dns_subdomain(text: &str) -> bool {
    text.len() <= 253
        && text.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStringExt;

    fn parse(args: &[&str]) -> Result<Config, ParseError> {
        Config::try_parse_go(std::iter::once("csi-attacher").chain(args.iter().copied()))
    }

    fn ok(args: &[&str]) -> Config {
        parse(args).unwrap_or_else(|err| panic!("{args:?}: {err}"))
    }

    /// Go's usage error for `args`, or a panic if they parse.
    fn usage(args: &[&str]) -> String {
        match parse(args) {
            Err(ParseError::Usage { message, .. }) => message,
            Err(ParseError::Help { .. }) => panic!("{args:?}: help, not a usage error"),
            Ok(_) => panic!("{args:?} parsed"),
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_match_upstream() {
        let c = ok(&[]);
        assert_eq!(c.csi_address, "/run/csi/socket");
        assert_eq!(c.timeout, Duration::from_secs(15));
        assert_eq!(
            c.termination_log_path,
            PathBuf::from(DEFAULT_TERMINATION_LOG)
        );
        assert!(!c.version);
        assert_eq!(c.kubeconfig, "");
        assert_eq!(c.resync, Duration::from_secs(600));
        assert_eq!(c.retry_interval_start, Duration::from_secs(1));
        assert_eq!(c.retry_interval_max, Duration::from_secs(300));
        assert_eq!(c.worker_threads, 10);
        assert_eq!(c.default_fstype, "");
        assert_eq!(c.kube_api_qps, 5.0);
        assert_eq!(c.kube_api_burst, 10);
        assert_eq!(c.reconcile_sync, Duration::from_secs(60));
        assert_eq!(c.max_entries, 0);
        assert_eq!(c.max_grpc_log_length, -1);
        assert!(!c.leader_election);
        assert_eq!(c.leader_election_lease_duration, Duration::from_secs(15));
        assert_eq!(c.leader_election_renew_deadline, Duration::from_secs(10));
        assert_eq!(c.leader_election_retry_period, Duration::from_secs(5));
        assert!(c.leader_election_labels.is_empty());
        assert!(c.feature_gates.is_empty());
        assert_eq!(c.vmodule, "");
        assert_eq!(c.v, 0);
        assert_eq!(c.http_endpoint, "");
        assert_eq!(c.metrics_path, "/metrics");
        assert!(c.negative_durations.is_empty());
        assert!(c.validate_logging().is_ok());
        assert_eq!(c.feature_gates().ok(), Some(FeatureGates::default()));
        assert!(c.validate().is_ok());
    }

    #[test]
    fn single_and_double_dash_with_equals_or_space_all_work() {
        for args in [
            &["-csi-address=/a", "-timeout=2s"][..],
            &["--csi-address", "/a", "--timeout", "2s"],
            &["-csi-address", "/a", "--timeout=2s"],
        ] {
            let c = ok(args);
            assert_eq!(c.csi_address, "/a", "{args:?}");
            assert_eq!(c.timeout, Duration::from_secs(2), "{args:?}");
        }
    }

    #[test]
    fn bools_take_no_separate_value() {
        assert!(ok(&["--version"]).version);
        assert!(ok(&["-version=true"]).version);
        assert!(ok(&["-version=T"]).version);
        assert!(!ok(&["--version=false"]).version);
        // `--version false`: false is the first non-flag argument, parsing stops.
        let c = ok(&["--version", "false", "--timeout=1s"]);
        assert!(c.version);
        assert_eq!(c.timeout, Duration::from_secs(15));
        assert_eq!(
            c.rest,
            vec!["false".to_string(), "--timeout=1s".to_string()]
        );
        assert_eq!(
            usage(&["--version="]),
            "invalid boolean value \"\" for -version: parse error"
        );
        assert_eq!(
            usage(&["--leader-election=yes"]),
            "invalid boolean value \"yes\" for -leader-election: parse error"
        );
    }

    #[test]
    fn automaxprocs_is_a_bool_func() {
        assert!(ok(&["--automaxprocs="]).automaxprocs);
        assert!(!ok(&["--automaxprocs", "--automaxprocs=false"]).automaxprocs);
        assert_eq!(
            usage(&["--automaxprocs=maybe"]),
            "invalid boolean value \"maybe\" for -automaxprocs: strconv.ParseBool: parsing \"maybe\": invalid syntax"
        );
    }

    /// argv → the value Go's flag package leaves in each field: the last occurrence wins.
    #[test]
    fn a_repeated_flag_keeps_its_last_value() {
        let c = ok(&[
            "--v=2",
            "--timeout=60s",
            "--csi-address=/a",
            "--worker-threads=3",
            "--kube-api-qps=20",
            "--kube-api-burst=40",
            "--leader-election",
            "--max-entries=5",
            "--logging-format=json",
            "--log-text-info-buffer-size=1Mi",
            "--v=5",
            "-timeout",
            "90s",
            "--csi-address=/b",
            "--worker-threads=0x10",
            "--kube-api-qps=-1",
            "--kube-api-burst=0",
            "--leader-election=false",
            "--max-entries=-0b11",
            "--logging-format=text",
            "--log-text-info-buffer-size=0",
        ]);
        assert_eq!(c.v, 5);
        assert_eq!(c.timeout, Duration::from_secs(90));
        assert_eq!(c.csi_address, "/b");
        assert_eq!(c.worker_threads, 16);
        assert_eq!(c.kube_api_qps, -1.0);
        assert_eq!(c.kube_api_burst, 0);
        assert!(!c.leader_election);
        assert_eq!(c.max_entries, -3);
        assert_eq!(c.logging_format, "text");
        assert!(c.validate_logging().is_ok());
        // Every occurrence must still parse, as each is Set in turn.
        assert_eq!(
            usage(&["--timeout=x", "--timeout=1s"]),
            "invalid value \"x\" for flag -timeout: parse error"
        );
        // A later negative value counts, an earlier one does not.
        assert!(ok(&["--timeout=-1s", "--timeout=1s"])
            .negative_durations
            .is_empty());
        assert_eq!(
            ok(&["--timeout=1s", "--timeout=-1s"]).negative_durations,
            vec![("timeout", "-1s".to_string())]
        );
    }

    #[test]
    fn feature_gates_merge_across_occurrences() {
        let c = ok(&[
            "--feature-gates=AllAlpha=true,KMSv1=true",
            "--v=2",
            "--feature-gates=KMSv1=false, ReleaseLeaderElectionOnExit = false ,",
            "--feature-gates=",
        ]);
        assert_eq!(
            c.feature_gates,
            [
                ("AllAlpha".to_string(), true),
                ("KMSv1".to_string(), false),
                ("ReleaseLeaderElectionOnExit".to_string(), false)
            ]
            .into_iter()
            .collect()
        );
        let gates = c.feature_gates().expect("valid gates");
        assert!(!gates.release_leader_election_on_exit);
        assert!(gates.mutable_csi_node_allocatable_count);
    }

    #[test]
    fn feature_gate_errors_are_upstreams() {
        // Malformed pairs are flag parse errors (exit 2)...
        assert_eq!(
            usage(&["--feature-gates=Foo"]),
            "invalid value \"Foo\" for flag -feature-gates: malformed pair, expect string=bool"
        );
        assert_eq!(
            usage(&["--feature-gates=AllAlpha=true", "--feature-gates=Foo=maybe"]),
            "invalid value \"Foo=maybe\" for flag -feature-gates: invalid value of Foo: maybe, \
             err: strconv.ParseBool: parsing \"maybe\": invalid syntax"
        );
        assert!(usage(&["--feature-gates=,,A"]).contains("malformed pair"));
        // ...unknown or locked names are refused after parsing (exit 1).
        let refused = |args: &[&str]| {
            ok(args)
                .feature_gates()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert_eq!(
            refused(&["--feature-gates==true"]),
            "failed to store flag gates: unrecognized feature gate: "
        );
        assert_eq!(
            refused(&[
                "--feature-gates=AllAlpha=true",
                "--feature-gates=NoSuch=false"
            ]),
            "failed to store flag gates: unrecognized feature gate: NoSuch"
        );
        assert_eq!(
            refused(&["--feature-gates=APIServerTracing=false"]),
            "failed to store flag gates: cannot set feature gate APIServerTracing to false, \
             feature is locked to true"
        );
        assert!(
            ok(&["--feature-gates=APIServerTracing=true,KMSv1=true,WatchList=false"])
                .feature_gates()
                .is_ok()
        );
    }

    #[test]
    fn leader_election_labels_parse_like_csi_lib_utils() {
        let parsed = |args: &[&str]| ok(args).leader_election_labels;
        assert_eq!(
            parsed(&["--leader-election-labels=a:1,b:2"]),
            labels(&[("a", "1"), ("b", "2")])
        );
        // Occurrences merge; a repeated key keeps its last value.
        assert_eq!(
            parsed(&[
                "--leader-election-labels=a:1,b:2",
                "--leader-election-labels=b:3,c:"
            ]),
            labels(&[("a", "1"), ("b", "3"), ("c", "")])
        );
        assert_eq!(
            parsed(&["--leader-election-labels=a:1,a:2"]),
            labels(&[("a", "2")])
        );
        // Empty keys and values parse (the API server judges them).
        assert_eq!(
            parsed(&["--leader-election-labels=:v"]),
            labels(&[("", "v")])
        );
        assert_eq!(parsed(&["--leader-election-labels=:"]), labels(&[("", "")]));
        // Every item needs exactly one colon; an empty item (or value) has none.
        for (value, item) in [
            ("a:1,,b:2", ""),
            ("", ""),
            ("a:1,", ""),
            ("a", "a"),
            ("a:b:c", "a:b:c"),
        ] {
            assert_eq!(
                usage(&[&format!("--leader-election-labels={value}")]),
                format!(
                    "invalid value {value:?} for flag -leader-election-labels: \
                     malformed item in list of labels: {item}"
                )
            );
        }
    }

    #[test]
    fn lease_labels_the_api_server_refuses_stop_a_leader_election_start() {
        let problem = |value: &str, leader: bool| {
            let arg = format!("--leader-election-labels={value}");
            let mut args = vec![arg.as_str()];
            if leader {
                args.push("--leader-election");
            }
            ok(&args).validate().err().map(|e| e.to_string())
        };
        assert_eq!(problem(":v", false), None, "unused without leader election");
        assert!(problem(":v", true).is_some_and(|e| e.contains("must not be empty")));
        for bad in ["a b:1", "a:-x", "Example.com/a:1", "a/b/c:1", "a:x/y"] {
            assert!(problem(bad, true).is_some(), "{bad}");
        }
        let long = "x".repeat(64);
        assert!(problem(&format!("a:{long}"), true).is_some());
        for good in ["a:", "a:1", "example.com/a-b_c.d:V-1", "x:y,z:w"] {
            assert_eq!(problem(good, true), None, "{good}");
        }
    }

    #[test]
    fn integers_use_go_syntax() {
        assert_eq!(ok(&["--worker-threads=0x10"]).worker_threads, 16);
        assert_eq!(ok(&["--worker-threads=010"]).worker_threads, 8);
        assert_eq!(ok(&["--worker-threads=0b1"]).worker_threads, 1);
        assert_eq!(ok(&["--worker-threads=0o7"]).worker_threads, 7);
        assert_eq!(ok(&["--worker-threads=1_000"]).worker_threads, 1000);
        assert_eq!(
            usage(&["--worker-threads=-1"]),
            "invalid value \"-1\" for flag -worker-threads: parse error"
        );
        assert_eq!(
            usage(&["--worker-threads=18446744073709551616"]),
            "invalid value \"18446744073709551616\" for flag -worker-threads: value out of range"
        );
        assert_eq!(ok(&["--max-entries=-0x10"]).max_entries, -16);
        assert_eq!(ok(&["--max-entries=+5"]).max_entries, 5);
        // Go's int32(n) keeps the low 32 bits.
        assert_eq!(ok(&["--max-entries=4294967297"]).max_entries, 1);
        assert_eq!(
            usage(&["--max-entries=9223372036854775808"]),
            "invalid value \"9223372036854775808\" for flag -max-entries: value out of range"
        );
        assert_eq!(ok(&["--kube-api-burst=-1"]).kube_api_burst, -1);
        assert_eq!(ok(&["--kube-api-burst=0X1F"]).kube_api_burst, 31);
        assert_eq!(ok(&["--max-grpc-log-length", "-1"]).max_grpc_log_length, -1);
        assert_eq!(ok(&["-max-grpc-log-length=-0b11"]).max_grpc_log_length, -3);
        // klog's level: decimal, unsigned, at most 2^31-1.
        assert_eq!(ok(&["--v=010"]).v, 10);
        assert_eq!(ok(&["--v=2147483647"]).v, 2147483647);
        assert_eq!(
            usage(&["--v=0x10"]),
            "invalid value \"0x10\" for flag -v: strconv.ParseUint: parsing \"0x10\": invalid syntax"
        );
        assert!(usage(&["--v=2147483648"]).ends_with("value out of range"));
        assert!(usage(&["--v=-1"]).ends_with("invalid syntax"));
    }

    #[test]
    fn qps_is_a_go_float() {
        assert_eq!(ok(&["--kube-api-qps=1e-20"]).kube_api_qps, 1e-20);
        assert_eq!(ok(&["--kube-api-qps=0x1p-2"]).kube_api_qps, 0.25);
        assert_eq!(ok(&["--kube-api-qps=1_000.5"]).kube_api_qps, 1000.5);
        assert!(ok(&["--kube-api-qps=NaN"]).kube_api_qps.is_nan());
        assert_eq!(
            ok(&["--kube-api-qps=-Infinity"]).kube_api_qps,
            f64::NEG_INFINITY
        );
        assert_eq!(
            usage(&["--kube-api-qps=1e400"]),
            "invalid value \"1e400\" for flag -kube-api-qps: value out of range"
        );
        assert_eq!(
            usage(&["--kube-api-qps=0x10"]),
            "invalid value \"0x10\" for flag -kube-api-qps: parse error"
        );
    }

    #[test]
    fn a_negative_burst_is_refused_only_when_requests_are_limited() {
        let refused = |args: &[&str]| ok(args).validate().is_err();
        assert!(refused(&["--kube-api-burst=-1"]), "default QPS limits");
        assert!(refused(&["--kube-api-burst=-1", "--kube-api-qps=0"]));
        assert!(refused(&["--kube-api-burst=-1", "--kube-api-qps=1e-50"]));
        assert!(!refused(&["--kube-api-burst=-1", "--kube-api-qps=-1"]));
        assert!(!refused(&["--kube-api-burst=-1", "--kube-api-qps=NaN"]));
    }

    #[test]
    fn durations_are_go_durations() {
        // A flag no lower bound applies to (see `raise_absurd_values`).
        let parsed = |value: &str| {
            ok(&[&format!("--leader-election-retry-period={value}")]).leader_election_retry_period
        };
        assert_eq!(parsed("1.5µs"), Duration::from_nanos(1500));
        assert_eq!(parsed("+1s"), Duration::from_secs(1));
        assert_eq!(parsed("-0"), Duration::ZERO);
        assert_eq!(
            parsed("2562047h47m16.854775807s"),
            Duration::from_nanos(i64::MAX as u64)
        );
        assert_eq!(
            ok(&["--timeout=-0"]).timeout,
            MIN_INTERVAL,
            "zero is raised"
        );
        for bad in ["15", "abc", "1e3s", "-", ".s", "2562047h47m16.854775808s"] {
            assert_eq!(
                usage(&[&format!("--timeout={bad}")]),
                format!("invalid value {bad:?} for flag -timeout: parse error")
            );
        }
    }

    #[test]
    fn negative_durations_parse_and_are_refused_where_upstream_breaks() {
        for flag in [
            "timeout",
            "resync",
            "retry-interval-start",
            "retry-interval-max",
            "reconcile-sync",
        ] {
            let c = ok(&[&format!("--{flag}=-1s")]);
            assert_eq!(
                c.validate().err().map(|e| e.to_string()),
                Some(format!(
                    "invalid --{flag}=-1s: the duration must not be negative"
                )),
                "{flag}"
            );
        }
        // Leader-election timing is only used, and checked, with --leader-election.
        let c = ok(&["--leader-election-lease-duration=-1s"]);
        assert!(c.validate().is_ok());
        let c = ok(&["--leader-election-lease-duration=-1s", "--leader-election"]);
        assert!(c.validate().is_err());
        // The flush period is component-base's: refused by the logging validation, zero too.
        for value in ["-1s", "0"] {
            let c = ok(&[&format!("--log-flush-frequency={value}")]);
            assert!(c.validate().is_ok());
            assert!(c
                .validate_logging()
                .is_err_and(|e| e.to_string().contains("Must be greater than zero")));
        }
    }

    #[test]
    fn leader_election_timing_is_checked_as_client_go_does() {
        let problem = |args: &[&str]| {
            let mut args = args.to_vec();
            args.push("--leader-election");
            ok(&args).validate().err().map(|e| e.to_string())
        };
        assert_eq!(problem(&[]), None);
        assert!(problem(&["--leader-election-lease-duration=10s"])
            .is_some_and(|e| e.ends_with("leaseDuration must be greater than renewDeadline")));
        assert!(problem(&["--leader-election-retry-period=9s"]).is_some_and(
            |e| e.ends_with("renewDeadline must be greater than retryPeriod*JitterFactor")
        ));
        assert!(problem(&[
            "--leader-election-retry-period=0",
            "--leader-election-renew-deadline=1s",
            "--leader-election-lease-duration=2s"
        ])
        .is_some_and(|e| e.ends_with("retryPeriod must be greater than zero")));
    }

    #[test]
    fn logging_flags_are_validated_like_component_base() {
        let invalid = |args: &[&str]| ok(args).validate_logging().err().map(|e| e.to_string());
        assert_eq!(
            invalid(&["--logging-format=xml"]).as_deref(),
            Some("LoggingConfiguration is invalid: format: Invalid value: \"xml\": Unsupported log format")
        );
        assert!(invalid(&["--logging-format=JSON"]).is_some());
        assert_eq!(invalid(&["--logging-format=json"]), None);
        assert_eq!(
            invalid(&["--vmodule=a=1", "--logging-format=json"]).as_deref(),
            Some("LoggingConfiguration is invalid: vmodule: Forbidden: Only supported for text log format")
        );
        assert_eq!(invalid(&["--vmodule=,", "--logging-format=json"]), None);
        assert!(invalid(&["--log-text-split-stream"])
            .is_some_and(|e| e.contains("LoggingAlphaOptions")));
        assert!(invalid(&["--log-json-info-buffer-size=1Mi"]).is_some());
        assert!(invalid(&["--log-json-info-buffer-size=1m"]).is_some());
        assert_eq!(invalid(&["--log-text-info-buffer-size=0Mi"]), None);
        assert_eq!(
            invalid(&["--log-text-split-stream", "--log-json-split-stream"]).as_deref(),
            Some(
                "LoggingConfiguration is invalid: [options.text.splitStream: Forbidden: Feature \
                 LoggingAlphaOptions is disabled, options.json.splitStream: Forbidden: Feature \
                 LoggingAlphaOptions is disabled]"
            )
        );
        assert_eq!(
            usage(&["--log-text-info-buffer-size=abc"]),
            format!(
                "invalid value \"abc\" for flag -log-text-info-buffer-size: {}",
                go::QUANTITY_FORMAT
            )
        );
    }

    #[test]
    fn vmodule_accumulates_and_checks_each_item() {
        assert_eq!(
            ok(&["--vmodule=a=1,,b=2,", "--vmodule=c*=3"]).vmodule,
            "a=1,b=2,c*=3"
        );
        assert_eq!(
            usage(&["--vmodule=a=1", "--vmodule=b=x"]),
            "invalid value \"b=x\" for flag -vmodule: parsing verbosity in \"b=x\": \
             strconv.ParseUint: parsing \"x\": invalid syntax"
        );
        assert_eq!(
            usage(&["--vmodule=a"]),
            "invalid value \"a\" for flag -vmodule: \"a\" does not have the pattern=N format"
        );
        assert!(usage(&["--vmodule==1"]).contains("pattern=N"));
        assert!(usage(&["--vmodule=a=1=2"]).contains("pattern=N"));
    }

    #[test]
    fn go_usage_errors_and_help() {
        assert_eq!(
            usage(&["--no-such-flag"]),
            "flag provided but not defined: -no-such-flag"
        );
        assert_eq!(
            usage(&["-Version"]),
            "flag provided but not defined: -Version"
        );
        assert_eq!(usage(&["---version"]), "bad flag syntax: ---version");
        assert_eq!(usage(&["-=x"]), "bad flag syntax: -=x");
        assert_eq!(usage(&["--=x"]), "bad flag syntax: --=x");
        assert_eq!(usage(&["--timeout"]), "flag needs an argument: -timeout");
        // Go stops at the first problem, in argument order.
        assert_eq!(
            usage(&["--timeout=x", "--no-such-flag"]),
            "invalid value \"x\" for flag -timeout: parse error"
        );
        assert_eq!(
            usage(&["--no-such-flag", "--timeout=x"]),
            "flag provided but not defined: -no-such-flag"
        );
        assert!(matches!(
            parse(&["--timeout=x", "--help"]),
            Err(ParseError::Usage { .. })
        ));
        for help in [
            &["-h"][..],
            &["--help"],
            &["-help"],
            &["--help=foo"],
            &["-h=1"],
        ] {
            let err = parse(help).expect_err("help");
            assert!(matches!(err, ParseError::Help { .. }), "{help:?}");
            assert_eq!(err.exit_code(), 0);
        }
        assert_eq!(parse(&["--bogus"]).expect_err("usage").exit_code(), 2);
        // After the flags: ignored, whatever they look like.
        for args in [
            &["--", "--bogus"][..],
            &["-", "--bogus"],
            &["extra", "--bogus"],
        ] {
            assert_eq!(ok(args).rest.last().map(String::as_str), Some("--bogus"));
        }
        let not_utf8 = std::ffi::OsString::from_vec(b"--csi-address=/run/\xff".to_vec());
        let err = Config::try_parse_go([std::ffi::OsString::from("csi-attacher"), not_utf8]);
        assert!(
            matches!(&err, Err(ParseError::Usage { message, .. }) if message.contains("UTF-8")),
            "{err:?}"
        );
        assert_eq!(
            ok(&["--timeout", "-1s"]).negative_durations,
            vec![("timeout", "-1s".to_string())]
        );
    }

    #[test]
    fn validation_errors_are_upstreams() {
        let err = |args: &[&str]| ok(args).validate().err().map(|e| e.to_string());
        assert_eq!(
            err(&["--worker-threads=0"]).as_deref(),
            Some("Option -worker-threads must be greater than zero")
        );
        assert!(err(&["--http-endpoint=:8080", "--metrics-address=:8081"]).is_some());
    }

    #[test]
    fn zero_and_absurd_values_are_raised_and_recorded() {
        let c = ok(&[
            "--timeout=0",
            "--retry-interval-start=0",
            "--retry-interval-max=1ns",
            "--reconcile-sync=0",
            "--resync=1ms",
            "--worker-threads=100000000",
        ]);
        assert_eq!(c.timeout, MIN_INTERVAL);
        assert_eq!(c.retry_interval_start, MIN_INTERVAL);
        assert_eq!(c.retry_interval_max, MIN_INTERVAL);
        assert_eq!(c.reconcile_sync, MIN_INTERVAL);
        assert_eq!(c.resync, MIN_RESYNC);
        assert_eq!(c.worker_threads, MAX_WORKERS);
        let flags: Vec<&str> = c.adjusted.iter().map(|a| a.flag).collect();
        assert_eq!(
            flags,
            [
                "timeout",
                "retry-interval-start",
                "retry-interval-max",
                "reconcile-sync",
                "resync",
                "worker-threads"
            ]
        );
        assert_eq!(c.adjusted[0].given, "0ns");
        assert_eq!(c.adjusted[0].used, "100ms");
        assert!(c.validate().is_ok());
        // Zero resync disables it, as upstream; sane and huge values stay as given.
        let c = ok(&[
            "--resync=0",
            "--timeout=100ms",
            "--retry-interval-start=10s",
            "--retry-interval-max=1s",
            "--reconcile-sync=2562047h",
            "--worker-threads=10000",
        ]);
        assert!(c.adjusted.is_empty(), "{:?}", c.adjusted);
        assert_eq!(c.resync, Duration::ZERO);
        assert_eq!(c.retry_interval_max, Duration::from_secs(1));
        assert_eq!(c.reconcile_sync, Duration::from_secs(2_562_047 * 3600));
        // A negative value is refused, not raised.
        let c = ok(&["--timeout=-1s"]);
        assert!(c.adjusted.is_empty());
        assert!(c.validate().is_err());
        // Zero workers stays upstream's error.
        assert!(ok(&["--worker-threads=0"]).validate().is_err());
    }

    #[test]
    fn go_only_flags_are_accepted() {
        let c = ok(&[
            "--automaxprocs",
            "--vmodule=foo=4",
            "--log-flush-frequency=10s",
            "--v=5",
        ]);
        assert!(c.automaxprocs);
        assert_eq!(c.v, 5);
        assert_eq!(c.vmodule, "foo=4");
    }
}
