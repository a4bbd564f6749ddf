//! P8's floor, its pure parts: the calls, the limits they are made within,
//! and which to make next ([`crate::scenarios`]' P8 floor runs them; see
//! there).

use std::collections::VecDeque;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::time::Instant;

/// One driver call of a volume's chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// `fresh_pv`: the PV does not carry the attacher's finalizer yet (a new
    /// volume's; a moved volume's PV kept it from its first attach).
    Publish {
        volume: String,
        node: String,
        fresh_pv: bool,
    },
    Unpublish {
        volume: String,
        node: String,
    },
}

impl Call {
    /// The API writes an attacher must make before the call: the VA's
    /// finalizer (the VA must not go away unseen once the volume may be
    /// attached), and the PV's when it has none (nor the PV while attached).
    pub fn writes_before(&self) -> u32 {
        match self {
            Call::Publish { fresh_pv, .. } => 1 + u32::from(*fresh_pv),
            Call::Unpublish { .. } => 0,
        }
    }

    /// The API write an attacher must make after the call succeeds, and
    /// whether it is the urgent one: `attached=true` after Publish (ahead
    /// of other writes at ours' throttle), the finalizer's removal after
    /// Unpublish.
    pub fn write_after_is_urgent(&self) -> bool {
        matches!(self, Call::Publish { .. })
    }
}

/// The run's limits on calls in flight, each call's deadline, and the
/// client-side throttle on API writes (`--kube-api-qps`, `--kube-api-burst`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    pub workers: usize,
    pub timeout: Duration,
    pub qps: f64,
    pub burst: i64,
}

impl Limits {
    /// From the attacher's flags (upstream's defaults where they are not
    /// set).
    pub fn of(args: &[String]) -> Result<Self> {
        let flag = |name: &str| {
            args.iter()
                .rev()
                .find_map(|a| a.strip_prefix(name)?.strip_prefix('='))
        };
        let workers = flag("--worker-threads")
            .map(str::parse)
            .transpose()
            .context("--worker-threads")?
            .unwrap_or(10);
        let timeout = match flag("--timeout") {
            Some(v) => {
                let ns = csi_attacher::gofmt::parse::parse_duration(v)
                    .map_err(anyhow::Error::msg)
                    .context("--timeout")?;
                Duration::from_nanos(u64::try_from(ns).context("--timeout")?)
            }
            None => Duration::from_secs(15),
        };
        let qps = flag("--kube-api-qps")
            .map(str::parse)
            .transpose()
            .context("--kube-api-qps")?
            .unwrap_or(5.0);
        let burst = flag("--kube-api-burst")
            .map(str::parse)
            .transpose()
            .context("--kube-api-burst")?
            .unwrap_or(10);
        Ok(Limits {
            workers: workers.max(1),
            timeout,
            qps,
            burst,
        })
    }
}

/// A chain's next call, and when it may be made.
pub struct Next {
    pub chain: usize,
    pub step: usize,
    pub not_before: Instant,
}

/// Which queued calls to make now (indices into `queue`, ascending): in
/// queue order, those due, while workers are free. No limit per node: a
/// driver that serializes a node queues the calls itself, and one that
/// abandons a call at its deadline lets the next start while the cloud goes
/// on with the first (serial-per-node: attachers that keep a node's calls
/// queued finished a scale-up in 47-62 s where one call per node at a time
/// took 86 s).
pub fn pick(queue: &VecDeque<Next>, workers: usize, now: Instant) -> Vec<usize> {
    queue
        .iter()
        .enumerate()
        .filter(|(_, next)| next.not_before <= now)
        .map(|(i, _)| i)
        .take(workers)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(volume: &str, node: &str) -> Call {
        Call::Publish {
            volume: volume.into(),
            node: node.into(),
            fresh_pv: true,
        }
    }

    #[test]
    fn limits_come_from_the_flags() {
        let args: Vec<String> = ["--worker-threads=100", "--timeout=6m", "--kube-api-qps=20"]
            .map(String::from)
            .into();
        let limits = Limits::of(&args).unwrap();
        assert_eq!(
            limits,
            Limits {
                workers: 100,
                timeout: Duration::from_secs(360),
                qps: 20.0,
                burst: 10,
            }
        );
        // Upstream's defaults.
        let limits = Limits::of(&[]).unwrap();
        assert_eq!(
            limits,
            Limits {
                workers: 10,
                timeout: Duration::from_secs(15),
                qps: 5.0,
                burst: 10,
            }
        );
        assert!(Limits::of(&["--timeout=soon".into()]).is_err());
        assert!(Limits::of(&["--kube-api-qps=x".into()]).is_err());
    }

    #[test]
    fn the_writes_an_attacher_cannot_skip() {
        let fresh = publish("v", "n");
        let moved = Call::Publish {
            volume: "v".into(),
            node: "n".into(),
            fresh_pv: false,
        };
        let away = Call::Unpublish {
            volume: "v".into(),
            node: "m".into(),
        };
        // 3 per attach of a new volume, 2 per moved one, 1 per detach.
        assert_eq!(fresh.writes_before() + 1, 3);
        assert_eq!(moved.writes_before() + 1, 2);
        assert_eq!(away.writes_before() + 1, 1);
        assert!(fresh.write_after_is_urgent() && !away.write_after_is_urgent());
    }

    #[test]
    fn picks_in_order_those_due_within_the_free_workers() {
        let now = Instant::now();
        let mut q: VecDeque<Next> = (0..5)
            .map(|chain| Next {
                chain,
                step: 0,
                not_before: now,
            })
            .collect();
        assert_eq!(pick(&q, 3, now), [0, 1, 2]);
        assert_eq!(pick(&q, 0, now), Vec::<usize>::new());
        // A retry not yet due is passed over.
        q[0].not_before = now + Duration::from_secs(1);
        assert_eq!(pick(&q, 3, now), [1, 2, 3]);
        assert_eq!(pick(&q, 10, now), [1, 2, 3, 4]);
    }
}
