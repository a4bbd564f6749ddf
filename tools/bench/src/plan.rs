//! The scenarios and the order a run takes them in.

use crate::cli::Key;

/// One named scenario (code in `scenarios/`). Each one, but Limit, starts its
/// own attacher; the main loop runs it for upstream, then ours.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Scenario {
    /// The API server's own ceiling, no attacher.
    Limit,
    /// P1 at `--kube-api-qps=200`: attach and detach rates, API writes.
    P1Qps200,
    /// P1 at QPS 10,000 (the client limit out of the way), and from the same
    /// burst P2's CPU and P4's latency under load; then P4 one VA at a time.
    Unthrottled,
    /// P3: peak RSS among objects of another driver.
    P3Memory,
    /// P5: leader failover after SIGTERM and after SIGKILL.
    P5Failover,
    /// P6: a new VA's attach during a slow detach storm.
    P6HeadOfLine,
    /// P1 at drivers' worker counts (100, 1,000) and three QPS each.
    P1Workers,
    /// P4 with `p4_load` VAs in flight, and the API server's own status-patch
    /// latency probed during that load.
    P4Load,
    /// P7: time to a new VA attached after an API server restart and after an
    /// etcd stall.
    P7Recovery,
    /// P1's rates, P2's CPU and P3's RSS at growing sizes (after P3: its
    /// objects of another driver are the first step's).
    Growth,
    /// The floor attacher ([`crate::floor`]) through the QPS 10,000 run and
    /// P1 at 100 workers: the floor under P2's CPU, the ceiling over P1.
    Floor,
    /// P8: what users wait for, per driver profile (after the rounds, with
    /// rounds of its own; upstream and ours at the same time).
    P8,
    /// What the attachers cost the API server and etcd (after the rounds,
    /// before P3; upstream, then ours, never at once).
    Cost,
}

impl Scenario {
    /// What each round runs, in order. P3 runs after the rounds (its objects
    /// of another driver are created once and stay).
    pub const ROUND: [Scenario; 9] = [
        Scenario::Limit,
        Scenario::P1Qps200,
        Scenario::Unthrottled,
        Scenario::Floor,
        Scenario::P5Failover,
        Scenario::P6HeadOfLine,
        Scenario::P1Workers,
        Scenario::P4Load,
        Scenario::P7Recovery,
    ];

    /// The `--only` keys that select it: those whose metrics it records.
    pub fn keys(self) -> &'static [Key] {
        match self {
            // P1 at workers compares its rate with the round's Limit.
            Scenario::Limit => &[Key::Limit, Key::P1Workers],
            Scenario::P1Qps200 => &[Key::P1],
            Scenario::Unthrottled => &[Key::P1, Key::P2, Key::P4],
            Scenario::P3Memory => &[Key::P3],
            Scenario::P5Failover => &[Key::P5],
            Scenario::P6HeadOfLine => &[Key::P6],
            Scenario::P1Workers => &[Key::P1Workers],
            Scenario::P4Load => &[Key::P4Load],
            Scenario::P7Recovery => &[Key::P7],
            Scenario::Growth => &[Key::Growth],
            // The reference of P2's CPU and of P1 at 100 workers.
            Scenario::Floor => &[Key::Floor, Key::P2, Key::P1Workers],
            Scenario::P8 => &[
                Key::P8,
                Key::P8AwsEbs,
                Key::P8AzureDisk,
                Key::P8AzureDiskFast,
                Key::P8GcePd,
                Key::P8SerialPerNode,
            ],
            Scenario::Cost => &[Key::Cost],
        }
    }

    /// Its name in the progress lines.
    pub fn title(self) -> &'static str {
        match self {
            Scenario::Limit => "Limit",
            Scenario::P1Qps200 => "P1 QPS 200",
            Scenario::Unthrottled => "P1/P2/P4 QPS 10000",
            Scenario::P3Memory => "P3",
            Scenario::P5Failover => "P5",
            Scenario::P6HeadOfLine => "P6",
            Scenario::P1Workers => "P1 at workers",
            Scenario::P4Load => "P4 under load",
            Scenario::P7Recovery => "P7",
            Scenario::Growth => "Growth",
            Scenario::Floor => "Floor attacher",
            Scenario::P8 => "P8",
            Scenario::Cost => "Cost",
        }
    }

    /// Whether it runs once per attacher (all but Limit and Floor, which
    /// run once a round).
    pub fn per_attacher(self) -> bool {
        !matches!(self, Scenario::Limit | Scenario::Floor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_selects_a_scenario() {
        let all: Vec<Scenario> = Scenario::ROUND
            .into_iter()
            .chain([
                Scenario::P3Memory,
                Scenario::Growth,
                Scenario::P8,
                Scenario::Cost,
            ])
            .collect();
        for key in [
            Key::Limit,
            Key::P1,
            Key::P2,
            Key::P3,
            Key::P4,
            Key::P5,
            Key::P6,
            Key::P1Workers,
            Key::P4Load,
            Key::P7,
            Key::Growth,
            Key::Floor,
            Key::P8,
            Key::P8AwsEbs,
            Key::P8AzureDisk,
            Key::P8AzureDiskFast,
            Key::P8GcePd,
            Key::P8SerialPerNode,
            Key::Cost,
        ] {
            assert!(
                all.iter().any(|s| s.keys().contains(&key)),
                "{key:?} selects nothing"
            );
        }
        // P2 and P4 are measured by the QPS 10,000 run only.
        assert!(Scenario::Unthrottled.keys().contains(&Key::P2));
        assert!(!Scenario::P1Qps200.keys().contains(&Key::P4));
        // P1 at workers needs the round's Limit for its goal row.
        assert!(Scenario::Limit.keys().contains(&Key::P1Workers));
        // Growth and P8 run after the rounds, not in them.
        assert!(!Scenario::ROUND.contains(&Scenario::Growth));
        assert!(!Scenario::ROUND.contains(&Scenario::P8));
        assert!(!Scenario::ROUND.contains(&Scenario::Cost));
        for (key, _) in Key::P8_PROFILES {
            assert!(Scenario::P8.keys().contains(&key), "{key:?}");
        }
    }
}
