//! Taking the control plane away under a running attacher (P7):
//! kube-apiserver SIGKILLed and started again with its own command line (same
//! etcd, flags, port and certificates), etcd SIGSTOPped and SIGCONTed; and the
//! API server's readiness as `/readyz` says it.
//!
//! The control plane is the tests' (`tests/support/controlplane.rs`), which
//! keeps its processes to itself: they are found as this process's children
//! by command name, and a restarted kube-apiserver runs the command line read
//! from `/proc/<pid>/cmdline` of the one it replaces.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::procstat::parse_stat;
use crate::support::procs::{self, Guard};

/// How often readiness is polled.
pub const POLL: Duration = Duration::from_millis(20);

/// The kube-apiserver this harness started in place of the control plane's,
/// once it has restarted one.
static RESTARTED: Mutex<Option<Guard>> = Mutex::new(None);

/// The live (not zombie) child of this process whose command name starts
/// with `comm` (the kernel keeps 15 characters of it).
pub fn child(comm: &str) -> Result<u32> {
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if let Some((name, state, ppid)) = parse_stat(&stat) {
            if ppid == me && state != 'Z' && name.starts_with(comm) {
                found.push(pid);
            }
        }
    }
    match found.as_slice() {
        [pid] => Ok(*pid),
        [] => bail!("no child process {comm} of this process"),
        many => bail!("several child processes {comm}: {many:?}"),
    }
}

/// Whether `pid` has exited (gone, or a zombie nobody reaped).
fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| parse_stat(&s))
        .is_none_or(|(_, state, _)| state == 'Z' || state == 'X')
}

fn signal(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) on a child of this process.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

/// `/readyz` answered "ok" within a second.
pub async fn ready(client: &kube::Client) -> bool {
    let Ok(request) = http::Request::get("/readyz").body(Vec::new()) else {
        return false;
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), client.request_text(request)).await,
        Ok(Ok(body)) if body.trim() == "ok"
    )
}

/// Polls `/readyz` every [`POLL`] until it is ready; the moment it was.
pub async fn wait_ready(client: &kube::Client, timeout: Duration) -> Result<Instant> {
    let until = Instant::now() + timeout;
    loop {
        if ready(client).await {
            return Ok(Instant::now());
        }
        if Instant::now() > until {
            bail!("kube-apiserver not ready {timeout:?} after the outage");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// SIGKILLs kube-apiserver, leaves it down for `down`, starts it again with
/// the same command line (its log appended to `log`), and returns once it is
/// ready: the moment it was.
pub async fn restart_apiserver(
    client: &kube::Client,
    down: Duration,
    log: PathBuf,
) -> Result<Instant> {
    let pid = child("kube-apiserver")?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .skip(1)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    signal(pid, libc::SIGKILL);
    let previous = RESTARTED.lock().unwrap_or_else(|e| e.into_inner()).take();
    match previous {
        // Ours: reap it.
        Some(mut guard) if guard.id() == pid => {
            guard.wait()?;
        }
        other => {
            drop(other);
            let until = Instant::now() + Duration::from_secs(10);
            while !exited(pid) {
                if Instant::now() > until {
                    bail!("kube-apiserver (pid {pid}) still running 10 s after SIGKILL");
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    tokio::time::sleep(down).await;
    // Its port may stay taken a moment after it is gone (sockets closing):
    // starting before it is free fails with "address already in use".
    if let Some(port) = args
        .iter()
        .find_map(|a| a.strip_prefix("--secure-port="))
        .and_then(|p| p.parse::<u16>().ok())
    {
        let until = Instant::now() + Duration::from_secs(60);
        while std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            if Instant::now() > until {
                bail!("port {port} of kube-apiserver still taken 60 s after SIGKILL");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)?;
    writeln!(file, "--- restarted by the benchmark (P7, cost) ---")?;
    let mut command = Command::new(&exe);
    command.args(&args).stdout(file.try_clone()?).stderr(file);
    let guard = Guard(Some(
        procs::spawn(command).with_context(|| format!("restarting {}", exe.display()))?,
    ));
    *RESTARTED.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard);
    wait_ready(client, Duration::from_secs(120)).await
}

/// SIGCONTs etcd when dropped: a failed or panicking stall never leaves it stopped.
struct Resume(u32);

impl Drop for Resume {
    fn drop(&mut self) {
        signal(self.0, libc::SIGCONT);
    }
}

/// What an etcd stall looked like from the API server's `/readyz`.
pub struct Stall {
    /// The first ready `/readyz` after SIGCONT.
    pub ready: Instant,
    /// SIGCONT.
    pub resumed: Instant,
    /// Whether `/readyz` failed (or timed out) during the stall.
    pub seen_unready: bool,
}

/// SIGSTOPs etcd for `down` while polling `/readyz`, SIGCONTs it, then polls
/// until ready again.
pub async fn stall_etcd(client: &kube::Client, down: Duration) -> Result<Stall> {
    let pid = child("etcd")?;
    let resume = Resume(pid);
    signal(pid, libc::SIGSTOP);
    let until = Instant::now() + down;
    let mut seen_unready = false;
    while Instant::now() < until {
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ready(client)).await {
            Ok(true) => {}
            Ok(false) => seen_unready = true,
            Err(_) => break,
        }
        tokio::time::sleep(POLL.min(until.saturating_duration_since(Instant::now()))).await;
    }
    drop(resume);
    let resumed = Instant::now();
    let ready = wait_ready(client, Duration::from_secs(120)).await?;
    Ok(Stall {
        ready,
        resumed,
        seen_unready,
    })
}
