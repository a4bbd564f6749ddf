//! The `csi-attacher` binary as a process: exit codes, flags, and what it does
//! when the driver goes away.

mod support;

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
        exit_code(&mut process, Duration::from_secs(10)).await,
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
        exit_code(&mut process, Duration::from_secs(10)).await,
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
        exit_code(&mut process, Duration::from_secs(10)).await,
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
        exit_code(&mut process, Duration::from_secs(10)).await,
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
    assert!(
        stdout.trim_end().ends_with(env!("CARGO_PKG_VERSION")),
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
