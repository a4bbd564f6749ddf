//! The attacher as a non-root user against driver sockets made the way real
//! plugins make them: root-owned with the default umask (refused: explained in
//! the log and the termination message, exit 1 within seconds), and
//! group-writable for the attacher's group (attaches).
//!
//! Needs root, to hand the attacher another uid; without it the tests say so
//! and return.

use crate::support;

use std::os::unix::fs::{chown, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::env::{tail, Env};
use support::procs::{self, Guard};

/// The non-root user of the `-nonroot` image.
const UID: u32 = 65532;
const GID: u32 = 65532;

/// Bound on a refused start: the permission grace plus start-up, far below
/// the 30 s a plain dial timeout would take.
const FAIL_FAST: Duration = Duration::from_secs(15);

/// Whether the attacher can be started under another uid; says why not.
fn can_switch_users() -> bool {
    let root = rustix::process::geteuid().is_root();
    if !root {
        eprintln!("SKIPPED: needs root to run csi-attacher as uid {UID}");
    }
    root
}

/// What a non-root attacher needs: its binary, kubeconfig and termination
/// log where uid 65532 can reach them, and a log file.
struct NonRootAttacher {
    dir: tempfile::TempDir,
    termination_log: PathBuf,
    log: PathBuf,
}

impl NonRootAttacher {
    /// Prepares the files and makes the mock's socket directory traversable.
    fn prepare(env: &Env) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        set_mode(dir.path(), 0o755);
        // The build's target dir may sit under a directory uid 65532 cannot enter.
        let binary = dir.path().join("csi-attacher");
        let built = env!("CARGO_BIN_EXE_csi-attacher");
        if std::fs::hard_link(built, &binary).is_err() {
            std::fs::copy(built, &binary).expect("copy csi-attacher");
        }
        // The control plane's kubeconfig is in a root-only directory; give the
        // user its own copy, as a mounted service-account token would be.
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::copy(&env.cp.kubeconfig, &kubeconfig).expect("copy kubeconfig");
        chown(&kubeconfig, Some(UID), Some(GID)).expect("chown kubeconfig");
        set_mode(&kubeconfig, 0o600);
        // The kubelet makes /dev/termination-log writable for the container's user.
        let termination_log = dir.path().join("termination-log");
        std::fs::write(&termination_log, "").expect("termination log");
        chown(&termination_log, Some(UID), Some(GID)).expect("chown termination log");
        let socket_dir = env.mock.socket.parent().expect("socket dir");
        set_mode(socket_dir, 0o755);
        Self {
            log: dir.path().join("attacher.log"),
            termination_log,
            dir,
        }
    }

    /// Starts the attacher as uid:gid 65532:65532 (no supplementary groups).
    fn spawn(&self, env: &Env) -> Guard {
        let log = std::fs::File::create(&self.log).expect("attacher log");
        let mut command = Command::new(self.dir.path().join("csi-attacher"));
        command
            .uid(UID)
            .gid(GID)
            .arg(format!("--csi-address={}", env.mock.address()))
            .arg(format!(
                "--kubeconfig={}",
                self.dir.path().join("kubeconfig").display()
            ))
            .arg(format!(
                "--termination-log-path={}",
                self.termination_log.display()
            ))
            .arg("--v=2")
            .env("RUST_LOG", "info,csi_attacher=debug")
            .stdout(Stdio::null())
            .stderr(log);
        Guard(Some(procs::spawn(command).expect("start csi-attacher")))
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|err| panic!("chmod {mode:o} {}: {err}", path.display()));
}

#[tokio::test]
async fn root_owned_socket_with_default_umask_fails_fast_naming_owner_mode_and_ways_out() {
    if !can_switch_users() {
        return;
    }
    let env = Env::without_attacher(&[]).await;
    let attacher = NonRootAttacher::prepare(&env);
    // What a root plugin binding with umask 022 leaves behind.
    set_mode(&env.mock.socket, 0o755);

    let started = Instant::now();
    let mut process = attacher.spawn(&env);
    let code = support::eventually("csi-attacher to exit", FAIL_FAST, || {
        let status = process.try_wait().expect("try_wait");
        async move { status.map(|s| s.code()) }
    })
    .await;
    let took = started.elapsed();
    eprintln!("refused attacher exited {code:?} after {took:?}");
    let logs = attacher.logs();
    assert_eq!(code, Some(1), "exit code; log:\n{}", tail(&logs, 20));

    let socket = env.mock.address();
    let expected = format!(
        "permission denied connecting to CSI driver socket {socket} (srwxr-xr-x 0:0) as uid \
         {UID} gid {GID} groups none: connecting needs write permission on the socket. Either \
         run the attacher as the socket's owner (securityContext.runAsUser: 0, as the default \
         image does), or have the driver create the socket writable for the attacher: \
         group-writable (umask 0002) with a group the attacher is in (pod fsGroup, or \
         runAsGroup/supplementalGroups: 0)"
    );
    assert_eq!(
        std::fs::read_to_string(&attacher.termination_log).expect("termination log"),
        expected
    );
    assert!(
        logs.contains(&expected),
        "log lacks the message:\n{}",
        tail(&logs, 20)
    );
    assert!(
        env.mock.ledger().await.is_empty(),
        "no call can have reached the driver"
    );
}

#[tokio::test]
async fn group_writable_socket_lets_the_non_root_attacher_attach() {
    if !can_switch_users() {
        return;
    }
    let mut env = Env::without_attacher(&[]).await;
    let attacher = NonRootAttacher::prepare(&env);
    // A driver with umask 0002 in a pod whose fsGroup is the attacher's group.
    chown(&env.mock.socket, Some(0), Some(GID)).expect("chown socket");
    set_mode(&env.mock.socket, 0o770);
    env.log = attacher.log.clone();

    let started = Instant::now();
    let mut process = attacher.spawn(&env);
    let attachment = env.attached().await;
    eprintln!(
        "non-root attacher attached {} after {:?}",
        attachment.va,
        started.elapsed()
    );
    assert_eq!(
        process.try_wait().expect("try_wait"),
        None,
        "still running; log:\n{}",
        tail(&attacher.logs(), 20)
    );
    assert_eq!(
        env.mock.calls("ControllerPublishVolume").await.len(),
        1,
        "one publish for one VA"
    );
}

#[tokio::test]
async fn socket_made_writable_during_the_grace_is_used() {
    if !can_switch_users() {
        return;
    }
    let mut env = Env::without_attacher(&[]).await;
    let attacher = NonRootAttacher::prepare(&env);
    set_mode(&env.mock.socket, 0o755);
    env.log = attacher.log.clone();

    let mut process = attacher.spawn(&env);
    // A driver that binds first and opens up its socket right after.
    support::eventually("the first refused dial", FAIL_FAST, || {
        let refused = attacher
            .logs()
            .contains("Permission denied connecting to CSI driver socket, retrying briefly");
        async move { refused.then_some(()) }
    })
    .await;
    set_mode(&env.mock.socket, 0o777);

    env.attached().await;
    assert_eq!(
        process.try_wait().expect("try_wait"),
        None,
        "still running; log:\n{}",
        tail(&attacher.logs(), 20)
    );
}
