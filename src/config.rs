//! Command-line flags, parsed the way Go's `flag` package parses them.
//!
//! Upstream registers every flag on Go's `flag.CommandLine`, and deployments
//! rely on its syntax (UPSTREAM-BEHAVIOR §1): `-flag` and `--flag` both work,
//! `--flag=value` and `--flag value` both work for non-bool flags, bools are
//! set by the bare flag or `--flag=true|false`, durations use Go syntax, and
//! parsing stops at the first non-flag argument. [`normalize_args`] rewrites
//! Go-style arguments into the one form clap accepts (`--name=value`).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, CommandFactory, FromArgMatches, Parser};

/// Where the kubelet reads a container's termination message by default.
pub const DEFAULT_TERMINATION_LOG: &str = "/dev/termination-log";

/// The sidecar's configuration.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "csi-attacher",
    version,
    about = "CSI external-attacher: makes VolumeAttachments true with ControllerPublish/ControllerUnpublish",
    disable_version_flag = true
)]
pub struct Config {
    /// Address of the CSI driver socket (absolute path or unix:///path).
    #[arg(long, default_value = "/run/csi/socket")]
    pub csi_address: String,

    /// Timeout of waiting for a CSI call (Probe, ControllerPublish/Unpublish, ListVolumes).
    #[arg(long, default_value = "15s", value_parser = parse_go_duration)]
    pub timeout: Duration,

    /// Absolute path to the kubeconfig file; empty: in-cluster configuration.
    #[arg(long, default_value = "")]
    pub kubeconfig: String,

    /// Resync period for the VolumeAttachment, PersistentVolume and CSINode caches.
    #[arg(long, default_value = "10m", value_parser = parse_go_duration)]
    pub resync: Duration,

    /// Initial retry interval of a failed attach or detach; doubles per failure.
    #[arg(long, default_value = "1s", value_parser = parse_go_duration)]
    pub retry_interval_start: Duration,

    /// Maximum retry interval of a failed attach or detach.
    #[arg(long, default_value = "5m", value_parser = parse_go_duration)]
    pub retry_interval_max: Duration,

    /// Number of attacher worker threads (per lane).
    #[arg(long, default_value_t = 10)]
    pub worker_threads: u32,

    /// fsType of mount volumes whose PV does not set one.
    #[arg(long, default_value = "")]
    pub default_fstype: String,

    /// QPS to use while communicating with the Kubernetes API server.
    #[arg(long, default_value_t = 5.0)]
    pub kube_api_qps: f32,

    /// Burst to use while communicating with the Kubernetes API server.
    #[arg(long, default_value_t = 10)]
    pub kube_api_burst: u32,

    /// Period of the ListVolumes-based VolumeAttachment reconciler.
    #[arg(long, default_value = "1m", value_parser = parse_go_duration)]
    pub reconcile_sync: Duration,

    /// `max_entries` of every ListVolumes request (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub max_entries: i32,

    /// Truncate logged gRPC responses to this many characters (<= 0: no limit).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub max_grpc_log_length: i64,

    /// Feature gates: key=bool,... (ReleaseLeaderElectionOnExit, MutableCSINodeAllocatableCount).
    #[arg(long, default_value = "")]
    pub feature_gates: String,

    /// Enable leader election (a Lease) so that only one replica acts.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub leader_election: bool,

    /// Namespace of the leader-election Lease (else $POD_NAMESPACE, the service account's, or default).
    #[arg(long, default_value = "")]
    pub leader_election_namespace: String,

    /// How long a lease is valid after its last renewal.
    #[arg(long, default_value = "15s", value_parser = parse_go_duration)]
    pub leader_election_lease_duration: Duration,

    /// How long the leader keeps trying to renew before it gives up.
    #[arg(long, default_value = "10s", value_parser = parse_go_duration)]
    pub leader_election_renew_deadline: Duration,

    /// Pause between leader-election attempts.
    #[arg(long, default_value = "5s", value_parser = parse_go_duration)]
    pub leader_election_retry_period: Duration,

    /// Labels put on the Lease while leading: key:value,key2:value2.
    #[arg(long, default_value = "", value_parser = parse_labels)]
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

    /// Go only (GOMAXPROCS from the CPU quota); accepted and ignored.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub automaxprocs: bool,

    /// Go only (per-file verbosity); accepted and ignored.
    #[arg(long, default_value = "")]
    pub vmodule: String,

    /// Go only (klog flush period); accepted and ignored.
    #[arg(long, default_value = "5s", value_parser = parse_go_duration)]
    pub log_flush_frequency: Duration,

    /// Alpha in upstream and disabled there: enabling it is an error.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub log_text_split_stream: bool,

    /// Alpha in upstream and disabled there: a non-zero size is an error.
    #[arg(long, default_value = "0")]
    pub log_text_info_buffer_size: String,

    /// Alpha in upstream and disabled there: enabling it is an error.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub log_json_split_stream: bool,

    /// Alpha in upstream and disabled there: a non-zero size is an error.
    #[arg(long, default_value = "0")]
    pub log_json_info_buffer_size: String,

    /// Number for the log level verbosity (0-1 info, 2-4 debug, 5+ trace).
    #[arg(long, default_value_t = 0)]
    pub v: u8,

    /// Log format: text or json.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub logging_format: String,

    /// `check` only: report format, text or json.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,

    /// File that receives the reason of a fatal exit (not in upstream; its path is fixed there).
    #[arg(long, default_value = DEFAULT_TERMINATION_LOG)]
    pub termination_log_path: PathBuf,

    /// Print the version and exit.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub version: bool,

    /// Arguments after the first non-flag argument (ignored, as Go's flag package does).
    #[arg(hide = true, trailing_var_arg = true)]
    pub rest: Vec<String>,
}

/// A flag combination upstream refuses after parsing (exit 1, not 2).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `--worker-threads=0`.
    #[error("Option -worker-threads must be greater than zero")]
    NoWorkers,
    /// Both HTTP address flags.
    #[error("only one of `--metrics-address` and `--http-endpoint` can be set")]
    TwoHttpAddresses,
    /// An unknown or malformed feature gate.
    #[error("invalid --feature-gates: {0}")]
    FeatureGates(String),
    /// Upstream's alpha logging options, which it keeps disabled.
    #[error("invalid logging configuration: Feature LoggingAlphaOptions is disabled")]
    LoggingAlpha,
}

/// The feature gates the attacher knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureGates {
    /// Release the Lease on SIGTERM/SIGINT (ours: on by default; upstream: alpha, off).
    pub release_leader_election_on_exit: bool,
    /// Put `errorCode` on attach errors (GA in upstream v4.12, on).
    pub mutable_csi_node_allocatable_count: bool,
}

impl Default for FeatureGates {
    fn default() -> Self {
        Self {
            release_leader_election_on_exit: true,
            mutable_csi_node_allocatable_count: true,
        }
    }
}

impl FeatureGates {
    /// Parses `key=bool,key=bool`.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let mut gates = Self::default();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| Error::FeatureGates(format!("missing bool value for {item}")))?;
            let value = parse_go_bool(value.trim())
                .map_err(|e| Error::FeatureGates(format!("invalid value of {key}: {e}")))?;
            match key.trim() {
                "ReleaseLeaderElectionOnExit" => gates.release_leader_election_on_exit = value,
                "MutableCSINodeAllocatableCount" => {
                    gates.mutable_csi_node_allocatable_count = value
                }
                // Meta gates of k8s.io/component-base, accepted by upstream; nothing to switch here.
                "AllAlpha" | "AllBeta" => {}
                other => {
                    return Err(Error::FeatureGates(format!(
                        "unrecognized feature gate: {other}"
                    )))
                }
            }
        }
        Ok(gates)
    }
}

impl Config {
    /// Checks what parsing cannot; returns the feature gates.
    pub fn validate(&self) -> Result<FeatureGates, Error> {
        if self.worker_threads == 0 {
            return Err(Error::NoWorkers);
        }
        if !self.http_endpoint.is_empty() && !self.metrics_address.is_empty() {
            return Err(Error::TwoHttpAddresses);
        }
        let nonzero = |size: &str| !matches!(size.trim(), "" | "0");
        if self.log_text_split_stream
            || self.log_json_split_stream
            || nonzero(&self.log_text_info_buffer_size)
            || nonzero(&self.log_json_info_buffer_size)
        {
            return Err(Error::LoggingAlpha);
        }
        FeatureGates::parse(&self.feature_gates)
    }

    /// Parses Go-style arguments (`args[0]` is the program name).
    pub fn try_parse_go<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        let mut command = Self::command();
        command.build(); // adds the generated --help so normalize_args can see it
        let args = normalize_args(&command, args.into_iter().map(Into::into).collect());
        let matches = command.try_get_matches_from_mut(args)?;
        Self::from_arg_matches(&matches)
    }
}

/// Rewrites Go `flag` syntax into `--name=value` for clap.
///
/// Knows from `command` which flags take a value, so `--timeout -1` keeps `-1`
/// as the value (Go consumes the next argument whatever it looks like) while a
/// bool flag never consumes the next argument.
pub fn normalize_args(command: &clap::Command, args: Vec<OsString>) -> Vec<OsString> {
    let mut out = Vec::with_capacity(args.len() + 1);
    let mut iter = args.into_iter();
    if let Some(program) = iter.next() {
        out.push(program);
    }
    while let Some(arg) = iter.next() {
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if text == "--" {
            out.push(arg);
            out.extend(iter);
            break;
        }
        let dashes = text.len() - text.trim_start_matches('-').len();
        if dashes == 0 || text == "-" {
            // First non-flag argument: Go stops parsing here.
            out.push(OsString::from("--"));
            out.push(arg);
            out.extend(iter);
            break;
        }
        if dashes > 2 {
            out.push(arg); // clap reports it as unknown, like Go's "bad flag syntax"
            continue;
        }
        let body = &text[dashes..];
        let (name, value) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (body, None),
        };
        let Some(flag) = command.get_arguments().find(|a| {
            a.get_long() == Some(name) || (name.len() == 1 && a.get_short() == name.chars().next())
        }) else {
            out.push(arg); // unknown: clap prints usage and exits 2
            continue;
        };
        let long = flag.get_long().unwrap_or(name);
        // Bools are the only flags declared with require_equals (Go: no `--flag value` form).
        let is_bool = flag.is_require_equals_set();
        let takes_value = matches!(flag.get_action(), ArgAction::Set | ArgAction::Append);
        let value = match value {
            Some(v) => Some(v),
            None if is_bool => Some("true".to_string()),
            None if takes_value => iter.next().and_then(|v| v.into_string().ok()),
            None => None,
        };
        match value {
            Some(v) => out.push(OsString::from(format!("--{long}={v}"))),
            None => out.push(OsString::from(format!("--{long}"))),
        }
    }
    out
}

/// `key:value,key2:value2` (upstream's `--leader-election-labels`).
pub fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    for item in text.split(',').filter(|s| !s.is_empty()) {
        let parts: Vec<&str> = item.split(':').collect();
        match parts.as_slice() {
            [key, value] if !key.is_empty() => {
                labels.insert((*key).to_string(), (*value).to_string());
            }
            _ => return Err(format!("invalid label {item:?}: expected key:value")),
        }
    }
    Ok(labels)
}

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("parse error: invalid boolean value {s:?}")),
    }
}

/// Go's `time.ParseDuration`: `300ms`, `1m30s`, `1.5h`, `0`; a bare number other
/// than 0 is rejected. Negative durations are rejected too (no flag wants one).
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let err = || format!("time: invalid duration {s:?}");
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest.starts_with('-') {
        return Err(format!("negative duration {s:?} is not allowed"));
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(err());
    }
    let mut total_nanos: f64 = 0.0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        let number = &rest[..number_len];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(err());
        }
        let value: f64 = number.parse().map_err(|_| err())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos_per_unit = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            "" => return Err(format!("time: missing unit in duration {s:?}")),
            unit => return Err(format!("time: unknown unit {unit:?} in duration {s:?}")),
        };
        total_nanos += value * nanos_per_unit;
        rest = &rest[unit_len..];
    }
    if total_nanos > u64::MAX as f64 {
        return Err(err());
    }
    Ok(Duration::from_nanos(total_nanos.round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        Config::try_parse_go(std::iter::once("csi-attacher").chain(args.iter().copied()))
    }

    #[test]
    fn defaults_match_upstream() {
        let c = parse(&[]).expect("defaults parse");
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
    }

    #[test]
    fn single_and_double_dash_with_equals_or_space_all_work() {
        for args in [
            &["-csi-address=/a", "-timeout=2s"][..],
            &["--csi-address", "/a", "--timeout", "2s"],
            &["-csi-address", "/a", "--timeout=2s"],
        ] {
            let c = parse(args).expect("parses");
            assert_eq!(c.csi_address, "/a", "{args:?}");
            assert_eq!(c.timeout, Duration::from_secs(2), "{args:?}");
        }
    }

    #[test]
    fn bools_take_no_separate_value() {
        assert!(parse(&["--version"]).expect("bare").version);
        assert!(parse(&["-version=true"]).expect("=true").version);
        assert!(!parse(&["--version=false"]).expect("=false").version);
        // `--version false`: false is the first non-flag argument, parsing stops.
        let c = parse(&["--version", "false", "--timeout=1s"]).expect("stops at non-flag");
        assert!(c.version);
        assert_eq!(c.timeout, Duration::from_secs(15));
        assert_eq!(
            c.rest,
            vec!["false".to_string(), "--timeout=1s".to_string()]
        );
    }

    #[test]
    fn unknown_flags_and_bad_values_are_errors() {
        assert_eq!(
            parse(&["--no-such-flag"]).expect_err("unknown").kind(),
            clap::error::ErrorKind::UnknownArgument
        );
        assert!(parse(&["--timeout=15"]).is_err());
        assert!(parse(&["--timeout", "abc"]).is_err());
        assert!(parse(&["---timeout=1s"]).is_err());
    }

    #[test]
    fn go_durations() {
        let ok = [
            ("0", Duration::ZERO),
            ("15s", Duration::from_secs(15)),
            ("1m30s", Duration::from_secs(90)),
            ("300ms", Duration::from_millis(300)),
            ("1.5h", Duration::from_secs(5400)),
            ("2h45m", Duration::from_secs(9900)),
            ("10us", Duration::from_micros(10)),
            ("10µs", Duration::from_micros(10)),
            ("7ns", Duration::from_nanos(7)),
            (".5s", Duration::from_millis(500)),
        ];
        for (text, want) in ok {
            assert_eq!(parse_go_duration(text), Ok(want), "{text}");
        }
        for bad in ["", "15", "1x", "s", "1.2.3s", "-1s", "1 s", "1min"] {
            assert!(parse_go_duration(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn upstream_defaults_of_the_rest() {
        let c = parse(&[]).expect("defaults");
        assert_eq!(c.reconcile_sync, Duration::from_secs(60));
        assert_eq!(c.max_entries, 0);
        assert_eq!(c.max_grpc_log_length, -1);
        assert!(!c.leader_election);
        assert_eq!(c.leader_election_lease_duration, Duration::from_secs(15));
        assert_eq!(c.leader_election_renew_deadline, Duration::from_secs(10));
        assert_eq!(c.leader_election_retry_period, Duration::from_secs(5));
        assert!(c.leader_election_labels.is_empty());
        assert_eq!(c.http_endpoint, "");
        assert_eq!(c.metrics_path, "/metrics");
        assert_eq!(c.validate().ok(), Some(FeatureGates::default()));
    }

    #[test]
    fn negative_numbers_are_values_in_both_forms() {
        assert_eq!(
            parse(&["--max-grpc-log-length", "-1"])
                .expect("space")
                .max_grpc_log_length,
            -1
        );
        assert_eq!(
            parse(&["-max-grpc-log-length=20"])
                .expect("equals")
                .max_grpc_log_length,
            20
        );
    }

    #[test]
    fn leader_election_labels_need_exactly_one_colon() {
        let c = parse(&["--leader-election-labels=a:1,b:2"]).expect("labels");
        assert_eq!(
            c.leader_election_labels.get("b").map(String::as_str),
            Some("2")
        );
        assert!(parse(&["--leader-election-labels=a"]).is_err());
        assert!(parse(&["--leader-election-labels=a:1:2"]).is_err());
    }

    #[test]
    fn validation_errors_are_upstreams() {
        let err = |args: &[&str]| {
            parse(args)
                .expect("parses")
                .validate()
                .err()
                .map(|e| e.to_string())
        };
        assert_eq!(
            err(&["--worker-threads=0"]).as_deref(),
            Some("Option -worker-threads must be greater than zero")
        );
        assert!(err(&["--http-endpoint=:8080", "--metrics-address=:8081"]).is_some());
        assert!(err(&["--feature-gates=NoSuchGate=true"])
            .is_some_and(|e| e.contains("unrecognized feature gate")));
        assert!(err(&["--feature-gates=ReleaseLeaderElectionOnExit=maybe"]).is_some());
        assert!(
            err(&["--log-text-split-stream"]).is_some_and(|e| e.contains("LoggingAlphaOptions"))
        );
        assert!(err(&["--log-json-info-buffer-size=1Mi"]).is_some());
        let gates = parse(&["--feature-gates=ReleaseLeaderElectionOnExit=false,MutableCSINodeAllocatableCount=false,AllAlpha=true"])
            .expect("parses")
            .validate()
            .expect("valid");
        assert!(
            !gates.release_leader_election_on_exit && !gates.mutable_csi_node_allocatable_count
        );
    }

    #[test]
    fn go_only_flags_are_accepted() {
        let c = parse(&[
            "--automaxprocs",
            "--vmodule=foo=4",
            "--log-flush-frequency=10s",
            "--v=5",
        ])
        .expect("accepted");
        assert!(c.automaxprocs);
        assert_eq!(c.v, 5);
    }

    #[test]
    fn go_bools() {
        for t in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(parse_go_bool(t), Ok(true));
        }
        for f in ["0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(parse_go_bool(f), Ok(false));
        }
        assert!(parse_go_bool("yes").is_err());
    }
}
