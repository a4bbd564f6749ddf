//! Child processes that cannot outlive the test process.
//!
//! Children are spawned from one long-lived thread with `PR_SET_PDEATHSIG`, so
//! the kernel kills them if the test process dies (the signal follows the
//! spawning *thread*, hence the dedicated thread). On a normal exit, an
//! `atexit` hook kills what is still registered and removes registered dirs.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock, PoisonError};

type Request = (Command, mpsc::Sender<std::io::Result<Child>>);

struct Registry {
    pids: Vec<u32>,
    dirs: Vec<PathBuf>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    pids: Vec::new(),
    dirs: Vec::new(),
});
static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();

extern "C" fn cleanup_at_exit() {
    let registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    for pid in &registry.pids {
        // SAFETY: kill(2) with a pid we spawned; a stale pid at worst gets ESRCH.
        unsafe {
            libc::kill(*pid as libc::pid_t, libc::SIGKILL);
        }
    }
    for dir in &registry.dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn spawner() -> &'static Mutex<mpsc::Sender<Request>> {
    SPAWNER.get_or_init(|| {
        // SAFETY: registering a plain extern "C" fn that only does signal-safe-ish cleanup.
        unsafe {
            libc::atexit(cleanup_at_exit);
        }
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("child-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    // SAFETY: prctl is async-signal-safe and only affects the child.
                    unsafe {
                        command.pre_exec(|| {
                            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                            Ok(())
                        });
                    }
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("spawn the child-spawner thread");
        Mutex::new(tx)
    })
}

/// Spawns `command`; the child dies with the test process at the latest.
pub fn spawn(command: Command) -> std::io::Result<Child> {
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .send((command, reply_tx))
        .map_err(|_| std::io::Error::other("spawner thread is gone"))?;
    let child = reply_rx
        .recv()
        .map_err(|_| std::io::Error::other("spawner thread is gone"))??;
    REGISTRY
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pids
        .push(child.id());
    Ok(child)
}

/// Removes `dir` when the test process exits.
pub fn remove_at_exit(dir: PathBuf) {
    let _ = spawner();
    REGISTRY
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .dirs
        .push(dir);
}

/// Takes `dir` off the list [`remove_at_exit`] made: it stays.
pub fn keep_at_exit(dir: &std::path::Path) {
    REGISTRY
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .dirs
        .retain(|d| d != dir);
}

/// Forgets a pid that its owner has reaped.
pub fn forget(pid: u32) {
    REGISTRY
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pids
        .retain(|p| *p != pid);
}

/// A child that is killed and reaped when dropped.
pub struct Guard(pub Option<Child>);

impl Guard {
    /// The child's pid.
    pub fn id(&self) -> u32 {
        self.0.as_ref().map(Child::id).unwrap_or_default()
    }

    /// Sends `signal` to the child.
    pub fn signal(&self, signal: libc::c_int) {
        if let Some(child) = &self.0 {
            // SAFETY: kill(2) on our own child's pid.
            unsafe {
                libc::kill(child.id() as libc::pid_t, signal);
            }
        }
    }

    /// Waits for the child to exit (blocking) and returns its status.
    pub fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        let Some(child) = self.0.as_mut() else {
            return Err(std::io::Error::other("already reaped"));
        };
        let status = child.wait()?;
        forget(child.id());
        self.0 = None;
        Ok(status)
    }

    /// Polls for exit without blocking.
    pub fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        let Some(child) = self.0.as_mut() else {
            return Err(std::io::Error::other("already reaped"));
        };
        let status = child.try_wait()?;
        if status.is_some() {
            forget(child.id());
            self.0 = None;
        }
        Ok(status)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
            forget(child.id());
        }
    }
}
