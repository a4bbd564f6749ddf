//! Command-line flags, parsed the way upstream's Go binary parses them
//! (`docs/contract.md#flags`): deployments rely on Go's `flag` syntax, which
//! clap does not speak, so [`Config::try_parse_go`] (`args.rs`) walks the
//! arguments with Go's rules and hands clap one `--name=value` per flag, read
//! with ports of Go's own parsers (`values.rs`, `crate::gofmt::parse`). After
//! parsing, in upstream's order (exit 1): [`Config::validate_logging`],
//! [`Config::feature_gates`] (`gates.rs`), `--version` (main), then
//! [`Config::validate`] (`validate.rs`); values upstream runs with but badly
//! are raised to a sane bound (`bounds.rs`, `docs/bounds.md`).

mod args;
mod bounds;
mod gates;
mod validate;
mod values;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser};

use crate::gofmt::parse as go;
pub use args::{ParseError, UPSTREAM_FLAGS};
pub use bounds::{Adjustment, MAX_WORKERS, MIN_INTERVAL, MIN_RESYNC};
pub use gates::FeatureGates;
pub use validate::Error;
use values::{automaxprocs_flag, bool_flag, duration_flag, int32_flag, quantity_flag};

/// Where the kubelet reads a container's termination message by default.
pub const DEFAULT_TERMINATION_LOG: &str = "/dev/termination-log";

/// The end of `--help`: the `check` subcommand, which clap does not know
/// about (`main` takes it off the arguments before they are parsed).
const CHECK_HELP: &str = "\
Subcommand:
  csi-attacher check [OPTIONS]
      A read-only report with the sidecar's flags: VolumeAttachments whose status and the
      driver's published nodes disagree, VAs with an attach or detach error, PVs and VAs being
      deleted that still hold our finalizer. --output=text|json. Exit 0 when nothing needs
      attention, 1 otherwise. Writes nothing (GET/LIST on the API; Probe, identity,
      capabilities and ListVolumes on the driver).";

/// The sidecar's configuration.
///
/// Build it with [`Config::try_parse_go`]: `--feature-gates`,
/// `--leader-election-labels` and `--vmodule` are added and merged there
/// (clap's derive cannot merge repeated values into one map).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "csi-attacher",
    version,
    about = "CSI external-attacher: makes VolumeAttachments true with ControllerPublish/ControllerUnpublish",
    override_usage = "csi-attacher [OPTIONS]\n       csi-attacher check [OPTIONS]",
    after_help = CHECK_HELP,
    disable_version_flag = true,
    args_override_self = true
)]
pub struct Config {
    /// Address of the CSI driver socket (absolute path, or unix:// and a path).
    #[arg(long, default_value = "/run/csi/socket")]
    pub csi_address: String,

    /// Timeout of waiting for a CSI call (Probe, ControllerPublish/Unpublish, ListVolumes).
    #[arg(long, default_value = "15s", value_parser = duration_flag)]
    pub timeout: Duration,

    /// Absolute path to the kubeconfig file; empty: in-cluster configuration.
    #[arg(long, default_value = "")]
    pub kubeconfig: String,

    /// Resync period for the VolumeAttachment, PersistentVolume and CSINode caches.
    #[arg(long, default_value = "10m", value_parser = duration_flag)]
    pub resync: Duration,

    /// Initial retry interval of a failed attach or detach; doubles per failure.
    #[arg(long, default_value = "1s", value_parser = duration_flag)]
    pub retry_interval_start: Duration,

    /// Maximum retry interval of a failed attach or detach.
    #[arg(long, default_value = "5m", value_parser = duration_flag)]
    pub retry_interval_max: Duration,

    /// Number of attacher worker threads (per lane).
    #[arg(long, default_value = "10", value_parser = go::parse_uint)]
    pub worker_threads: u64,

    /// Not in upstream: at most this many attaches and detaches in flight per node (0: no cap). Never below the driver's own batch per node.
    #[arg(long, default_value = "0", value_parser = go::parse_uint)]
    pub max_inflight_per_node: u64,

    /// Not in upstream: a node's first attach (none of its attaches waiting or in flight) waits this long, and the node's attaches queued meanwhile start with it, for a driver that batches a VM's attaches into one update (Azure Disk); 0: no wait. Needs --schedule-per-node.
    #[arg(long, default_value = "0s", value_parser = duration_flag)]
    pub attach_gather_window: Duration,

    /// Not in upstream: with --attach-gather-window, each attach that comes for a gathering node starts the window again, up to this long after the node's first attach, so that a node's attaches coming apart (at the controller-manager's client rate) still start together; not above the window: the window is fixed.
    #[arg(long, default_value = "0s", value_parser = duration_flag)]
    pub attach_gather_max: Duration,

    /// Not in upstream: schedule driver calls per node (nodes take turns, a failed node's detaches first, ResourceExhausted paces the node, hand-offs, polling an operation still running after a deadline); false: upstream's first-queued, first-served order.
    #[arg(long, require_equals = true, default_value = "true", value_parser = bool_flag,
          action = ArgAction::Set)]
    pub schedule_per_node: bool,

    /// Not in upstream: count a volume as detached when ControllerUnpublishVolume answers NotFound and the VA's Node object is gone (needs get on nodes).
    #[arg(long, require_equals = true, default_value = "false", value_parser = bool_flag,
          action = ArgAction::Set)]
    pub unpublish_not_found_node_gone: bool,

    /// Not in upstream: unpublish an orphan publication (listed by the driver as published with no VolumeAttachment for two reconcile passes) when its node ID is a CSINode's and that Node's status.volumesInUse does not name the volume (needs get on nodes).
    #[arg(long, require_equals = true, default_value = "false", value_parser = bool_flag,
          action = ArgAction::Set)]
    pub unpublish_orphans: bool,

    /// Not in upstream: after a driver call ends at --timeout and a retry is answered Aborted (the operation still runs), retry an eighth of the operation's time so far (at least --retry-interval-start) instead of after the doubling backoff; false: the backoff. Needs --schedule-per-node.
    #[arg(long, require_equals = true, default_value = "true", value_parser = bool_flag,
          action = ArgAction::Set)]
    pub poll_pending_after_deadline: bool,

    /// fsType of mount volumes whose PV does not set one.
    #[arg(long, default_value = "")]
    pub default_fstype: String,

    /// QPS to use while communicating with the Kubernetes API server (0: 5; < 0: no limit).
    #[arg(long, default_value = "5", value_parser = go::parse_float)]
    pub kube_api_qps: f64,

    /// Burst to use while communicating with the Kubernetes API server (0: 10).
    #[arg(long, default_value = "10", value_parser = go::parse_int)]
    pub kube_api_burst: i64,

    /// Period of the ListVolumes-based VolumeAttachment reconciler.
    #[arg(long, default_value = "1m", value_parser = duration_flag)]
    pub reconcile_sync: Duration,

    /// `max_entries` of every ListVolumes request (0: no limit). Go int, cut to 32 bits as upstream does.
    #[arg(long, default_value = "0", value_parser = int32_flag)]
    pub max_entries: i32,

    /// Truncate logged gRPC responses to this many characters (<= 0: no limit).
    #[arg(long, default_value = "-1", value_parser = go::parse_int)]
    pub max_grpc_log_length: i64,

    /// Feature gates (`--feature-gates`, merged over every occurrence); see [`Config::feature_gates`].
    #[arg(skip)]
    pub feature_gates: BTreeMap<String, bool>,

    /// Enable leader election (a Lease) so that only one replica acts.
    #[arg(long, require_equals = true, default_value = "false", value_parser = bool_flag,
          action = ArgAction::Set)]
    pub leader_election: bool,

    /// Namespace of the leader-election Lease (else $POD_NAMESPACE, the service account's, or default).
    #[arg(long, default_value = "")]
    pub leader_election_namespace: String,

    /// How long a lease is valid after its last renewal.
    #[arg(long, default_value = "15s", value_parser = duration_flag)]
    pub leader_election_lease_duration: Duration,

    /// How long the leader keeps trying to renew before it gives up.
    #[arg(long, default_value = "10s", value_parser = duration_flag)]
    pub leader_election_renew_deadline: Duration,

    /// Pause between leader-election attempts.
    #[arg(long, default_value = "5s", value_parser = duration_flag)]
    pub leader_election_retry_period: Duration,

    /// Labels put on the Lease while leading (`--leader-election-labels`, merged over every occurrence).
    #[arg(skip)]
    pub leader_election_labels: BTreeMap<String, String>,

    /// Leader-election identity (ours; default: the sanitised hostname).
    #[arg(long, default_value = "")]
    pub leader_election_identity: String,

    /// host:port of the HTTP server for metrics and health checks (empty: none).
    #[arg(long, default_value = "")]
    pub http_endpoint: String,

    /// Deprecated: like --http-endpoint but without the leader-election health check.
    #[arg(long, default_value = "")]
    pub metrics_address: String,

    /// Path of the Prometheus metrics.
    #[arg(long, default_value = "/metrics")]
    pub metrics_path: String,

    /// Go only (GOMAXPROCS from the CPU quota); accepted and ignored. `--automaxprocs=` means true.
    #[arg(long, require_equals = true, default_value = "false", value_parser = automaxprocs_flag,
          action = ArgAction::Set)]
    pub automaxprocs: bool,

    /// Go only (per-file verbosity, `pattern=N,...`, merged over every occurrence); accepted and ignored.
    #[arg(skip)]
    pub vmodule: String,

    /// Go only (klog flush period; must be > 0); accepted and ignored.
    #[arg(long, default_value = "5s", value_parser = duration_flag)]
    pub log_flush_frequency: Duration,

    /// Alpha in upstream and disabled there: enabling it is an error.
    #[arg(long, require_equals = true, default_value = "false", value_parser = bool_flag,
          action = ArgAction::Set)]
    pub log_text_split_stream: bool,

    /// Alpha in upstream and disabled there: a non-zero size (a Kubernetes quantity) is an error.
    #[arg(long, default_value = "0", value_parser = quantity_flag)]
    pub log_text_info_buffer_size: String,

    /// Alpha in upstream and disabled there: enabling it is an error.
    #[arg(long, require_equals = true, default_value = "false", value_parser = bool_flag,
          action = ArgAction::Set)]
    pub log_json_split_stream: bool,

    /// Alpha in upstream and disabled there: a non-zero size (a Kubernetes quantity) is an error.
    #[arg(long, default_value = "0", value_parser = quantity_flag)]
    pub log_json_info_buffer_size: String,

    /// Number for the log level verbosity (0-1 info, 2-4 debug, 5+ trace; at most 2^31-1).
    #[arg(long, default_value = "0", value_parser = go::parse_level)]
    pub v: u32,

    /// Log format: text or json (anything else is refused after parsing, as upstream).
    #[arg(long, default_value = "text")]
    pub logging_format: String,

    /// `check` only: report format, text or json.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,

    /// File that receives the reason of a fatal exit (not in upstream; its path is fixed there).
    #[arg(long, default_value = DEFAULT_TERMINATION_LOG)]
    pub termination_log_path: PathBuf,

    /// Print the version and exit.
    #[arg(long, require_equals = true, default_value = "false", value_parser = bool_flag,
          action = ArgAction::Set)]
    pub version: bool,

    /// Duration flags given a negative value, with the value as given: Go parses them, and
    /// [`Config::validate`] / [`Config::validate_logging`] refuse them (the field holds zero).
    #[arg(skip)]
    pub negative_durations: Vec<(String, String)>,

    /// Values raised to a sane bound by [`Config::try_parse_go`], logged by [`Config::validate`].
    #[arg(skip)]
    pub adjusted: Vec<Adjustment>,

    /// The flags given on the command line that upstream v4.12 does not define (it
    /// exits 2 on them), in the order of `--help`: what must leave the pod spec
    /// before going back ([`UPSTREAM_FLAGS`]).
    #[arg(skip)]
    pub not_in_upstream: Vec<String>,

    /// Arguments after the first non-flag argument (ignored, as Go's flag package does).
    #[arg(hide = true, trailing_var_arg = true)]
    pub rest: Vec<String>,
}

#[cfg(test)]
mod tests;
