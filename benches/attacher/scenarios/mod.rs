//! The code of each scenario of [`crate::plan::Scenario`].

mod limit;
mod p1;
mod p3;
mod p4;
mod p5;
mod p6;
mod unthrottled;

use anyhow::Result;

use crate::harness::Harness;
use crate::plan::Scenario;
use crate::process::Which;

/// Runs `scenario` once: for `which` attacher (Limit runs no attacher and
/// ignores it).
pub async fn run(scenario: Scenario, h: &Harness, which: Which) -> Result<()> {
    match scenario {
        Scenario::Limit => limit::run(h).await,
        Scenario::P1Qps200 => p1::run(h, which).await,
        Scenario::Unthrottled => unthrottled::run(h, which).await,
        Scenario::P3Memory => p3::run(h, which).await,
        Scenario::P5Failover => p5::run(h, which).await,
        Scenario::P6HeadOfLine => p6::run(h, which).await,
    }
}

/// What P3 needs before its rounds: the objects of another driver.
pub async fn prepare_p3(h: &Harness) -> Result<()> {
    p3::foreign_objects(h).await
}
