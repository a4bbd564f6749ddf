//! The lanes of the work queues: which flow a key is waiting for.
//!
//! The VA queue has an attach and a detach lane (a VA moves to the detach lane
//! once it is being deleted); the PV queue has one lane. A lane's name is its
//! label in metrics (`csi_attacher_sync_panics_total`, the lane gauges) and
//! its field in logs.

pub use crate::controller::model::Lane;

/// The lanes of one queue: a closed set, each lane with its place in the
/// queue and its label. A queue only takes its own lane type, so a lane of
/// another queue (or an index past the last lane) cannot be passed.
pub trait QueueLane: Copy + Eq + std::fmt::Debug + Send + Sync + 'static {
    /// Every lane, in queue order: `ALL[l.index()] == l`.
    const ALL: &'static [Self];
    /// The lane's place in [`Self::ALL`].
    fn index(self) -> usize;
    /// The lane's label in metrics and logs.
    fn name(self) -> &'static str;
}

/// The PV queue's one lane: PersistentVolumes whose finalizer needs a look.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PvLane;

/// Name of the VA queue (workqueue metrics label, as upstream).
pub const VA_QUEUE: &str = "csi-attacher-va";
/// Name of the PV queue.
pub const PV_QUEUE: &str = "csi-attacher-pv";

impl QueueLane for Lane {
    const ALL: &'static [Lane] = &[Lane::Attach, Lane::Detach];

    fn index(self) -> usize {
        match self {
            Lane::Attach => 0,
            Lane::Detach => 1,
        }
    }

    fn name(self) -> &'static str {
        Lane::name(self)
    }
}

impl PvLane {
    /// The lane's label in metrics and logs.
    pub const NAME: &'static str = "pv";
}

impl QueueLane for PvLane {
    const ALL: &'static [PvLane] = &[PvLane];

    fn index(self) -> usize {
        0
    }

    fn name(self) -> &'static str {
        PvLane::NAME
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_indexes_are_the_queues_own() {
        // Metric label values are part of the interface: never change them.
        let names = |lanes: &[Lane]| lanes.iter().map(|l| l.name()).collect::<Vec<_>>();
        assert_eq!(names(Lane::ALL), ["attach", "detach"]);
        assert_eq!(QueueLane::name(PvLane), "pv");
        for (i, lane) in Lane::ALL.iter().enumerate() {
            assert_eq!(lane.index(), i);
        }
        assert_eq!(PvLane.index(), 0);
    }
}
