//! How big a run is: the full run's sizes and the smoke run's.

use std::time::Duration;

use serde_json::{json, Value};

use crate::p8::{Case, Flags, Profile};

/// One step of the growth curves: our VAs attached and detached among PVs and
/// VAs of another driver.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Deserialize)]
pub struct GrowthSize {
    pub vas: usize,
    pub foreign_pvs: usize,
    pub foreign_vas: usize,
}

impl GrowthSize {
    /// How a metric name and a results.md row say it: "1000 VAs, 10000 foreign PVs".
    pub fn label(self) -> String {
        format!("{} VAs, {} foreign PVs", self.vas, self.foreign_pvs)
    }
}

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
    /// P1 at drivers' worker counts: the `--worker-threads` values ...
    pub p1w_workers: &'static [u32],
    /// ... each at these `--kube-api-qps`/`--kube-api-burst` ...
    pub p1w_qps: &'static [(u32, u32)],
    /// ... with as many VAs as the client's budget attaches in this many
    /// seconds (at most `p1_vas`, see [`p1_vas_for`]).
    pub p1w_seconds: f64,
    /// P4 under load: VAs created at once, with the side probe's patches.
    pub p4_load: usize,
    /// P7: outages of each kind per attacher per round, and how long each lasts.
    pub p7_outages: usize,
    pub p7_down: Duration,
    /// P7's leader election timing: long enough to outlive an outage.
    pub p7_lease: [&'static str; 3],
    /// The growth curves' steps, smallest first.
    pub growth: &'static [GrowthSize],
    /// P8: what users wait for.
    pub p8: P8Sizes,
    /// What the attachers cost the API server and etcd (`scenarios/cost.rs`).
    pub cost: CostSizes,
}

/// The cost scenario's sizes.
#[derive(Clone, Copy, Debug)]
pub struct CostSizes {
    /// VAs attached and detached in one burst (QPS 10,000) for the CPU per 1,000.
    pub cycles: usize,
    /// The start-up and re-list steps: PVs of another driver, smallest first
    /// (and [`CostSizes::foreign_vas`] VAs of it).
    pub foreign_pvs: &'static [usize],
}

impl CostSizes {
    /// The other driver's VAs beside `foreign_pvs` of its PVs: 40 %.
    pub fn foreign_vas(foreign_pvs: usize) -> usize {
        foreign_pvs * 2 / 5
    }
}

/// P8's runs (`scenarios/p8.rs`): nodes and volumes of each case, the cap
/// of a run and the mock driver's time scale.
#[derive(Clone, Copy, Debug)]
pub struct P8Sizes {
    /// Rounds of P8 (each round runs every profile, case and flag set).
    pub rounds: usize,
    /// The profiles `--only p8` (or no `--only`) runs; `p8-<profile>` runs
    /// that one whatever the size.
    pub profiles: &'static [Profile],
    /// The flag sets each profile runs at.
    pub flags: &'static [Flags],
    /// The cases each profile runs, in [`Case::ALL`]'s order.
    pub cases: &'static [Case],
    /// Scale-up: new nodes × volumes each.
    pub scale_nodes: usize,
    pub scale_per_node: usize,
    /// Drain: drained nodes (each to a node of its own) × volumes each.
    pub drain_nodes: usize,
    pub drain_per_node: usize,
    /// Node failure: volumes on the failed node, and the nodes they move to.
    pub failure_volumes: usize,
    pub failure_targets: usize,
    /// Noisy neighbour: the big node's VAs beside small nodes × VAs each.
    pub noisy_big: usize,
    pub noisy_small_nodes: usize,
    pub noisy_small_per_node: usize,
    /// A VA not attached this long after its run's start is recorded as
    /// this (a lower bound); the setup of drain and node failure gets as long.
    pub cap: Duration,
    /// The mock driver's `--time-scale` (every profile duration × this);
    /// `None`: the profiles' own durations.
    pub time_scale: Option<f64>,
    /// The burst cases' (scale-up, noisy neighbour) VAs created at this
    /// many per second, one after another (`--p8-create-qps`); `None`: all
    /// at once.
    pub create_qps: Option<f64>,
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
    p1w_workers: &[100, 1000],
    p1w_qps: &[(20, 100), (200, 400), (10_000, 10_000)],
    p1w_seconds: 12.0,
    p4_load: 1000,
    p7_outages: 5,
    p7_down: Duration::from_secs(8),
    p7_lease: ["60s", "40s", "5s"],
    growth: &[
        GrowthSize {
            vas: 1000,
            foreign_pvs: 10_000,
            foreign_vas: 4000,
        },
        GrowthSize {
            vas: 5000,
            foreign_pvs: 50_000,
            foreign_vas: 20_000,
        },
        GrowthSize {
            vas: 10_000,
            foreign_pvs: 100_000,
            foreign_vas: 40_000,
        },
    ],
    p8: P8Sizes {
        rounds: 1,
        profiles: &Profile::MAIN,
        flags: &Flags::ALL,
        cases: &Case::ALL,
        scale_nodes: 40,
        scale_per_node: 10,
        drain_nodes: 10,
        drain_per_node: 10,
        failure_volumes: 20,
        failure_targets: 10,
        noisy_big: 100,
        noisy_small_nodes: 39,
        noisy_small_per_node: 2,
        cap: Duration::from_secs(600),
        time_scale: None,
        create_qps: None,
    },
    cost: CostSizes {
        cycles: 2000,
        foreign_pvs: &[10_000, 50_000, 100_000],
    },
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
    p1w_workers: &[100],
    p1w_qps: &[(20, 100)],
    p1w_seconds: 12.0,
    p4_load: 10,
    p7_outages: 1,
    p7_down: Duration::from_secs(1),
    p7_lease: ["60s", "40s", "5s"],
    growth: &[
        GrowthSize {
            vas: 10,
            foreign_pvs: 20,
            foreign_vas: 10,
        },
        GrowthSize {
            vas: 20,
            foreign_pvs: 40,
            foreign_vas: 20,
        },
    ],
    p8: P8Sizes {
        rounds: 1,
        // All four profiles at once, their durations scaled by --time-scale,
        // at their charts' flags only (the harness is the same at upstream's).
        profiles: &Profile::MAIN,
        flags: &[Flags::Chart],
        cases: &Case::ALL,
        scale_nodes: 2,
        scale_per_node: 2,
        drain_nodes: 2,
        drain_per_node: 2,
        failure_volumes: 2,
        failure_targets: 2,
        noisy_big: 4,
        noisy_small_nodes: 2,
        noisy_small_per_node: 2,
        cap: Duration::from_secs(60),
        time_scale: Some(0.02),
        create_qps: None,
    },
    cost: CostSizes {
        cycles: 20,
        foreign_pvs: &[200],
    },
};

/// API writes one attach costs the attacher's client when the PV lacks its
/// finalizer (PV finalizer, VA finalizer, VA status), both binaries.
pub const WRITES_PER_ATTACH: f64 = 3.0;

/// How many VAs a P1 run at `qps`/`burst` gets: what the client-side rate
/// limiter lets through in `seconds` of attaching (the burst spent first, then
/// `qps` writes a second, [`WRITES_PER_ATTACH`] each), at most `cap`, at least 1.
/// Detaching them takes about as long again.
pub fn p1_vas_for(qps: u32, burst: u32, seconds: f64, cap: usize) -> usize {
    let writes = f64::from(qps) * seconds + f64::from(burst);
    let vas = (writes / WRITES_PER_ATTACH).floor();
    if vas >= cap as f64 {
        cap
    } else {
        (vas as usize).max(1)
    }
}

impl Sizes {
    /// results.json's `sizes`.
    pub fn to_json(self) -> Value {
        json!({
            "rounds": self.rounds, "nodes": self.nodes, "p1_vas": self.p1_vas,
            "p3_ours": self.p3_ours, "p3_other_pvs": self.p3_other_pvs,
            "p3_other_vas": self.p3_other_vas, "p4_sequential": self.p4_sequential,
            "p6_vas": self.p6_vas, "limit_patches": self.limit_patches,
            "p1w_workers": self.p1w_workers,
            "p1w_qps": self.p1w_qps.iter().map(|(q, b)| json!({"qps": q, "burst": b, "vas": self.p1w_vas(*q, *b)})).collect::<Vec<_>>(),
            "p4_load": self.p4_load,
            "p7_outages": self.p7_outages, "p7_down_s": self.p7_down.as_secs_f64(),
            "growth": self.growth.iter().map(|g| json!({"vas": g.vas, "foreign_pvs": g.foreign_pvs, "foreign_vas": g.foreign_vas})).collect::<Vec<_>>(),
            "p8": self.p8.to_json(),
            "cost": {"cycles": self.cost.cycles, "foreign_pvs": self.cost.foreign_pvs},
        })
    }

    /// VAs of a P1-at-workers run at `qps`/`burst`.
    pub fn p1w_vas(self, qps: u32, burst: u32) -> usize {
        p1_vas_for(qps, burst, self.p1w_seconds, self.p1_vas)
    }
}

impl P8Sizes {
    pub fn to_json(self) -> Value {
        json!({
            "rounds": self.rounds,
            "profiles": self.profiles.iter().map(|p| p.name()).collect::<Vec<_>>(),
            "scale_nodes": self.scale_nodes, "scale_per_node": self.scale_per_node,
            "drain_nodes": self.drain_nodes, "drain_per_node": self.drain_per_node,
            "failure_volumes": self.failure_volumes, "failure_targets": self.failure_targets,
            "noisy_big": self.noisy_big, "noisy_small_nodes": self.noisy_small_nodes,
            "noisy_small_per_node": self.noisy_small_per_node,
            "cap_s": self.cap.as_secs_f64(), "time_scale": self.time_scale,
            "create_qps": self.create_qps,
        })
    }

    /// How results.md says the sizes.
    pub fn describe(self) -> String {
        format!(
            "scale-up {} nodes × {} volumes; drain {} nodes × {} volumes to {} others; node failure \
             {} volumes to {} nodes; noisy neighbour {} VAs on one node beside {} nodes × {}; cap {} s{}{}",
            self.scale_nodes,
            self.scale_per_node,
            self.drain_nodes,
            self.drain_per_node,
            self.drain_nodes,
            self.failure_volumes,
            self.failure_targets,
            self.noisy_big,
            self.noisy_small_nodes,
            self.noisy_small_per_node,
            self.cap.as_secs_f64(),
            self.time_scale
                .map(|f| format!("; the mock driver's --time-scale={f}"))
                .unwrap_or_default(),
            self.create_qps
                .map(|q| format!("; a burst's VAs created {q} per second"))
                .unwrap_or_default()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p1_runs_are_sized_by_their_qps() {
        // QPS 20, burst 100, 12 s: (240 + 100) writes / 3 = 113 VAs.
        assert_eq!(p1_vas_for(20, 100, 12.0, 2000), 113);
        // QPS 200, burst 400: (2400 + 400) / 3 = 933.
        assert_eq!(p1_vas_for(200, 400, 12.0, 2000), 933);
        // QPS 10,000: the cap (2,000 VAs, as P1 elsewhere).
        assert_eq!(p1_vas_for(10_000, 10_000, 12.0, 2000), 2000);
        // Smoke: the cap of 20 wins everywhere.
        assert_eq!(SMOKE.p1w_vas(20, 100), 20);
        // Never zero.
        assert_eq!(p1_vas_for(0, 0, 12.0, 2000), 1);
        // A full run stays near the ~30 s a run may take: attaching at the
        // client's budget takes `seconds`, detaching about as long.
        for &(qps, burst) in FULL.p1w_qps {
            let vas = FULL.p1w_vas(qps, burst) as f64;
            let attach_s = (vas * WRITES_PER_ATTACH - f64::from(burst)).max(0.0) / f64::from(qps);
            assert!(
                attach_s <= FULL.p1w_seconds + 0.1,
                "QPS {qps}: {attach_s} s"
            );
        }
    }

    #[test]
    fn growth_steps_grow() {
        for sizes in [FULL, SMOKE] {
            assert!(sizes.growth.len() >= 2);
            for pair in sizes.growth.windows(2) {
                assert!(pair[0].vas < pair[1].vas);
                assert!(pair[0].foreign_pvs <= pair[1].foreign_pvs);
                assert!(pair[0].foreign_vas <= pair[1].foreign_vas);
            }
            for pair in sizes.cost.foreign_pvs.windows(2) {
                assert!(pair[0] < pair[1]);
            }
            // Foreign VAs each name a foreign PV.
            for g in sizes.growth {
                assert!(g.foreign_vas <= g.foreign_pvs);
            }
        }
        assert_eq!(FULL.growth[0].label(), "1000 VAs, 10000 foreign PVs");
        assert_eq!(CostSizes::foreign_vas(100_000), 40_000);
    }
}
