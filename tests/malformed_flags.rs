//! Bad command-line values (docs/malformed-inputs.md, "Flags"): every row runs
//! the real binary and checks the exit code and the message on stderr; rows
//! marked `same` also run upstream's Go binary, which must exit the same way.

use crate::support;

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::mock::MockDriver;

fn ours() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_csi-attacher"))
}

fn upstream() -> PathBuf {
    support::controlplane::tools_dir()
        .expect("tools")
        .join("csi-attacher-upstream")
}

/// Runs `binary` with `args`; kills it after `within` (then the code is `None`).
fn run(binary: &Path, args: &[OsString], within: Duration) -> (Option<i32>, String) {
    let mut command = Command::new(binary);
    command
        .args(args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = support::procs::spawn(command).expect("spawn");
    let pipe = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = std::io::Read::read_to_end(&mut pipe, &mut text);
        }
        text
    });
    let mut child = support::procs::Guard(Some(child));
    let deadline = std::time::Instant::now() + within;
    let code = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status.code();
        }
        if std::time::Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(child); // kills it if it still runs, which closes the pipe
    let stderr = reader.join().unwrap_or_default();
    (code, String::from_utf8_lossy(&stderr).into_owned())
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// (row, arguments, exit code, text on stderr, whether upstream exits the same way)
type FlagRow = (&'static str, Vec<OsString>, i32, &'static str, bool);

fn parse_rows() -> Vec<FlagRow> {
    let r = |name, args: &[&str], code, text, same| (name, os(args), code, text, same);
    vec![
        r(
            "duration_not_a_number",
            &["--timeout=abc"],
            2,
            "invalid value \"abc\" for flag -timeout: parse error",
            true,
        ),
        r(
            "duration_empty",
            &["--timeout="],
            2,
            "invalid value \"\" for flag -timeout: parse error",
            true,
        ),
        r(
            "duration_without_unit",
            &["--retry-interval-max=15"],
            2,
            "for flag -retry-interval-max: parse error",
            true,
        ),
        r(
            "duration_exponent_overflow",
            &["--timeout=1e400s"],
            2,
            "invalid value \"1e400s\" for flag -timeout",
            true,
        ),
        r(
            "duration_over_292_years",
            &["--resync=99999999999h"],
            2,
            "invalid value \"99999999999h\" for flag -resync",
            true,
        ),
        r(
            "duration_missing_value",
            &["-timeout"],
            2,
            "flag needs an argument: -timeout",
            true,
        ),
        r(
            "uint_negative",
            &["--worker-threads=-1"],
            2,
            "invalid value \"-1\" for flag -worker-threads: parse error",
            true,
        ),
        r(
            "uint_not_a_number",
            &["--worker-threads=abc"],
            2,
            "invalid value \"abc\" for flag -worker-threads",
            true,
        ),
        r(
            "uint_overflow",
            &["--worker-threads=99999999999999999999999"],
            2,
            "value out of range",
            true,
        ),
        r(
            "uint_zero_workers",
            &["--worker-threads=0"],
            1,
            "Option -worker-threads must be greater than zero",
            false,
        ),
        r(
            "float_not_a_number",
            &["--kube-api-qps=abc"],
            2,
            "invalid value \"abc\" for flag -kube-api-qps",
            true,
        ),
        r(
            "int_with_fraction",
            &["--kube-api-burst=1.5"],
            2,
            "invalid value \"1.5\" for flag -kube-api-burst",
            true,
        ),
        r(
            "int_not_a_number",
            &["--max-entries=abc"],
            2,
            "invalid value \"abc\" for flag -max-entries",
            true,
        ),
        r(
            "verbosity_negative",
            &["--v=-1"],
            2,
            "strconv.ParseUint: parsing \"-1\": invalid syntax",
            true,
        ),
        r(
            "verbosity_not_a_number",
            &["--v=abc"],
            2,
            "invalid value \"abc\" for flag -v",
            true,
        ),
        r(
            "log_format_unknown",
            &["--logging-format=xml"],
            1,
            "Unsupported log format",
            true,
        ),
        r(
            "bool_not_a_bool",
            &["--leader-election=maybe"],
            2,
            "invalid boolean value \"maybe\" for -leader-election",
            true,
        ),
        r(
            "bool_func_not_a_bool",
            &["--automaxprocs=maybe"],
            2,
            "invalid boolean value \"maybe\" for -automaxprocs",
            true,
        ),
        r(
            "labels_item_without_colon",
            &["--leader-election-labels=bad"],
            2,
            "malformed item in list of labels: bad",
            true,
        ),
        r(
            "vmodule_without_level",
            &["--vmodule=bad"],
            2,
            "\"bad\" does not have the pattern=N format",
            true,
        ),
        r(
            "quantity_not_a_quantity",
            &["--log-text-info-buffer-size=abc"],
            2,
            "quantities must match the regular expression",
            true,
        ),
        r(
            "alpha_logging_option",
            &["--log-text-split-stream=true"],
            1,
            "Feature LoggingAlphaOptions is disabled",
            true,
        ),
        r(
            "alpha_logging_buffer",
            &["--log-json-info-buffer-size=1Mi"],
            1,
            "Feature LoggingAlphaOptions is disabled",
            true,
        ),
        r(
            "feature_gate_unknown",
            &["--feature-gates=NoSuchGate=true"],
            1,
            "unrecognized feature gate: NoSuchGate",
            true,
        ),
        r(
            "feature_gate_not_a_pair",
            &["--feature-gates=Foo"],
            2,
            "malformed pair, expect string=bool",
            true,
        ),
        r(
            "unknown_flag",
            &["--no-such-flag=1"],
            2,
            "flag provided but not defined: -no-such-flag",
            true,
        ),
        r(
            "three_dashes",
            &["---timeout=1s"],
            2,
            "bad flag syntax: ---timeout=1s",
            true,
        ),
        r(
            "metrics_address_and_http_endpoint",
            &[
                "--metrics-address=127.0.0.1:0",
                "--http-endpoint=127.0.0.1:0",
            ],
            1,
            "only one of `--metrics-address` and `--http-endpoint` can be set",
            false,
        ),
        r(
            "kubeconfig_missing_file",
            &["--csi-address=/nonexistent/sock"],
            1,
            "cannot use kubeconfig",
            false,
        ),
        // Upstream accepts these at parse time and breaks later (spins, or goes on to the kubeconfig).
        r(
            "negative_retry_interval",
            &["--retry-interval-start=-1s"],
            1,
            "invalid --retry-interval-start=-1s: the duration must not be negative",
            false,
        ),
        r(
            "negative_resync",
            &["--resync=-5m"],
            1,
            "invalid --resync=-5m: the duration must not be negative",
            false,
        ),
        r(
            "lease_duration_below_renew_deadline",
            &["--leader-election", "--leader-election-lease-duration=1s"],
            // Upstream panics on it (exit 2), after loading its kubeconfig.
            2,
            "leaseDuration must be greater than renewDeadline",
            false,
        ),
        r(
            "csi_address_relative",
            &["--csi-address=relative/sock"],
            1,
            "expected an absolute socket path",
            false,
        ),
        r(
            "csi_address_empty",
            &["--csi-address="],
            1,
            "the socket path is empty",
            false,
        ),
        r(
            "csi_address_tcp",
            &["--csi-address=tcp://127.0.0.1:5"],
            1,
            "only unix:// addresses are supported",
            false,
        ),
        (
            "argument_not_utf8",
            vec![OsString::from_vec(b"--default-fstype=\xff\xfe".to_vec())],
            2,
            "invalid UTF-8 in argument",
            false,
        ),
    ]
}

#[test]
fn bad_flag_values_exit_with_a_clear_message() {
    let upstream = upstream();
    for (name, args, code, text, same) in parse_rows() {
        let mut all = os(&["--kubeconfig=/nonexistent/kubeconfig"]);
        all.extend(args.iter().cloned());
        // Ours checks the values before the kubeconfig; the missing kubeconfig stops the rest.
        let (got, stderr) = run(&ours(), &all, Duration::from_secs(10));
        assert_eq!(got, Some(code), "{name}: exit code; stderr: {stderr}");
        assert!(
            stderr.contains(text),
            "{name}: stderr lacks {text:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{name}: {stderr}");
        if same {
            let (theirs, their_stderr) = run(&upstream, &all, Duration::from_secs(10));
            assert_eq!(
                theirs,
                Some(code),
                "{name}: upstream exit code; stderr: {their_stderr}"
            );
            assert!(
                their_stderr.contains(text),
                "{name}: upstream stderr: {their_stderr}"
            );
        }
    }
}

/// Values only found bad once the process runs: the driver answers, the API is reachable.
#[tokio::test]
async fn bad_values_found_at_startup_exit_1_with_the_reason() {
    let mock = MockDriver::start(&[]).expect("mock");
    let kubeconfig = &support::controlplane::shared().kubeconfig;
    let base = [
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--csi-address={}", mock.address()),
    ];
    // (row, flag, text on stderr; upstream also exits 1)
    let rows = [
        (
            "http_endpoint_not_an_address",
            "--http-endpoint=garbage",
            "cannot listen on garbage",
        ),
        (
            "http_endpoint_port_out_of_range",
            "--http-endpoint=127.0.0.1:99999",
            "cannot listen on 127.0.0.1:99999",
        ),
        (
            "http_endpoint_address_not_local",
            "--http-endpoint=192.0.2.1:8080",
            "cannot listen on 192.0.2.1:8080",
        ),
    ];
    for (name, flag, text) in rows {
        let mut args: Vec<OsString> = base.iter().map(OsString::from).collect();
        args.push(flag.into());
        let (code, stderr) = run(&ours(), &args, Duration::from_secs(15));
        assert_eq!(code, Some(1), "{name}: {stderr}");
        assert!(stderr.contains(text), "{name}: {stderr}");
        let (theirs, their_stderr) = run(&upstream(), &args, Duration::from_secs(15));
        assert_eq!(theirs, Some(1), "{name}: upstream: {their_stderr}");
    }
    // The port is taken: both exit 1.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let mut args: Vec<OsString> = base.iter().map(OsString::from).collect();
    args.push(format!("--http-endpoint={}", taken.local_addr().expect("addr")).into());
    let (code, stderr) = run(&ours(), &args, Duration::from_secs(15));
    assert_eq!(code, Some(1), "http_endpoint_port_in_use: {stderr}");
    assert!(
        stderr.contains("Address already in use"),
        "http_endpoint_port_in_use: {stderr}"
    );
}

/// Upstream panics on a metrics path without a leading `/` (its ServeMux refuses
/// the pattern); ours must not start serving a path nothing can request.
#[tokio::test]
async fn a_metrics_path_without_a_slash_is_refused() {
    let mock = MockDriver::start(&[]).expect("mock");
    let kubeconfig = &support::controlplane::shared().kubeconfig;
    let args: Vec<OsString> = [
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--csi-address={}", mock.address()),
        "--http-endpoint=127.0.0.1:0".to_string(),
        "--metrics-path=nopath".to_string(),
    ]
    .iter()
    .map(OsString::from)
    .collect();
    let (code, stderr) = run(&ours(), &args, Duration::from_secs(10));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("metrics-path"), "{stderr}");
}
