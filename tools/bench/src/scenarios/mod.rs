//! The code of each scenario of [`crate::plan::Scenario`].

mod cost;
mod floor;
mod growth;
mod limit;
mod p1;
mod p3;
mod p4;
mod p5;
mod p6;
mod p7;
mod p8;
mod unthrottled;

use anyhow::{bail, Result};

use crate::harness::Harness;
use crate::p8::Profile;
use crate::plan::Scenario;
use crate::process::Which;
use crate::sizes::GrowthSize;

/// Runs `scenario` once: for `which` attacher (Limit runs no attacher, Floor
/// the floor attacher; both ignore it).
pub async fn run(scenario: Scenario, h: &Harness, which: Which) -> Result<()> {
    match scenario {
        Scenario::Limit => limit::run(h).await,
        Scenario::Floor => floor::run(h).await,
        Scenario::P1Qps200 => p1::run(h, which).await,
        Scenario::Unthrottled => unthrottled::run(h, which).await,
        Scenario::P3Memory => p3::run(h, which).await,
        Scenario::P5Failover => p5::run(h, which).await,
        Scenario::P6HeadOfLine => p6::run(h, which).await,
        Scenario::P1Workers => p1::at_workers(h, which).await,
        Scenario::P4Load => p4::under_load(h, which).await,
        Scenario::P7Recovery => p7::run(h, which).await,
        Scenario::Growth => bail!("the growth curves run by size: scenarios::growth_step"),
        Scenario::P8 => bail!("P8 runs its attachers at once: scenarios::p8_round"),
        Scenario::Cost => bail!("the cost scenario runs by phase: scenarios::cost_*"),
    }
}

/// What P3 needs before its rounds: the objects of another driver.
pub async fn prepare_p3(h: &Harness) -> Result<()> {
    p3::foreign_objects(h).await
}

/// The objects of another driver of one growth step (what is missing of them).
pub async fn prepare_growth(h: &Harness, size: GrowthSize) -> Result<()> {
    growth::prepare(h, size).await
}

/// One growth step for `which`.
pub async fn growth_step(h: &Harness, which: Which, size: GrowthSize) -> Result<()> {
    growth::run(h, which, size).await
}

/// One round of P8 for `profiles` (at once), the attachers of `sides` at once.
pub async fn p8_round(
    h: &Harness,
    profiles: &[Profile],
    sides: &[Which],
    round: usize,
) -> Result<()> {
    p8::run(h, profiles, sides, round).await
}

/// One round of the cost per 1,000 attach+detach: the workload alone, then
/// each of `sides`, one after the other.
pub async fn cost_cycles(h: &Harness, sides: &[Which]) -> Result<()> {
    cost::cycles(h, sides).await
}

/// The cost scenario's objects of another driver: `foreign_pvs` PVs, 40 % as many VAs.
pub async fn prepare_cost(h: &Harness, foreign_pvs: usize) -> Result<()> {
    cost::prepare(h, foreign_pvs).await
}

/// Start-up and re-list of `which` among them.
pub async fn cost_startup(h: &Harness, which: Which, foreign_pvs: usize) -> Result<()> {
    cost::startup(h, which, foreign_pvs).await
}

/// Removes the cost scenario's objects of another driver.
pub async fn remove_cost_foreign(h: &Harness) -> Result<()> {
    cost::remove_foreign(h).await
}
