//! How big a run is: the full run's sizes and the smoke run's.

use std::time::Duration;

use serde_json::{json, Value};

#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub rounds: usize,
    pub nodes: usize,
    pub p1_vas: usize,
    pub p3_ours: usize,
    pub p3_other_pvs: usize,
    pub p3_other_vas: usize,
    pub p4_sequential: usize,
    pub p6_vas: usize,
    pub limit_patches: usize,
    /// How long one wait may take before the run is declared failed.
    pub deadline: Duration,
    /// Leader election timing for P5 (both attachers): lease, renew deadline, retry.
    pub lease: [&'static str; 3],
}

pub const FULL: Sizes = Sizes {
    rounds: 3,
    nodes: 100,
    p1_vas: 2000,
    p3_ours: 2000,
    p3_other_pvs: 10_000,
    p3_other_vas: 4000,
    p4_sequential: 100,
    p6_vas: 500,
    limit_patches: 3000,
    deadline: Duration::from_secs(600),
    // Upstream's defaults.
    lease: ["15s", "10s", "5s"],
};

pub const SMOKE: Sizes = Sizes {
    rounds: 1,
    nodes: 5,
    p1_vas: 20,
    p3_ours: 10,
    p3_other_pvs: 20,
    p3_other_vas: 10,
    p4_sequential: 3,
    p6_vas: 10,
    limit_patches: 50,
    deadline: Duration::from_secs(120),
    lease: ["4s", "3s", "1s"],
};

impl Sizes {
    /// results.json's `sizes`.
    pub fn to_json(self) -> Value {
        json!({
            "rounds": self.rounds, "nodes": self.nodes, "p1_vas": self.p1_vas,
            "p3_ours": self.p3_ours, "p3_other_pvs": self.p3_other_pvs,
            "p3_other_vas": self.p3_other_vas, "p4_sequential": self.p4_sequential,
            "p6_vas": self.p6_vas, "limit_patches": self.limit_patches,
        })
    }
}
