//! The `csi-attacher` binary as a process: exit codes, flags, and what it does
//! when the driver goes away.

use crate::support;

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;

use support::mock::MockDriver;
use support::procs::{self, Guard};

fn attacher(args: &[String]) -> Guard {
    let kubeconfig = &support::controlplane::shared().kubeconfig;
    let mut command = Command::new(env!("CARGO_BIN_EXE_csi-attacher"));
    command
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    Guard(Some(procs::spawn(command).expect("start csi-attacher")))
}

/// The process's exit code once it exits within `within`. The tests' subject
/// is the code, not the speed (benchmark P5 measures that): callers allow 30 s,
/// which a loaded CI machine needs (a SIGTERM exit took over 10 s beside two
/// builds on 2 cores).
async fn exit_code(process: &mut Guard, within: Duration) -> Option<i32> {
    support::eventually("csi-attacher to exit", within, || {
        let status = process.try_wait().expect("try_wait");
        async move { status.map(|s| s.code()) }
    })
    .await
}

#[tokio::test]
async fn killing_the_driver_writes_the_termination_message_and_exits_1() {
    let mock = MockDriver::start(&[]).expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let termination_log = dir.path().join("termination-log");
    let mut process = attacher(&[
        format!("-csi-address={}", mock.address()),
        format!("--termination-log-path={}", termination_log.display()),
    ]);
    support::eventually(
        "startup calls to reach the driver",
        Duration::from_secs(10),
        || async { (!mock.calls("ControllerGetCapabilities").await.is_empty()).then_some(()) },
    )
    .await;
    assert_eq!(
        process.try_wait().expect("try_wait"),
        None,
        "runs while the driver is up"
    );

    mock.process.signal(libc::SIGKILL);
    assert_eq!(
        exit_code(&mut process, Duration::from_secs(30)).await,
        Some(1)
    );
    assert_eq!(
        std::fs::read_to_string(&termination_log).expect("termination log"),
        "Lost connection to CSI driver, exiting"
    );
}

#[tokio::test]
async fn a_driver_crash_during_the_probe_loop_is_a_lost_connection() {
    let mock = MockDriver::start(&["--start-unready"]).expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let termination_log = dir.path().join("termination-log");
    let mut process = attacher(&[
        format!("--csi-address=unix://{}", mock.address()),
        format!("--termination-log-path={}", termination_log.display()),
    ]);
    support::eventually("the first probe", Duration::from_secs(10), || async {
        (!mock.calls("Probe").await.is_empty()).then_some(())
    })
    .await;
    mock.set_fault("Probe", json!({"exit": true})).await;
    assert_eq!(
        exit_code(&mut process, Duration::from_secs(30)).await,
        Some(1)
    );
    assert_eq!(
        std::fs::read_to_string(&termination_log).expect("termination log"),
        "Lost connection to CSI driver, exiting"
    );
}

#[tokio::test]
async fn sigterm_exits_0() {
    let mock = MockDriver::start(&[]).expect("mock");
    let mut process = attacher(&[format!("--csi-address={}", mock.address())]);
    support::eventually(
        "startup calls to reach the driver",
        Duration::from_secs(10),
        || async { (!mock.calls("ControllerGetCapabilities").await.is_empty()).then_some(()) },
    )
    .await;
    process.signal(libc::SIGTERM);
    assert_eq!(
        exit_code(&mut process, Duration::from_secs(30)).await,
        Some(0)
    );
}

#[tokio::test]
async fn a_fatal_probe_error_exits_1() {
    let mock = MockDriver::start(&[]).expect("mock");
    mock.set_fault("Probe", json!({"code": "PermissionDenied"}))
        .await;
    let mut process = attacher(&[format!("--csi-address={}", mock.address())]);
    assert_eq!(
        exit_code(&mut process, Duration::from_secs(30)).await,
        Some(1)
    );
}

#[tokio::test]
async fn flag_errors_help_and_version_exit_like_go() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_csi-attacher"))
            .args(args)
            .output()
            .expect("run csi-attacher")
    };
    let unknown = run(&["--no-such-flag"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no-such-flag"));

    assert_eq!(run(&["-h"]).status.code(), Some(0));
    assert_eq!(run(&["--help"]).status.code(), Some(0));

    let version = run(&["-version"]);
    assert_eq!(version.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&version.stdout);
    assert!(
        stdout.starts_with(env!("CARGO_BIN_EXE_csi-attacher")),
        "{stdout}"
    );
    // Upstream's `<argv0> <version>`, then the build (tests/release.rs).
    assert_eq!(
        stdout.split_whitespace().nth(1),
        Some(env!("CARGO_PKG_VERSION")),
        "{stdout}"
    );

    let bad_address = run(&["--csi-address=tcp://127.0.0.1:1"]);
    assert_eq!(bad_address.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad_address.stderr).contains("invalid CSI address"));

    assert_eq!(
        run(&["--timeout=15"]).status.code(),
        Some(2),
        "Go rejects unit-less durations"
    );

    let no_workers = run(&["--worker-threads=0", "--csi-address=/nonexistent/socket"]);
    assert_eq!(no_workers.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&no_workers.stderr)
        .contains("Option -worker-threads must be greater than zero"));

    let bad_kubeconfig = run(&[
        "--kubeconfig=/nonexistent/kubeconfig",
        "--csi-address=/nonexistent/socket",
    ]);
    assert_eq!(bad_kubeconfig.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad_kubeconfig.stderr).contains("cannot use kubeconfig"));
}

/// A container spec as overlays leave it: flags repeated, later ones meant to win.
const REPEATED: &[&str] = &[
    "--v=2",
    "--timeout=60s",
    "--feature-gates=ReleaseLeaderElectionOnExit=true",
    "--leader-election-labels=app:csi",
    "--worker-threads=0x10",
    "--kube-api-qps=20",
    "--kube-api-burst=40",
    "--automaxprocs",
    "--v=5",
    "-timeout",
    "90s",
    "--feature-gates=MutableCSINodeAllocatableCount=false,AllBeta=true",
    "--leader-election-labels=tier:storage,app:csi-attacher",
    "--kube-api-qps=30",
];

/// Exit code and stderr of `binary` run on `REPEATED` plus `extra`.
fn run_flags(binary: &std::path::Path, extra: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(binary)
        .args(REPEATED)
        .args(extra)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("run");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn repeated_flags_and_feature_gates_exit_like_the_go_attacher() {
    let ours = std::path::Path::new(env!("CARGO_BIN_EXE_csi-attacher"));
    let upstream = support::controlplane::tools_dir()
        .expect("tools")
        .join("csi-attacher-upstream");
    assert!(
        upstream.exists(),
        "{} is built with the tools",
        upstream.display()
    );
    // (extra arguments, exit code measured on upstream v4.12.0, text both print)
    let cases: &[(&[&str], i32, &str)] = &[
        (&["--version"], 0, ""),
        (
            &["--feature-gates=NoSuchGate=true", "--version"],
            1,
            "unrecognized feature gate: NoSuchGate",
        ),
        (
            &["--feature-gates=APIServerTracing=false", "--version"],
            1,
            "cannot set feature gate APIServerTracing to false, feature is locked to true",
        ),
        (&["--feature-gates=APIServerTracing=true,KMSv1=true", "--version"], 0, ""),
        (
            &["--feature-gates=Foo", "--version"],
            2,
            "invalid value \"Foo\" for flag -feature-gates: malformed pair, expect string=bool",
        ),
        (
            &["--leader-election-labels=a:1,,b:2", "--version"],
            2,
            "invalid value \"a:1,,b:2\" for flag -leader-election-labels: malformed item in list of labels: ",
        ),
        (
            &["--timeout=-1s", "--v=0x10"],
            2,
            "invalid value \"0x10\" for flag -v: strconv.ParseUint: parsing \"0x10\": invalid syntax",
        ),
        (
            &["--log-flush-frequency=0", "--version"],
            1,
            "Must be greater than zero",
        ),
    ];
    for (extra, code, text) in cases {
        for binary in [ours, upstream.as_path()] {
            let (got, stderr) = run_flags(binary, extra);
            assert_eq!(got, Some(*code), "{} {extra:?}: {stderr}", binary.display());
            assert!(
                stderr.contains(text),
                "{} {extra:?}: {stderr}",
                binary.display()
            );
        }
    }

    // A relative unix:// address: gRPC-Go refuses it before dialling (the Go attacher
    // first needs a kubeconfig it can read; nothing is contacted).
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\n\
         clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n\
         users: [{name: u, user: {token: t}}]\n\
         contexts: [{name: x, context: {cluster: c, user: u}}]\n\
         current-context: x\n",
    )
    .expect("kubeconfig");
    let kubeconfig_flag = format!("--kubeconfig={}", kubeconfig.display());
    for binary in [ours, upstream.as_path()] {
        let (got, stderr) = run_flags(binary, &[&kubeconfig_flag, "--csi-address=unix://csi.sock"]);
        assert_eq!(got, Some(1), "{}: {stderr}", binary.display());
        assert!(
            stderr.contains("authority"),
            "{}: {stderr}",
            binary.display()
        );
    }
}

#[tokio::test]
async fn an_attacher_started_with_repeated_flags_runs() {
    let mock = MockDriver::start(&[]).expect("mock");
    let mut args: Vec<String> = REPEATED.iter().map(|a| a.to_string()).collect();
    args.push(format!("--csi-address={}", mock.address()));
    let mut process = attacher(&args);
    support::eventually(
        "startup calls to reach the driver",
        Duration::from_secs(10),
        || async { (!mock.calls("ControllerGetCapabilities").await.is_empty()).then_some(()) },
    )
    .await;
    assert_eq!(process.try_wait().expect("try_wait"), None, "still running");
    process.signal(libc::SIGTERM);
    assert_eq!(
        exit_code(&mut process, Duration::from_secs(30)).await,
        Some(0)
    );
}

/// Runs `binary` with `args` and a kubeconfig/driver that lead nowhere, for at
/// most `within`: `Some(code)` if it exited, `None` if it was still running
/// (it got past flag validation and is dialling the driver), and its stderr.
fn run_bounded(
    binary: &std::path::Path,
    kubeconfig: &std::path::Path,
    args: &[&str],
    within: Duration,
) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let stderr_path = dir.path().join("stderr");
    let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
    let mut command = Command::new(binary);
    command
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--csi-address=/nonexistent/csi.sock")
        .args(args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(Stdio::null())
        .stderr(stderr);
    let mut process = Guard(Some(procs::spawn(command).expect("spawn")));
    let deadline = std::time::Instant::now() + within;
    let code = loop {
        if let Some(status) = process.try_wait().expect("try_wait") {
            break status.code();
        }
        if std::time::Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(process);
    (
        code,
        std::fs::read_to_string(&stderr_path).unwrap_or_default(),
    )
}

/// Zero and absurd durations and counts: what upstream refuses is refused the
/// same way (exit code and text); what it accepts starts here too, with the
/// values that would spin raised and a warning saying so.
#[test]
fn zero_and_absurd_values_are_refused_or_raised_like_upstream_accepts_them() {
    let ours = std::path::Path::new(env!("CARGO_BIN_EXE_csi-attacher"));
    let upstream = support::controlplane::tools_dir()
        .expect("tools")
        .join("csi-attacher-upstream");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\n\
         clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n\
         users: [{name: u, user: {token: t}}]\n\
         contexts: [{name: x, context: {cluster: c, user: u}}]\n\
         current-context: x\n",
    )
    .expect("kubeconfig");
    let within = Duration::from_secs(3);

    // Refused by upstream v4.12.0 (measured): exit code and the text both print.
    let refused: &[(&[&str], i32, &str)] = &[
        (
            &["--worker-threads=0"],
            1,
            "Option -worker-threads must be greater than zero",
        ),
        (
            &["--timeout=2562048h"],
            2,
            "invalid value \"2562048h\" for flag -timeout",
        ),
        (
            &["--worker-threads=18446744073709551616"],
            2,
            "invalid value \"18446744073709551616\" for flag -worker-threads",
        ),
    ];
    for (args, code, text) in refused {
        for binary in [ours, upstream.as_path()] {
            let (got, stderr) = run_bounded(binary, &kubeconfig, args, within);
            assert_eq!(got, Some(*code), "{} {args:?}: {stderr}", binary.display());
            assert!(
                stderr.contains(text),
                "{} {args:?}: {stderr}",
                binary.display()
            );
        }
    }

    // Accepted by upstream (it runs on, dialling the driver); ours too, and
    // the flag that would spin is named in a warning.
    let accepted: &[(&[&str], Option<&str>)] = &[
        (&["--timeout=0"], Some("flag=\"timeout\"")),
        (
            &["--retry-interval-start=0"],
            Some("flag=\"retry-interval-start\""),
        ),
        (
            &["--retry-interval-max=0"],
            Some("flag=\"retry-interval-max\""),
        ),
        (&["--reconcile-sync=0"], Some("flag=\"reconcile-sync\"")),
        (&["--resync=1ms"], Some("flag=\"resync\"")),
        (
            &["--worker-threads=100000000"],
            Some("flag=\"worker-threads\""),
        ),
        (
            &["--retry-interval-start=10s", "--retry-interval-max=1s"],
            Some("--retry-interval-max is below --retry-interval-start"),
        ),
        (&["--resync=0"], None),
        (&["--timeout=2562047h", "--reconcile-sync=2562047h"], None),
        (&["--retry-interval-max=2562047h"], None),
    ];
    // Each run waits `within`: run them side by side.
    let runs: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = accepted
            .iter()
            .flat_map(|(args, warning)| {
                [ours, upstream.as_path()].map(|binary| {
                    let kubeconfig = &kubeconfig;
                    scope.spawn(move || {
                        let (got, stderr) = run_bounded(binary, kubeconfig, args, within);
                        (binary, *args, *warning, got, stderr)
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("run"))
            .collect()
    });
    for (binary, args, warning, got, stderr) in runs {
        {
            assert_eq!(got, None, "{} {args:?} exited: {stderr}", binary.display());
            if binary == ours {
                match warning {
                    Some(text) => assert!(stderr.contains(text), "{args:?}: {stderr}"),
                    None => assert!(!stderr.contains("out of range"), "{args:?}: {stderr}"),
                }
            }
        }
    }
}

#[test]
fn attach_gather_flags_of_no_effect_are_said_at_start() {
    // The warnings come before the kubeconfig is read; the run then ends
    // (exit 1: no such kubeconfig).
    let run = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_csi-attacher"))
            .arg("--kubeconfig=/nonexistent/kubeconfig")
            .args(args)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .expect("run csi-attacher");
        assert_eq!(output.status.code(), Some(1));
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let said = "--attach-gather-window needs --schedule-per-node";
    let off = run(&["--attach-gather-window=1s", "--schedule-per-node=false"]);
    assert!(off.contains(said), "{off}");
    let on = run(&["--attach-gather-window=1s"]);
    assert!(!on.contains(said), "{on}");
    let said = "--attach-gather-max needs --attach-gather-window";
    let no_window = run(&["--attach-gather-max=10s"]);
    assert!(no_window.contains(said), "{no_window}");
    let window = run(&["--attach-gather-window=1s", "--attach-gather-max=10s"]);
    assert!(!window.contains(said), "{window}");
}
