//! Tests of `config`: Go's flag syntax and values, merging, validation and bounds.

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
    assert_eq!(c.attach_gather_window, Duration::ZERO);
    assert_eq!(
        ok(&["--attach-gather-window=1500ms"]).attach_gather_window,
        Duration::from_millis(1500)
    );
    assert_eq!(c.attach_gather_max, Duration::ZERO);
    assert_eq!(
        ok(&["--attach-gather-max=20s"]).attach_gather_max,
        Duration::from_secs(20)
    );
    assert!(c.validate_logging().is_ok());
    let defaults = FeatureGates {
        release_leader_election_on_exit: true,
        mutable_csi_node_allocatable_count: true,
    };
    assert_eq!(c.feature_gates().ok(), Some(defaults));
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
        vec![("timeout".to_string(), "-1s".to_string())]
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
        "attach-gather-window",
        "attach-gather-max",
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
    assert!(
        invalid(&["--log-text-split-stream"]).is_some_and(|e| e.contains("LoggingAlphaOptions"))
    );
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
            crate::gofmt::quantity::QUANTITY_FORMAT
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
        // The usage names the `check` subcommand (main takes it off before parsing).
        let ParseError::Help { usage } = err else {
            panic!("not help: {err:?}")
        };
        assert!(usage.contains("csi-attacher check [OPTIONS]"), "{usage}");
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
        vec![("timeout".to_string(), "-1s".to_string())]
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

/// The backticked `--flag`s of `text` (in order, each once).
fn backticked_flags(text: &str) -> Vec<String> {
    let mut flags: Vec<String> = Vec::new();
    for part in text.split('`').skip(1).step_by(2) {
        let name = part.strip_prefix("--").unwrap_or_default();
        let name = name.split('=').next().unwrap_or_default();
        if !name.is_empty() && !flags.iter().any(|f| f == name) {
            flags.push(name.to_string());
        }
    }
    flags
}

#[test]
fn the_flags_upstream_refuses_are_the_ones_docs_flags_md_and_the_way_back_list() {
    let mut ours: Vec<String> = Config::flag_names()
        .into_iter()
        .filter(|f| !UPSTREAM_FLAGS.split_whitespace().any(|u| u == f))
        .collect();
    ours.sort();
    // Every upstream flag is one of ours (a drop-in takes every flag upstream does).
    let names = Config::flag_names();
    for flag in UPSTREAM_FLAGS.split_whitespace() {
        assert!(names.iter().any(|n| n == flag), "--{flag} missing");
    }
    let flags_md = include_str!("../../docs/flags.md");
    let mut table: Vec<String> = flags_md
        .lines()
        .filter(|l| l.starts_with("| `--"))
        .flat_map(|l| backticked_flags(l.split('|').nth(1).unwrap_or_default()))
        .collect();
    table.sort();
    assert_eq!(table, ours, "docs/flags.md's table against --help");
    let migration = include_str!("../../docs/migration.md");
    let way_back = migration
        .split("## Moving back")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .unwrap_or_default();
    let mut listed = backticked_flags(way_back);
    listed.sort();
    assert_eq!(
        listed, ours,
        "docs/migration.md's Moving back list against --help"
    );
}

#[test]
fn the_flags_given_that_upstream_does_not_define_are_kept_in_help_order() {
    let c = ok(&[
        "--timeout=1m",
        "--output=json",
        "--schedule-per-node=false",
        "-max-inflight-per-node",
        "2",
        "--v=3",
    ]);
    assert_eq!(
        c.not_in_upstream,
        ["max-inflight-per-node", "schedule-per-node", "output"]
    );
    assert!(ok(&["--timeout=1m", "--leader-election"])
        .not_in_upstream
        .is_empty());
}
