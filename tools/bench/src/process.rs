//! A running attacher process, and what /proc says about it.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::support::procs::Guard;

/// Upstream's or ours, or the floor attacher ([`crate::floor`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Which {
    Upstream,
    Ours,
    /// Ours' binary with [`SCHEDULE_FIFO`] after its flags (P8's third side).
    OursFifo,
    Floor,
}

/// What turns ours' per-node scheduling off: upstream's first-queued,
/// first-served order (docs/contract.md, "Scheduling driver calls").
pub const SCHEDULE_FIFO: &str = "--schedule-per-node=false";

impl Which {
    pub fn name(self) -> &'static str {
        crate::metric::Side::from(self).key()
    }
}

impl From<Which> for crate::metric::Side {
    fn from(which: Which) -> Self {
        match which {
            Which::Upstream => crate::metric::Side::Upstream,
            Which::Ours => crate::metric::Side::Ours,
            Which::OursFifo => crate::metric::Side::OursFifo,
            Which::Floor => crate::metric::Side::Floor,
        }
    }
}

/// A running attacher process.
pub struct Attacher {
    pub process: Guard,
    /// Its --http-endpoint.
    pub metrics: std::net::SocketAddr,
}

impl Attacher {
    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// SIGTERM, SIGKILL after 30 s; returns once it has exited.
    pub async fn stop(mut self) -> Result<()> {
        self.process.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.process.try_wait()?.is_none() {
            if Instant::now() > deadline {
                self.process.signal(libc::SIGKILL);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// utime + stime so far, in seconds.
    pub fn cpu_seconds(&self) -> Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid()))?;
        // Fields after the parenthesised command name; utime and stime are 14 and 15.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).context("stat")?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |i: usize| -> Result<f64> {
            Ok(fields.get(i).context("short /proc stat")?.parse::<f64>()?)
        };
        let ticks = field(11)? + field(12)?;
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        Ok(ticks / hz)
    }

    /// Peak resident set size so far, in MiB.
    pub fn peak_rss_mib(&self) -> Result<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next())
            .context("VmHWM")?
            .parse()?;
        Ok(kib / 1024.0)
    }
}
