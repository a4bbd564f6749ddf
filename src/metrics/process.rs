//! The `process_*` families as Go's client_golang (v1.23, upstream v4.12's)
//! serves them on Linux: the same names, HELP texts, types and values, read
//! from `/proc/self` at each scrape as its procfs does.
//!
//! Not the prometheus crate's `ProcessCollector`: it divides the CPU ticks by
//! the clock tick as integers (an attacher using a few percent of a core
//! showed `process_cpu_seconds_total 0` for minutes, then steps of 1),
//! writes a whole-second start time, and serves `process_threads`, which
//! client_golang does not.
//!
//! A file that cannot be read or parsed drops the families it feeds from that
//! scrape; the others are still served (client_golang without `ReportErrors`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricType::{COUNTER, GAUGE};
use prometheus::proto::{Counter, Gauge, Metric, MetricFamily, MetricType};
use prometheus::Registry;

/// Name, HELP and type of client_golang's process families, as its
/// `NewProcessCollector` defines them.
#[rustfmt::skip]
const FAMILIES: [(&str, &str, MetricType); 9] = [
    ("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", COUNTER),
    ("process_open_fds", "Number of open file descriptors.", GAUGE),
    ("process_max_fds", "Maximum number of open file descriptors.", GAUGE),
    ("process_virtual_memory_bytes", "Virtual memory size in bytes.", GAUGE),
    ("process_virtual_memory_max_bytes", "Maximum amount of virtual memory available in bytes.", GAUGE),
    ("process_resident_memory_bytes", "Resident memory size in bytes.", GAUGE),
    ("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", GAUGE),
    ("process_network_receive_bytes_total", "Number of bytes received by the process over the network.", COUNTER),
    ("process_network_transmit_bytes_total", "Number of bytes sent by the process over the network.", COUNTER),
];

/// The family `name` of [`FAMILIES`] with its one unlabelled sample.
fn family(name: &str, value: f64) -> MetricFamily {
    let (name, help, kind) = FAMILIES
        .into_iter()
        .find(|f| f.0 == name)
        .unwrap_or((name, "", GAUGE));
    let mut metric = Metric::default();
    if kind == COUNTER {
        let mut counter = Counter::default();
        counter.set_value(value);
        metric.set_counter(counter);
    } else {
        let mut gauge = Gauge::default();
        gauge.set_value(value);
        metric.set_gauge(gauge);
    }
    let mut family = MetricFamily::default();
    family.set_name(name.to_string());
    family.set_help(help.to_string());
    family.set_field_type(kind);
    family.set_metric(vec![metric]);
    family
}

/// Reads this process's `/proc/self` files at each scrape.
struct ProcessCollector {
    descs: Vec<Desc>,
    /// Where procfs is mounted: `/proc` (another root in tests).
    proc: PathBuf,
    /// `sysconf(_SC_CLK_TCK)`: the unit of the times in `/proc/self/stat`
    /// (USER_HZ: 100 on the usual architectures; client_golang's procfs assumes 100).
    ticks_per_second: f64,
    /// The unit of `rss` in `/proc/self/stat`.
    page_size: f64,
    /// Kept from the first scrape that could read it (client_golang reads
    /// `/proc/stat` at every scrape): that file is long on large nodes (a line
    /// per CPU, one number per interrupt), and a process's start does not move.
    start_time: OnceLock<f64>,
}

impl ProcessCollector {
    fn new(proc: impl Into<PathBuf>) -> prometheus::Result<Self> {
        let descs = FAMILIES
            .iter()
            .map(|(name, help, _)| {
                Desc::new(name.to_string(), help.to_string(), vec![], HashMap::new())
            })
            .collect::<prometheus::Result<_>>()?;
        let ticks = rustix::param::clock_ticks_per_second();
        Ok(Self {
            descs,
            proc: proc.into(),
            ticks_per_second: if ticks == 0 { 100.0 } else { ticks as f64 },
            page_size: rustix::param::page_size() as f64,
            start_time: OnceLock::new(),
        })
    }

    /// `/proc/stat`'s `btime` (whole seconds) plus the process's start in ticks
    /// since boot, as procfs's `ProcStat.StartTime` computes it.
    fn start_time(&self, start_ticks: u64) -> Option<f64> {
        if let Some(known) = self.start_time.get() {
            return Some(*known);
        }
        let boot = boot_time(&self.read("stat")?)?;
        let start = boot + start_ticks as f64 / self.ticks_per_second;
        Some(*self.start_time.get_or_init(|| start))
    }

    /// The text of `file` under procfs; `None` when it cannot be read.
    fn read(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(self.proc.join(file)).ok()
    }

    /// The entries of `self/fd`: its size where the kernel reports it
    /// (Linux 6.2 on), else a count of the directory (which includes the
    /// descriptor reading it, as procfs's does).
    fn open_fds(&self) -> Option<u64> {
        let dir = self.proc.join("self/fd");
        let size = std::fs::metadata(&dir).map_or(0, |meta| meta.len());
        if size > 0 {
            return Some(size);
        }
        let mut entries = std::fs::read_dir(&dir).ok()?;
        entries
            .try_fold(0, |count, entry| entry.map(|_| count + 1))
            .ok()
    }
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut out = Vec::with_capacity(FAMILIES.len());
        if let Some(stat) = self.read("self/stat").as_deref().and_then(Stat::parse) {
            let cpu = stat.utime.saturating_add(stat.stime) as f64 / self.ticks_per_second;
            out.push(family("process_cpu_seconds_total", cpu));
            out.push(family("process_virtual_memory_bytes", stat.vsize as f64));
            out.push(family(
                "process_resident_memory_bytes",
                stat.rss as f64 * self.page_size,
            ));
            if let Some(start) = self.start_time(stat.start_ticks) {
                out.push(family("process_start_time_seconds", start));
            }
        }
        if let Some(fds) = self.open_fds() {
            out.push(family("process_open_fds", fds as f64));
        }
        if let Some(limits) = self.read("self/limits") {
            if let Some(max) = soft_limit(&limits, "Max open files") {
                out.push(family("process_max_fds", max));
            }
            if let Some(max) = soft_limit(&limits, "Max address space") {
                out.push(family("process_virtual_memory_max_bytes", max));
            }
        }
        if let Some((received, sent)) = self.read("self/net/netstat").as_deref().and_then(ip_octets)
        {
            out.push(family("process_network_receive_bytes_total", received));
            out.push(family("process_network_transmit_bytes_total", sent));
        }
        out
    }
}

/// Registers the process families (a clash is impossible with the fixed names:
/// nothing else defines `process_*`; a missing family is better than a
/// sidecar that does not start).
pub(super) fn register_process(registry: &Registry) -> prometheus::Result<()> {
    let _ = registry.register(Box::new(ProcessCollector::new("/proc")?));
    Ok(())
}

/// The fields of `/proc/self/stat` the families need.
#[derive(Debug, PartialEq)]
struct Stat {
    utime: u64,
    stime: u64,
    start_ticks: u64,
    vsize: u64,
    rss: u64,
}

impl Stat {
    /// proc(5): `pid (comm) state ...`; the command may hold spaces and
    /// parentheses, so the fields are counted from the last `)`.
    fn parse(text: &str) -> Option<Self> {
        let (_, rest) = text.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // proc(5) numbers the fields from 1; the state (3) is the first after the command.
        let field = |number: usize| fields.get(number.checked_sub(3)?)?.parse::<u64>().ok();
        Some(Self {
            utime: field(14)?,
            stime: field(15)?,
            start_ticks: field(22)?,
            vsize: field(23)?,
            rss: field(24)?,
        })
    }
}

/// `btime` of `/proc/stat`: the boot time in seconds since the epoch.
fn boot_time(stat: &str) -> Option<f64> {
    let line = stat.lines().find_map(|line| line.strip_prefix("btime "))?;
    line.trim().parse::<u64>().ok().map(|secs| secs as f64)
}

/// The soft limit of the `/proc/self/limits` line `name`; `unlimited` is
/// the largest 64-bit value, as procfs reads it (Go prints 1.8446744073709552e+19).
fn soft_limit(limits: &str, name: &str) -> Option<f64> {
    let rest = limits.lines().find_map(|line| line.strip_prefix(name))?;
    match rest.split_whitespace().next()? {
        "unlimited" => Some(u64::MAX as f64),
        soft => soft.parse::<u64>().ok().map(|v| v as f64),
    }
}

/// `(InOctets, OutOctets)` of the `IpExt` lines of `/proc/self/net/netstat`
/// (the network namespace's, as client_golang serves them); 0 when the
/// kernel has no such field. The file alternates a line of names and a line
/// of values per protocol; a pair that does not match is unreadable.
fn ip_octets(netstat: &str) -> Option<(f64, f64)> {
    let (mut received, mut sent) = (0.0, 0.0);
    let mut lines = netstat.lines();
    while let Some(names) = lines.next() {
        let names: Vec<&str> = names.split_whitespace().collect();
        let values: Vec<&str> = lines.next()?.split_whitespace().collect();
        if names.len() != values.len() {
            return None;
        }
        if names.first() != Some(&"IpExt:") {
            continue;
        }
        for (name, value) in names.iter().zip(&values).skip(1) {
            let value = value.parse::<f64>().ok()?;
            match *name {
                "InOctets" => received = value,
                "OutOctets" => sent = value,
                _ => {}
            }
        }
    }
    Some((received, sent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        // A command with spaces and parentheses; fields 14, 15, 22, 23, 24 of proc(5).
        let line = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 1000 0 0 0 \
                    123 45 0 0 20 0 9 0 263864 1234567168 4321 18446744073709551615 \
                    1 1 0 0 0 0 0 4096 17922 0 0 0 17 1 0 0 0 0 0\n";
        assert_eq!(
            Stat::parse(line),
            Some(Stat {
                utime: 123,
                stime: 45,
                start_ticks: 263864,
                vsize: 1234567168,
                rss: 4321,
            })
        );
        assert_eq!(Stat::parse("4242 (truncated) S 1 2"), None);
        assert_eq!(Stat::parse(""), None);
    }

    #[test]
    fn limits_read_the_soft_column_and_unlimited_as_the_largest_value() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            1024                 1048576              files     \n\
                      Max address space         unlimited            unlimited            bytes     \n";
        assert_eq!(soft_limit(limits, "Max open files"), Some(1024.0));
        assert_eq!(
            soft_limit(limits, "Max address space"),
            Some(18446744073709551615.0)
        );
        assert_eq!(soft_limit(limits, "Max locked memory"), None);
    }

    #[test]
    fn netstat_octets_come_from_the_ipext_pair() {
        let netstat = "TcpExt: SyncookiesSent SyncookiesRecv\nTcpExt: 0 0\n\
                       IpExt: InNoRoutes InOctets OutOctets\nIpExt: 0 1302753676 689485300\n";
        assert_eq!(ip_octets(netstat), Some((1302753676.0, 689485300.0)));
        assert_eq!(
            ip_octets("TcpExt: SyncookiesSent\nTcpExt: 0\n"),
            Some((0.0, 0.0))
        );
        assert_eq!(ip_octets("IpExt: InOctets OutOctets\nIpExt: 1\n"), None);
        assert_eq!(ip_octets("IpExt: InOctets\n"), None);
    }

    #[test]
    fn boot_time_is_the_btime_line() {
        let stat = "cpu  1 2 3\nintr 5 6\nbtime 1795931366\nprocesses 9\n";
        assert_eq!(boot_time(stat), Some(1795931366.0));
        assert_eq!(boot_time("cpu 1\n"), None);
    }

    fn names(families: &[MetricFamily]) -> Vec<&str> {
        families.iter().map(|f| f.name()).collect()
    }

    #[test]
    fn every_family_is_read_from_proc() {
        let families = ProcessCollector::new("/proc").expect("collector").collect();
        let mut served = names(&families);
        served.sort_unstable();
        let mut all = FAMILIES.map(|f| f.0);
        all.sort_unstable();
        assert_eq!(served, all, "each once");
        assert!(families.iter().all(|f| f.get_metric().len() == 1));
    }

    #[test]
    fn a_family_that_cannot_be_read_is_skipped() {
        let root = tempfile::tempdir().expect("tempdir");
        let collector = ProcessCollector::new(root.path()).expect("collector");
        // Nothing to read: nothing served, nothing fatal.
        assert!(collector.collect().is_empty());

        std::fs::create_dir_all(root.path().join("self/net")).expect("mkdir");
        let stat = "7 (x) S 1 7 7 0 -1 0 0 0 0 0 250 1 0 0 20 0 1 0 4242 8192 3 0";
        std::fs::write(root.path().join("self/stat"), stat).expect("stat");
        std::fs::write(
            root.path().join("self/limits"),
            "Max open files 1024 4096 files\n",
        )
        .expect("limits");
        std::fs::write(root.path().join("self/net/netstat"), "IpExt: InOctets\n").expect("netstat");
        // No /proc/stat (no btime): the start time is skipped, and read once it can be.
        let families = collector.collect();
        assert_eq!(
            names(&families),
            [
                "process_cpu_seconds_total",
                "process_virtual_memory_bytes",
                "process_resident_memory_bytes",
                "process_max_fds",
            ]
        );
        let ticks = collector.ticks_per_second;
        assert_eq!(
            families[0].get_metric()[0].get_counter().get_value(),
            251.0 / ticks
        );
        assert_eq!(
            families[2].get_metric()[0].get_gauge().get_value(),
            3.0 * collector.page_size
        );
        std::fs::write(root.path().join("stat"), "btime 1795931366\n").expect("stat");
        let start = collector
            .collect()
            .into_iter()
            .find(|f| f.name() == "process_start_time_seconds")
            .map(|f| f.get_metric()[0].get_gauge().get_value());
        assert_eq!(start, Some(1795931366.0 + 4242.0 / ticks));
    }
}
