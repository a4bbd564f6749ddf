//! The leader-election metrics ([`Metrics`]), as client-go names them.

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

/// The `name` label of the leader-election metrics: client-go puts
/// `LeaderElectionConfig.Name` there, which csi-lib-utils never sets, so
/// upstream's series carry `name=""` and dashboards select on that.
pub(super) const METRIC_NAME_LABEL: &str = "";

/// `leader_election_master_status` and `leader_election_slowpath_total`.
#[derive(Clone)]
pub struct Metrics {
    pub(super) master_status: IntGaugeVec,
    pub(super) slowpath: IntCounterVec,
}

impl Metrics {
    /// Registers both families in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let master_status = IntGaugeVec::new(
            Opts::new(
                "leader_election_master_status",
                "[ALPHA] Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.",
            ),
            &["name"],
        )?;
        let slowpath = IntCounterVec::new(
            Opts::new(
                "leader_election_slowpath_total",
                "[ALPHA] Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease. Please make sure to group by name.",
            ),
            &["name"],
        )?;
        registry.register(Box::new(master_status.clone()))?;
        registry.register(Box::new(slowpath.clone()))?;
        Ok(Self {
            master_status,
            slowpath,
        })
    }
}
