//! P8, "what users wait for": the pure parts. Which driver profiles, which
//! flag sets (each driver's chart, upstream's defaults), which cases, the
//! statistics of one run and the driver calls per attach read from the mock
//! driver's ledger. The runs themselves are `scenarios/p8.rs`.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::stats::percentile;

/// A built-in profile of the mock driver (`csi-mock-driver --profile NAME`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Profile {
    AwsEbs,
    AzureDisk,
    /// The sensitivity row: azure-disk with a 6 s median instead of 15 s,
    /// everything else the same (docs/driver-profiles.md, "azure-disk-fast").
    AzureDiskFast,
    GcePd,
    /// Alibaba Cloud's disk driver: one operation per instance at a time.
    SerialPerNode,
}

impl Profile {
    /// Every profile P8 knows, in the order of its tables.
    pub const ALL: [Profile; 5] = [
        Profile::AwsEbs,
        Profile::AzureDisk,
        Profile::AzureDiskFast,
        Profile::GcePd,
        Profile::SerialPerNode,
    ];

    /// The profiles `p8` runs; the sensitivity row runs when named
    /// (`--only p8-azure-disk-fast`).
    pub const MAIN: [Profile; 4] = [
        Profile::AwsEbs,
        Profile::AzureDisk,
        Profile::GcePd,
        Profile::SerialPerNode,
    ];

    /// The mock driver's `--profile` name, and the profile's name in results.
    pub fn name(self) -> &'static str {
        match self {
            Profile::AwsEbs => "aws-ebs",
            Profile::AzureDisk => "azure-disk",
            Profile::AzureDiskFast => "azure-disk-fast",
            Profile::GcePd => "gce-pd",
            Profile::SerialPerNode => "serial-per-node",
        }
    }

    /// The driver and the chart (or manifest) release whose attacher flags
    /// [`Self::chart_flags`] are (docs/driver-profiles.md, "Charts' attacher flags").
    pub fn driver(self) -> &'static str {
        match self {
            Profile::AwsEbs => "aws-ebs-csi-driver chart 2.64.0",
            Profile::AzureDisk => "azuredisk-csi-driver chart v1.34.5",
            Profile::AzureDiskFast => {
                "azuredisk-csi-driver chart v1.34.5 (sensitivity row: a 6 s median VM update)"
            }
            Profile::GcePd => "gcp-compute-persistent-disk-csi-driver deploy/ at v1.26.4",
            Profile::SerialPerNode => "alibaba-cloud-csi-driver chart at v1.37.1 (disk)",
        }
    }

    /// The attacher flags the driver's chart (deployment) ships; what it does
    /// not set is upstream's default (see [`DEFAULTS`]).
    pub fn chart_flags(self) -> &'static [&'static str] {
        match self {
            Profile::AwsEbs => &[
                "--worker-threads=100",
                "--kube-api-qps=20",
                "--kube-api-burst=100",
                "--timeout=6m",
            ],
            Profile::AzureDisk | Profile::AzureDiskFast => &[
                "--worker-threads=1000",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--timeout=600s",
            ],
            Profile::GcePd => &["--timeout=250s"],
            Profile::SerialPerNode => &[
                "--worker-threads=1200",
                "--kube-api-qps=1000",
                "--kube-api-burst=2000",
                "--timeout=30s",
            ],
        }
    }

    /// The profile's TOML, as the mock driver has it built in.
    fn toml(self) -> &'static str {
        match self {
            Profile::AwsEbs => {
                include_str!("../../csi-mock-driver/src/profiles/aws-ebs.toml")
            }
            Profile::AzureDisk => {
                include_str!("../../csi-mock-driver/src/profiles/azure-disk.toml")
            }
            Profile::AzureDiskFast => {
                include_str!("../../csi-mock-driver/src/profiles/azure-disk-fast.toml")
            }
            Profile::GcePd => include_str!("../../csi-mock-driver/src/profiles/gce-pd.toml"),
            Profile::SerialPerNode => {
                include_str!("../../csi-mock-driver/src/profiles/serial-per-node.toml")
            }
        }
    }

    /// Volumes one node can have attached (`node.max_attachments` of the
    /// profile; `usize::MAX` when it has no limit).
    pub fn node_limit(self) -> usize {
        let profile: toml::Table = toml::from_str(self.toml()).unwrap_or_default();
        profile
            .get("node")
            .and_then(|n| n.get("max_attachments"))
            .and_then(toml::Value::as_integer)
            .filter(|&n| n > 0)
            .map_or(usize::MAX, |n| n as usize)
    }

    /// Whether the cloud runs one operation per node at a time
    /// (`node.cloud_serial` of the profile).
    pub fn cloud_serial(self) -> bool {
        let profile: toml::Table = toml::from_str(self.toml()).unwrap_or_default();
        profile
            .get("node")
            .and_then(|n| n.get("cloud_serial"))
            .and_then(toml::Value::as_bool)
            .unwrap_or(false)
    }

    /// The cloud API's token bucket where every operation takes a token
    /// (its `[api]` bucket, refill per second, and whether attach and detach
    /// have one each, `per_kind`); `None` where there is no
    /// bucket, or where a node's batch takes one token for many volumes
    /// (azure-disk's `[batch]`).
    pub fn call_bucket(self) -> Option<(i64, f64, bool)> {
        let profile: toml::Table = toml::from_str(self.toml()).unwrap_or_default();
        if profile.contains_key("batch") {
            return None;
        }
        let api = profile.get("api")?;
        let bucket = api.get("bucket").and_then(toml::Value::as_integer)?;
        let refill = api
            .get("refill_per_s")
            .and_then(|v| v.as_float().or_else(|| v.as_integer().map(|i| i as f64)))?;
        let per_kind = api
            .get("per_kind")
            .and_then(toml::Value::as_bool)
            .unwrap_or(false);
        Some((bucket, refill, per_kind))
    }

    /// `wanted` volumes per node, at most the node's limit: the scheduler
    /// places no more pods with volumes on a node than its CSINode allows.
    pub fn per_node(self, wanted: usize) -> usize {
        wanted.min(self.node_limit())
    }
}

/// Upstream's defaults of the flags the charts set.
pub const DEFAULTS: [&str; 4] = [
    "--worker-threads=10",
    "--timeout=15s",
    "--kube-api-qps=5",
    "--kube-api-burst=10",
];

/// The two flag sets of each profile; both attachers get the same one.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Flags {
    /// What the driver's chart ships.
    Chart,
    /// Upstream's defaults.
    Defaults,
}

impl Flags {
    pub const ALL: [Flags; 2] = [Flags::Chart, Flags::Defaults];

    pub fn label(self) -> &'static str {
        match self {
            Flags::Chart => "chart flags",
            Flags::Defaults => "upstream defaults",
        }
    }

    /// The attacher's flags (besides `--csi-address`, `--kubeconfig` and
    /// `--http-endpoint`): every flag of [`DEFAULTS`] once, the chart's value
    /// where it sets one.
    pub fn args(self, profile: Profile) -> Vec<String> {
        let chart: &[&str] = match self {
            Flags::Chart => profile.chart_flags(),
            Flags::Defaults => &[],
        };
        let flag = |arg: &str| arg.split('=').next().unwrap_or(arg).to_owned();
        let mut args: Vec<String> = DEFAULTS
            .iter()
            .map(|d| {
                chart
                    .iter()
                    .find(|c| flag(c) == flag(d))
                    .unwrap_or(d)
                    .to_string()
            })
            .collect();
        args.extend(
            chart
                .iter()
                .filter(|c| !DEFAULTS.iter().any(|d| flag(d) == flag(c)))
                .map(|c| c.to_string()),
        );
        args
    }
}

/// What happens to the cluster in one run.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Case {
    /// New nodes, VAs created at once.
    ScaleUp,
    /// Volumes move from drained nodes to others: old VA deleted, new VA
    /// created once the old one is gone.
    Drain,
    /// A Node with volumes is deleted (and its CSINode and cloud instance).
    NodeDeleted,
    /// A Node is tainted out-of-service; Node and instance stay.
    OutOfService,
    /// One node with many pending attaches beside many nodes with few.
    NoisyNeighbour,
}

impl Case {
    pub const ALL: [Case; 5] = [
        Case::ScaleUp,
        Case::Drain,
        Case::NodeDeleted,
        Case::OutOfService,
        Case::NoisyNeighbour,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Case::ScaleUp => "scale-up",
            Case::Drain => "drain",
            Case::NodeDeleted => "node deleted",
            Case::OutOfService => "node out-of-service",
            Case::NoisyNeighbour => "noisy neighbour",
        }
    }

    /// A short key for object names.
    pub fn key(self) -> &'static str {
        match self {
            Case::ScaleUp => "up",
            Case::Drain => "drain",
            Case::NodeDeleted => "gone",
            Case::OutOfService => "oos",
            Case::NoisyNeighbour => "noisy",
        }
    }

    /// What the per-VA time spans.
    pub fn span(self) -> &'static str {
        match self {
            Case::ScaleUp => "create→attached",
            Case::Drain => "old VA deleted→attached elsewhere",
            Case::NodeDeleted => "Node deleted→attached elsewhere",
            Case::OutOfService => "taint→attached elsewhere",
            Case::NoisyNeighbour => "small nodes' create→attached",
        }
    }
}

/// The figures of one run, each a metric of its own (all: lower is better).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Figure {
    P50,
    P99,
    Max,
    /// From the first create (or the failure, or the first delete) to the
    /// last VA attached.
    AllAttached,
    /// ControllerPublishVolume calls ÷ the successful ones.
    CallsPerAttach,
    /// `status.attachError` changes seen by a watch.
    AttachErrors,
    /// VAs never attached within the run's cap.
    NotAttached,
    /// The p99 of each measured volume's cloud operations alone (its
    /// detach's latency, if any, then its attach's): the floor's run only.
    OperationsP99,
}

impl Figure {
    pub const ALL: [Figure; 7] = [
        Figure::P50,
        Figure::P99,
        Figure::Max,
        Figure::AllAttached,
        Figure::CallsPerAttach,
        Figure::AttachErrors,
        Figure::NotAttached,
    ];

    /// Its name in a metric (after the run's label).
    pub fn label(self, case: Case) -> String {
        match self {
            Figure::P50 => format!("{} p50 s", case.span()),
            Figure::P99 => format!("{} p99 s", case.span()),
            Figure::Max => format!("{} max s", case.span()),
            Figure::AllAttached => "all attached s".into(),
            Figure::CallsPerAttach => "Publish calls per volume attached".into(),
            Figure::AttachErrors => "attachError changes".into(),
            Figure::NotAttached => "VAs not attached within the cap".into(),
            Figure::OperationsP99 => format!("{} p99 s, cloud operations alone", case.span()),
        }
    }

    /// Its column in results.md's P8 tables.
    pub fn column(self) -> &'static str {
        match self {
            Figure::P50 => "p50 s",
            Figure::P99 => "p99 s",
            Figure::Max => "max s",
            Figure::AllAttached => "all attached s",
            Figure::CallsPerAttach => "Publish calls / attach",
            Figure::AttachErrors => "attachError changes",
            Figure::NotAttached => "not attached",
            Figure::OperationsP99 => "operations p99 s",
        }
    }
}

/// "P8 aws-ebs scale-up (chart flags)": the prefix of a run's metrics and
/// the key of its distribution in results.json.
pub fn run_label(profile: Profile, case: Case, flags: Flags) -> String {
    format!("P8 {} {} ({})", profile.name(), case.label(), flags.label())
}

/// What one run measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// Per measured VA: seconds to attached, `None` when not within the cap.
    pub times: Vec<Option<f64>>,
    /// Seconds from the run's start to its last VA attached (every VA of the
    /// run, for the noisy neighbour also the big node's); `None` when one was
    /// not attached within the cap.
    pub all: Option<f64>,
    /// VAs of the run not attached within the cap (for the noisy neighbour
    /// also the big node's, which are not in `times`).
    pub not_attached: usize,
    /// ControllerPublishVolume calls and successful ones.
    pub calls: CallCount,
    pub attach_errors: usize,
    /// Per measured volume: its cloud operations' latencies alone, summed
    /// (where the cloud serializes a node's operations, the bound's sorted
    /// order statistics instead: [`operations_bound`]); `None` where the
    /// driver's ledger does not give them (a batching profile) or for an
    /// attacher's run.
    pub operations: Option<Vec<f64>>,
}

impl Observed {
    /// The distribution as recorded: a VA not attached counts as the cap.
    pub fn capped(&self, cap: f64) -> Vec<f64> {
        self.times.iter().map(|t| t.unwrap_or(cap)).collect()
    }

    /// The value of `figure`; times not attached count as `cap` (a lower bound).
    pub fn figure(&self, figure: Figure, cap: f64) -> f64 {
        let mut times = self.capped(cap);
        match figure {
            Figure::P50 => percentile(&mut times, 50.0),
            Figure::P99 => percentile(&mut times, 99.0),
            Figure::Max => percentile(&mut times, 100.0),
            Figure::AllAttached => self.all.unwrap_or(cap),
            Figure::CallsPerAttach => self.calls.per_attach(),
            Figure::AttachErrors => self.attach_errors as f64,
            Figure::NotAttached => self.not_attached as f64,
            Figure::OperationsP99 => match &self.operations {
                Some(operations) => percentile(&mut operations.clone(), 99.0),
                None => f64::NAN,
            },
        }
    }
}

/// ControllerPublishVolume calls in a ledger, and how many attaches they made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallCount {
    pub calls: usize,
    /// Distinct (volume, node) pairs with a successful call: the attaches.
    /// A second successful Publish of a volume already attached to its node
    /// (an attacher that publishes twice) is a call, not another attach.
    pub attached: usize,
}

impl CallCount {
    /// Calls per attach (1 when no call was wasted); NaN when none attached.
    pub fn per_attach(self) -> f64 {
        if self.attached == 0 {
            f64::NAN
        } else {
            self.calls as f64 / self.attached as f64
        }
    }
}

/// The ControllerPublishVolume calls of a JSON-lines ledger for volume
/// handles starting with `volume_prefix`, received at or after `since`
/// (unix seconds). Event lines (`start`, `abandoned`) are not calls; a call
/// its client abandoned is (code `Canceled`).
pub fn publish_calls(ledger: &str, volume_prefix: &str, since: f64) -> CallCount {
    let mut calls = 0;
    let mut attached = HashSet::new();
    for entry in lines(ledger) {
        if entry.get("event").is_some()
            || entry["method"] != "ControllerPublishVolume"
            || !entry["volume_id"]
                .as_str()
                .is_some_and(|v| v.starts_with(volume_prefix))
        {
            continue;
        }
        let received = entry["time_unix_nanos"].as_u64().unwrap_or(0) as f64 / 1e9;
        if received < since {
            continue;
        }
        calls += 1;
        if entry["code"] == "OK" {
            attached.insert((entry["volume_id"].to_string(), entry["node_id"].to_string()));
        }
    }
    CallCount {
        calls,
        attached: attached.len(),
    }
}

/// Calls of a ledger written with `--ledger-events` that started and have
/// neither an entry nor an `abandoned` line yet.
pub fn unfinished_calls(ledger: &str) -> usize {
    let mut started = HashSet::new();
    let mut ended = HashSet::new();
    for entry in lines(ledger) {
        let Some(id) = entry["call_id"].as_u64() else {
            continue;
        };
        match entry["event"].as_str() {
            Some("start") => started.insert(id),
            _ => ended.insert(id),
        };
    }
    started.difference(&ended).count()
}

/// A volume's cloud operations in a case: the detach from its old node
/// (a drain's or failure's) and the attach to its node, as the mock driver
/// names them (volume handle, node ID).
pub struct Moves {
    pub volume: String,
    pub from: Option<String>,
    pub to: String,
}

/// Per volume of `moves`, the latencies the profile drew for its first
/// detach from the old node (none where the case makes none: a deleted
/// instance's) and its first attach to the new one, summed, in seconds,
/// from a ledger written with `--ledger-events` (its `operation` lines);
/// `None` when a volume's attach has no line (the ledger has no operation
/// lines: a batching profile, or a volume not attached).
///
/// A lower bound on each volume's time to attached for any attacher, in
/// any order, at any concurrency: an operation's latency is drawn by its
/// number for its (kind, volume, node), whoever calls; a second operation
/// for a pair starts only after the first has ended, and an operation
/// outlives a caller that gives up, so none ends sooner than the first's
/// draw; and the new attach starts after the old detach has ended (the new
/// VA comes once the old one is gone). Not counted: waits for tokens,
/// slots or workers, the driver's polls and every API write.
///
/// Where the cloud runs one operation per node at a time (`serial`: the
/// profile's `cloud_serial`), the bound also counts that each node's
/// operations follow one another ([`serial_bound`]); the values are then
/// the bound's sorted order statistics rather than one per volume (only
/// their percentiles are read).
pub fn operations_bound(ledger: &str, moves: &[Moves], serial: bool) -> Option<Vec<f64>> {
    let mut first: HashMap<(String, String, String), f64> = HashMap::new();
    for entry in lines(ledger) {
        if entry["event"] != "operation" || entry["number"].as_u64() != Some(1) {
            continue;
        }
        let text = |field: &str| entry[field].as_str().unwrap_or_default().to_owned();
        let Some(latency) = entry["latency_ms"].as_f64() else {
            continue;
        };
        first.insert(
            (text("kind"), text("volume_id"), text("node_id")),
            latency / 1e3,
        );
    }
    let of = |kind: &str, volume: &str, node: &str| {
        first
            .get(&(kind.to_owned(), volume.to_owned(), node.to_owned()))
            .copied()
    };
    let drawn = moves
        .iter()
        .map(|m| {
            let detach = m
                .from
                .as_deref()
                .and_then(|from| Some((from, of("detach", &m.volume, from)?)));
            Some(Drawn {
                detach,
                to: &m.to,
                attach: of("attach", &m.volume, &m.to)?,
            })
        })
        .collect::<Option<Vec<Drawn>>>()?;
    Some(if serial {
        serial_bound(&drawn)
    } else {
        drawn.iter().map(Drawn::sum).collect()
    })
}

/// One volume's first operations, as the profile drew them (seconds).
struct Drawn<'a> {
    /// The old node and the detach from it, if one ran.
    detach: Option<(&'a str, f64)>,
    to: &'a str,
    attach: f64,
}

impl Drawn<'_> {
    fn detach(&self) -> f64 {
        self.detach.map_or(0.0, |(_, d)| d)
    }

    fn sum(&self) -> f64 {
        self.detach() + self.attach
    }
}

/// The bound of [`operations_bound`] where the cloud runs one operation per
/// node at a time: sorted, the least each order statistic of the volumes'
/// times can be, in seconds from the case's start.
///
/// Three lower bounds on the sorted times, each valid alone, taken at their
/// greatest, element by element: (1) each volume's own detach + attach; (2)
/// per new node, its attaches one after another: its k-th attach ends no
/// sooner than the earliest of its volumes' detaches plus the k shortest of
/// their attaches (shortest first ends each k-th soonest); (3) per old
/// node, its detaches one after another, the k-th no sooner than the k
/// shortest of them, then at least the shortest of their attaches. (Where
/// each group's sorted times are at least a sequence, the sorted times of
/// all are at least those sequences merged and sorted.) Volumes of no group
/// (no detach ran) count alone in (3).
fn serial_bound(drawn: &[Drawn]) -> Vec<f64> {
    let sorted = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v
    };
    // Running sums of a group's latencies, shortest first, from `start`.
    let serialized = |start: f64, latencies: Vec<f64>| {
        sorted(latencies)
            .into_iter()
            .scan(start, |end, latency| {
                *end += latency;
                Some(*end)
            })
            .collect::<Vec<f64>>()
    };
    let alone = sorted(drawn.iter().map(Drawn::sum).collect());
    let mut by_new: HashMap<&str, Vec<&Drawn>> = HashMap::new();
    let mut by_old: HashMap<&str, Vec<&Drawn>> = HashMap::new();
    let mut unmoved = Vec::new();
    for d in drawn {
        by_new.entry(d.to).or_default().push(d);
        match d.detach {
            Some((from, _)) => by_old.entry(from).or_default().push(d),
            None => unmoved.push(d.sum()),
        }
    }
    let attaches = sorted(
        by_new
            .values()
            .flat_map(|group| {
                let start = group
                    .iter()
                    .map(|d| d.detach())
                    .fold(f64::INFINITY, f64::min);
                serialized(start, group.iter().map(|d| d.attach).collect())
            })
            .collect(),
    );
    let detaches = sorted(
        by_old
            .values()
            .flat_map(|group| {
                let shortest = group.iter().map(|d| d.attach).fold(f64::INFINITY, f64::min);
                serialized(0.0, group.iter().map(|d| d.detach()).collect())
                    .into_iter()
                    .map(move |end| end + shortest)
            })
            .chain(unmoved)
            .collect(),
    );
    alone
        .iter()
        .zip(&attaches)
        .zip(&detaches)
        .map(|((a, b), c)| a.max(*b).max(*c))
        .collect()
}

/// The JSON lines of a ledger; a line cut short (being written) is skipped.
fn lines(ledger: &str) -> impl Iterator<Item = Value> + '_ {
    ledger
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
}

/// Per-VA status.attachError history as a watch sees it: counts each new
/// error (a message or time different from the last one seen).
#[derive(Clone, Debug, Default)]
pub struct ErrorSeen {
    last: Option<String>,
    pub changes: usize,
}

impl ErrorSeen {
    /// `error`: the error's message and time, as one string; `None`: no error.
    pub fn see(&mut self, error: Option<String>) {
        if error.is_some() && error != self.last {
            self.changes += 1;
        }
        self.last = error;
    }
}

/// The cumulative distribution of `values` as steps: (value, fraction of all
/// values ≤ it), sorted; values at or above `cap` (not attached) are left out,
/// so the curve ends below 1 when some never attached.
pub fn cdf_points(values: &[f64], cap: f64) -> Vec<(f64, f64)> {
    let mut sorted: Vec<f64> = values
        .iter()
        .copied()
        .filter(|v| v.is_finite() && *v < cap)
        .collect();
    sorted.sort_by(f64::total_cmp);
    let n = values.len().max(1) as f64;
    sorted
        .iter()
        .enumerate()
        .map(|(i, v)| (*v, (i + 1) as f64 / n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_flags_replace_the_defaults_once_each() {
        assert_eq!(
            Flags::Defaults.args(Profile::AwsEbs),
            [
                "--worker-threads=10",
                "--timeout=15s",
                "--kube-api-qps=5",
                "--kube-api-burst=10"
            ]
        );
        assert_eq!(
            Flags::Chart.args(Profile::AwsEbs),
            [
                "--worker-threads=100",
                "--timeout=6m",
                "--kube-api-qps=20",
                "--kube-api-burst=100"
            ]
        );
        // The GCE PD deployment sets only the timeout.
        assert_eq!(
            Flags::Chart.args(Profile::GcePd),
            [
                "--worker-threads=10",
                "--timeout=250s",
                "--kube-api-qps=5",
                "--kube-api-burst=10"
            ]
        );
        for profile in Profile::ALL {
            for flags in Flags::ALL {
                let args = flags.args(profile);
                let names: HashSet<&str> =
                    args.iter().map(|a| a.split('=').next().unwrap()).collect();
                assert_eq!(names.len(), args.len(), "{args:?}");
            }
        }
    }

    #[test]
    fn node_limits_come_from_the_profiles() {
        assert_eq!(Profile::AwsEbs.node_limit(), 26);
        assert_eq!(Profile::AzureDisk.node_limit(), 8);
        assert_eq!(Profile::GcePd.node_limit(), 127);
        assert_eq!(Profile::SerialPerNode.node_limit(), 15);
        assert_eq!(Profile::AzureDisk.per_node(10), 8);
        assert_eq!(Profile::SerialPerNode.per_node(20), 15);
        assert_eq!(Profile::GcePd.per_node(20), 20);
        assert_eq!(Profile::AwsEbs.call_bucket(), Some((50, 5.0, true)));
        assert_eq!(Profile::GcePd.call_bucket(), Some((1500, 25.0, false)));
        // A token per VM update (a batch), not per call; no bucket.
        assert_eq!(Profile::AzureDisk.call_bucket(), None);
        // The sensitivity row: azure-disk's node, flags and batching.
        assert_eq!(Profile::AzureDiskFast.node_limit(), 8);
        assert_eq!(Profile::AzureDiskFast.call_bucket(), None);
        assert_eq!(
            Flags::Chart.args(Profile::AzureDiskFast),
            Flags::Chart.args(Profile::AzureDisk)
        );
        assert_eq!(Profile::SerialPerNode.call_bucket(), None);
        assert!(Profile::SerialPerNode.cloud_serial());
        assert!(!Profile::GcePd.cloud_serial() && !Profile::AwsEbs.cloud_serial());
    }

    #[test]
    fn labels_name_profile_case_and_flags() {
        assert_eq!(
            run_label(
                Profile::SerialPerNode,
                Case::NoisyNeighbour,
                Flags::Defaults
            ),
            "P8 serial-per-node noisy neighbour (upstream defaults)"
        );
        assert_eq!(
            Figure::P99.label(Case::Drain),
            "old VA deleted→attached elsewhere p99 s"
        );
    }

    #[test]
    fn not_attached_counts_as_the_cap() {
        let observed = Observed {
            times: vec![Some(1.0), Some(2.0), None, Some(3.0)],
            all: None,
            not_attached: 5,
            calls: CallCount {
                calls: 6,
                attached: 3,
            },
            attach_errors: 2,
            operations: Some(vec![4.0, 1.0, 2.0]),
        };
        let cap = 60.0;
        assert_eq!(observed.capped(cap), [1.0, 2.0, 60.0, 3.0]);
        assert_eq!(observed.figure(Figure::P50, cap), 3.0);
        assert_eq!(observed.figure(Figure::Max, cap), 60.0);
        assert_eq!(observed.figure(Figure::AllAttached, cap), 60.0);
        assert_eq!(observed.figure(Figure::CallsPerAttach, cap), 2.0);
        assert_eq!(observed.figure(Figure::AttachErrors, cap), 2.0);
        assert_eq!(observed.figure(Figure::NotAttached, cap), 5.0);
        assert_eq!(observed.figure(Figure::OperationsP99, cap), 4.0);
        assert!(Observed::default()
            .figure(Figure::OperationsP99, cap)
            .is_nan());
        let done = Observed {
            times: (1..=100).map(|i| Some(f64::from(i))).collect(),
            all: Some(101.5),
            ..Observed::default()
        };
        assert_eq!(done.figure(Figure::P99, cap), 99.0);
        assert_eq!(done.figure(Figure::AllAttached, cap), 101.5);
        assert_eq!(done.figure(Figure::NotAttached, cap), 0.0);
        assert!(done.figure(Figure::CallsPerAttach, cap).is_nan());
    }

    /// A ledger's `operation` line.
    fn op(kind: &str, volume: &str, node: &str, number: u64, ms: f64) -> String {
        serde_json::json!({"event": "operation", "kind": kind, "volume_id": volume,
            "node_id": node, "number": number, "latency_ms": ms, "time_unix_nanos": 1})
        .to_string()
    }

    /// A volume's move (`from: None`: a burst's attach alone).
    fn planned(volume: &str, from: Option<&str>, to: &str) -> Moves {
        Moves {
            volume: volume.to_owned(),
            from: from.map(str::to_owned),
            to: to.to_owned(),
        }
    }

    #[test]
    fn the_operations_bound_sums_each_volumes_first_detach_and_attach() {
        let ledger = [
            // The setup's attach where the volume starts: not the case's.
            op("attach", "v0", "old", 1, 9000.0),
            op("detach", "v0", "old", 1, 2000.0),
            // A second operation for a pair starts after the first ended:
            // the first's latency is what bounds it.
            op("attach", "v0", "new", 1, 3000.0),
            op("attach", "v0", "new", 2, 500.0),
            // No detach: the old instance is gone (answered without one).
            op("attach", "v1", "new", 1, 4000.0),
            r#"{"method":"ControllerPublishVolume","volume_id":"v1","node_id":"new","code":"OK"}"#
                .to_owned(),
            r#"{"event":"operation","kind":"attach","volume_id":"v2""#.to_owned(),
        ]
        .join("\n");
        let moves = |volume: &str, from: Option<&str>| planned(volume, from, "new");
        assert_eq!(
            operations_bound(
                &ledger,
                &[moves("v0", Some("old")), moves("v1", Some("old"))],
                false
            ),
            Some(vec![5.0, 4.0])
        );
        // A burst: the attach alone.
        assert_eq!(
            operations_bound(&ledger, &[moves("v0", None)], false),
            Some(vec![3.0])
        );
        // A volume whose attach never started (or a batching profile): none.
        assert_eq!(
            operations_bound(&ledger, &[moves("v0", None), moves("v2", None)], false),
            None
        );
    }

    #[test]
    fn where_the_cloud_runs_one_operation_per_node_the_bound_counts_them_one_after_another() {
        let op = |kind: &str, volume: &str, node: &str, ms: f64| op(kind, volume, node, 1, ms);
        let moves = planned;
        // A burst: node a's three attaches follow one another, shortest
        // first; node b's one attach is alone.
        let burst = [
            op("attach", "v1", "a", 3000.0),
            op("attach", "v2", "a", 1000.0),
            op("attach", "v3", "a", 2000.0),
            op("attach", "v4", "b", 5000.0),
        ]
        .join("\n");
        let planned = [
            moves("v1", None, "a"),
            moves("v2", None, "a"),
            moves("v3", None, "a"),
            moves("v4", None, "b"),
        ];
        assert_eq!(
            operations_bound(&burst, &planned, true),
            Some(vec![1.0, 3.0, 5.0, 6.0])
        );
        assert_eq!(
            operations_bound(&burst, &planned, false),
            Some(vec![3.0, 1.0, 2.0, 5.0])
        );
        // Moves from one old node to two new ones: the old node's detaches
        // follow one another (1, 1+2, 1+2+4 s, each then at least the
        // shortest attach, 1 s); the new node c's attaches start after the
        // earliest of their detaches (1 s) and follow one another.
        let moved = [
            op("detach", "v1", "old", 1000.0),
            op("detach", "v2", "old", 2000.0),
            op("detach", "v3", "old", 4000.0),
            op("attach", "v1", "c", 3000.0),
            op("attach", "v2", "c", 3000.0),
            op("attach", "v3", "d", 1000.0),
        ]
        .join("\n");
        let planned = [
            moves("v1", Some("old"), "c"),
            moves("v2", Some("old"), "c"),
            moves("v3", Some("old"), "d"),
        ];
        // Alone: 4, 5, 5; new nodes: c 1+3, 1+3+3 and d 4+1 = 4, 5, 7;
        // old node: 2, 4, 8.
        assert_eq!(
            operations_bound(&moved, &planned, true),
            Some(vec![4.0, 5.0, 8.0])
        );
    }

    #[test]
    fn publish_calls_per_attach_from_the_ledger() {
        let ledger = [
            // Before the run's start: the canary's, or the setup's.
            r#"{"method":"ControllerPublishVolume","volume_id":"handle-r-pv-0","node_id":"n","code":"OK","time_unix_nanos":900000000000}"#,
            r#"{"event":"start","method":"ControllerPublishVolume","call_id":7,"time_unix_nanos":1000000000000}"#,
            r#"{"method":"ControllerPublishVolume","volume_id":"handle-r-pv-0","node_id":"n","code":"ResourceExhausted","call_id":7,"time_unix_nanos":1000000000000}"#,
            r#"{"method":"ControllerPublishVolume","volume_id":"handle-r-pv-0","node_id":"n","code":"Canceled","time_unix_nanos":1001000000000}"#,
            r#"{"method":"ControllerPublishVolume","volume_id":"handle-r-pv-0","node_id":"n","code":"OK","time_unix_nanos":1002000000000}"#,
            r#"{"method":"ControllerPublishVolume","volume_id":"handle-r-pv-1","node_id":"n","code":"OK","time_unix_nanos":1002000000000}"#,
            // Published again where it is attached: a call, not an attach.
            r#"{"method":"ControllerPublishVolume","volume_id":"handle-r-pv-1","node_id":"n","code":"OK","time_unix_nanos":1002500000000}"#,
            // Another run's volume, another method, a line cut short.
            r#"{"method":"ControllerPublishVolume","volume_id":"handle-s-pv-1","node_id":"n","code":"OK","time_unix_nanos":1002000000000}"#,
            r#"{"method":"ControllerUnpublishVolume","volume_id":"handle-r-pv-1","node_id":"n","code":"OK","time_unix_nanos":1003000000000}"#,
            r#"{"method":"ControllerPublishVolume","volume_id":"handle-r-p"#,
        ]
        .join("\n");
        let count = publish_calls(&ledger, "handle-r-pv-", 1000.0);
        assert_eq!(
            count,
            CallCount {
                calls: 5,
                attached: 2
            }
        );
        assert_eq!(count.per_attach(), 2.5);
        assert_eq!(publish_calls(&ledger, "handle-r-pv-", 0.0).calls, 6);
    }

    #[test]
    fn unfinished_calls_are_starts_without_an_end() {
        let ledger = [
            r#"{"event":"start","method":"ControllerPublishVolume","call_id":1}"#,
            r#"{"event":"start","method":"ControllerPublishVolume","call_id":2}"#,
            r#"{"event":"start","method":"ControllerUnpublishVolume","call_id":3}"#,
            r#"{"method":"ControllerPublishVolume","code":"OK","call_id":1}"#,
            r#"{"event":"abandoned","method":"ControllerUnpublishVolume","call_id":3}"#,
        ]
        .join("\n");
        assert_eq!(unfinished_calls(&ledger), 1);
        assert_eq!(unfinished_calls(""), 0);
    }

    #[test]
    fn attach_error_changes_count_new_errors_only() {
        let mut seen = ErrorSeen::default();
        seen.see(None);
        seen.see(Some("a@1".into()));
        // The same error again (another field of the VA changed): no change.
        seen.see(Some("a@1".into()));
        seen.see(Some("a@2".into()));
        seen.see(None);
        seen.see(Some("a@2".into()));
        assert_eq!(seen.changes, 3);
    }

    #[test]
    fn cdf_ends_below_one_when_some_never_attached() {
        let points = cdf_points(&[3.0, 1.0, 60.0, 2.0], 60.0);
        assert_eq!(points, [(1.0, 0.25), (2.0, 0.5), (3.0, 0.75)]);
        assert!(cdf_points(&[], 60.0).is_empty());
    }
}
