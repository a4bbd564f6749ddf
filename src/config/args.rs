//! [`Config::try_parse_go`]: the arguments walked with Go's `flag` rules and handed to
//! clap as one `--name=value` per flag, the flags whose occurrences merge, and clap's
//! errors worded as Go words them.

use std::any::TypeId;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::time::Duration;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Arg, ArgAction, ArgMatches, CommandFactory, FromArgMatches};

use super::values::{labels_flag, vmodule_flag};
use super::{gates, Config};
use crate::gofmt::parse as go;

/// Every flag upstream v4.12 defines (its own, csi-lib-utils' standard flags and
/// component-base's logging flags), without dashes. Go's flag package exits 2
/// on any other: the flags of ours not in this list are the ones to remove
/// before going back (docs/flags.md).
pub const UPSTREAM_FLAGS: &str = "\
    resync timeout retry-interval-start retry-interval-max worker-threads max-entries \
    default-fstype reconcile-sync max-grpc-log-length feature-gates version kubeconfig \
    csi-address leader-election leader-election-namespace leader-election-lease-duration \
    leader-election-renew-deadline leader-election-retry-period leader-election-labels \
    kube-api-qps kube-api-burst http-endpoint metrics-address metrics-path automaxprocs v \
    vmodule logging-format log-flush-frequency log-text-split-stream log-text-info-buffer-size \
    log-json-split-stream log-json-info-buffer-size help";

/// Why the command line was not accepted (Go's `flag` package exits at this point).
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// `-h`, `-help` or `--help`: print `usage` and exit 0.
    #[error("help requested")]
    Help { usage: String },
    /// A usage error: print Go's `message` (`flag provided but not defined: -foo`)
    /// and the usage, exit 2.
    #[error("{message}")]
    Usage { message: String, usage: String },
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

impl Config {
    /// Parses Go-style arguments (`args[0]` is the program name).
    pub fn try_parse_go<I, T>(args: I) -> Result<Self, ParseError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        let mut command = Self::command_go();
        let usage = command.render_help().to_string();
        let args = args.into_iter().map(Into::into).collect();
        let (args, stop) = normalize_args(&command, args, &usage);
        // Go reports the first problem in argument order: clap sees the arguments before
        // the one that stopped the walk, so an earlier bad value still wins.
        let matches = command
            .try_get_matches_from_mut(args)
            .map_err(|err| usage_error(&command, &err, &usage))?;
        if let Some(stop) = stop {
            return Err(stop);
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
        let durations = command
            .get_arguments()
            .filter(|arg| arg.get_value_parser().type_id() == TypeId::of::<Duration>());
        for arg in durations {
            let last = matches
                .get_raw(arg.get_id().as_str())
                .and_then(|mut values| values.next_back()?.to_str());
            if let (Some(flag), Some(raw)) = (arg.get_long(), last) {
                if go::parse_duration(raw).is_ok_and(|nanos| nanos < 0) {
                    config.negative_durations.push((flag.into(), raw.into()));
                }
            }
        }
        config.not_in_upstream = command
            .get_arguments()
            .filter(|arg| {
                matches.value_source(arg.get_id().as_str())
                    == Some(clap::parser::ValueSource::CommandLine)
            })
            .filter_map(Arg::get_long)
            .filter(|long| !UPSTREAM_FLAGS.split_whitespace().any(|f| f == *long))
            .map(str::to_owned)
            .collect();
        config.raise_absurd_values();
        Ok(config)
    }

    /// The long names of every flag `--help` shows (without dashes).
    #[cfg(test)]
    pub fn flag_names() -> Vec<String> {
        Self::command_go()
            .get_arguments()
            .filter(|arg| !arg.is_hide_set())
            .filter_map(Arg::get_long)
            .map(str::to_owned)
            .collect()
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
}

/// Every value given to the merging flag `id`, in order.
fn merged<'a, T: Clone + Send + Sync + 'static>(
    matches: &'a ArgMatches,
    id: &str,
) -> impl Iterator<Item = T> + 'a {
    matches.get_many::<T>(id).into_iter().flatten().cloned()
}

/// Walks Go `flag` syntax, rewriting each flag as `--name=value` for clap.
///
/// Knows from `command` which flags take a value, so `--timeout -1s` keeps
/// `-1s` as the value (Go consumes the next argument whatever it looks like)
/// while a bool flag never consumes the next argument. Stops, as Go does, at
/// an unknown flag, bad syntax, a missing value or help; the arguments before
/// it are returned for clap to check their values, with why it stopped.
fn normalize_args(
    command: &clap::Command,
    args: Vec<OsString>,
    usage: &str,
) -> (Vec<OsString>, Option<ParseError>) {
    let usage = || usage.to_string();
    let stop = |message| {
        Some(ParseError::Usage {
            message,
            usage: usage(),
        })
    };
    let mut out = Vec::with_capacity(args.len() + 1);
    let mut iter = args.into_iter();
    if let Some(program) = iter.next() {
        out.push(program);
    }
    while let Some(arg) = iter.next() {
        let text = arg.to_string_lossy().into_owned();
        if text.starts_with('-') && arg.to_str().is_none() {
            // Go keeps the bytes; every flag here holds text, so say so rather than mangle it.
            return (out, stop(format!("invalid UTF-8 in argument {text:?}")));
        }
        if text.len() < 2 || !text.starts_with('-') || text == "--" {
            // The first non-flag argument, or `--`: Go stops parsing here.
            if text != "--" {
                out.push(OsString::from("--"));
            }
            out.push(arg);
            out.extend(iter);
            break;
        }
        let body = text.strip_prefix("--").unwrap_or(&text[1..]);
        if body.is_empty() || body.starts_with(['-', '=']) {
            return (out, stop(format!("bad flag syntax: {text}")));
        }
        let (name, value) = body
            .split_once('=')
            .map_or((body, None), |(n, v)| (n, Some(v)));
        let flag = command
            .get_arguments()
            .find(|a| a.get_long() == Some(name) && !is_help(a));
        let Some(flag) = flag else {
            if name == "help" || name == "h" {
                return (out, Some(ParseError::Help { usage: usage() }));
            }
            return (out, stop(format!("flag provided but not defined: -{name}")));
        };
        let mut rewritten = OsString::from(format!("--{name}="));
        match value {
            Some(value) => rewritten.push(value),
            // Bools are the only flags declared with require_equals (Go: no `--flag value` form).
            None if flag.is_require_equals_set() => rewritten.push("true"),
            None => match iter.next() {
                Some(next) => rewritten.push(next),
                None => return (out, stop(format!("flag needs an argument: -{name}"))),
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
            let value = go::quote(&value);
            if is_bool {
                format!("invalid boolean value {value} for -{name}: {why}")
            } else {
                format!("invalid value {value} for flag -{name}: {why}")
            }
        }
        _ => err.to_string().trim_end().to_string(),
    };
    ParseError::Usage { message, usage }
}
