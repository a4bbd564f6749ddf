//! `/proc/<pid>/stat` and `/proc/<pid>/status` as far as the outages of P7
//! and the cluster's cost (the API server's and etcd's own CPU and memory)
//! need them.

use anyhow::{Context, Result};

/// The command name, state and parent pid of a `/proc/<pid>/stat` text (the
/// name is in parentheses and may hold spaces and parentheses itself).
pub fn parse_stat(stat: &str) -> Option<(String, char, u32)> {
    let (head, rest) = stat.rsplit_once(')')?;
    let (_, comm) = head.split_once('(')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((comm.to_owned(), state, ppid))
}

/// utime + stime of a `/proc/<pid>/stat` text, in clock ticks.
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // After the name: state is field 3, utime field 14, stime field 15.
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// A `kB` field (`VmRSS`, `VmHWM`) of a `/proc/<pid>/status` text, in KiB.
pub fn status_kib(status: &str, field: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// CPU seconds (utime + stime) process `pid` has spent so far.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let ticks = cpu_ticks(&stat).with_context(|| format!("/proc/{pid}/stat: {stat}"))?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks as f64 / hz)
}

/// A `kB` field of `/proc/<pid>/status`, in MiB.
pub fn status_mib(pid: u32, field: &str) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = status_kib(&status, field).with_context(|| format!("{field} of pid {pid}"))?;
    Ok(kib as f64 / 1024.0)
}

/// Resets the peak resident set size (`VmHWM`) of `pid` to its current RSS
/// (proc(5): writing 5 to `/proc/<pid>/clear_refs`).
pub fn reset_peak_rss(pid: u32) -> Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .with_context(|| format!("resetting VmHWM of pid {pid}"))
}

// Also compiled into benches/wire_format.rs, which cargo builds with cfg(test)
// but no test harness: there the #[test]s are dropped.
#[cfg(test)]
#[allow(unused_imports, dead_code)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_parsed_past_the_command_name() {
        assert_eq!(
            parse_stat("4242 (kube-apiserver) S 17 4242 17 0 -1"),
            Some(("kube-apiserver".into(), 'S', 17))
        );
        // A command name with a space and a parenthesis.
        assert_eq!(parse_stat("7 (a) b) Z 1 7"), Some(("a) b".into(), 'Z', 1)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn cpu_ticks_are_utime_plus_stime() {
        // Fields 14 and 15 (utime 1200, stime 34), a name with spaces.
        let stat = "4242 (kube api) S 17 4242 17 0 -1 4194560 100 0 0 0 1200 34 0 0 20 0 12 0";
        assert_eq!(cpu_ticks(stat), Some(1234));
        assert_eq!(cpu_ticks("1 (x) S 0"), None);
    }

    #[test]
    fn status_fields_in_kib() {
        let status = "Name:\tetcd\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n";
        assert_eq!(status_kib(status, "VmHWM"), Some(204_800));
        assert_eq!(status_kib(status, "VmRSS"), Some(102_400));
        assert_eq!(status_kib(status, "VmSwap"), None);
    }
}
