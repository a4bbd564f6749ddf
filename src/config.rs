//! Command-line flags, parsed the way Go's `flag` package parses them.
//!
//! Upstream registers every flag on Go's `flag.CommandLine`, and deployments
//! rely on its syntax (UPSTREAM-BEHAVIOR §1): `-flag` and `--flag` both work,
//! `--flag=value` and `--flag value` both work for non-bool flags, bools are
//! set by the bare flag or `--flag=true|false`, durations use Go syntax, and
//! parsing stops at the first non-flag argument. [`normalize_args`] rewrites
//! Go-style arguments into the one form clap accepts (`--name=value`).

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

    /// Number for the log level verbosity (0-1 info, 2-4 debug, 5+ trace).
    #[arg(long, default_value_t = 0)]
    pub v: u8,

    /// Log format: text or json.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub logging_format: String,

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

impl Config {
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
