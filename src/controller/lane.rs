//! The lanes of the work queues: which flow a key is waiting for.
//!
//! The VA queue has an attach and a detach lane (a VA moves to the detach lane
//! once it is being deleted); the PV queue has one lane. A lane's [`Lane::name`]
//! is its label in metrics (`csi_attacher_sync_panics_total`, the lane gauges)
//! and its field in logs.

use super::compact::CachedVa;

/// One lane of one queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lane {
    /// Live VolumeAttachments: the attach flow.
    Attach,
    /// Deleted VolumeAttachments: the detach flow.
    Detach,
    /// PersistentVolumes whose finalizer needs a look.
    Pv,
}

/// Name of the VA queue (workqueue metrics label, as upstream).
pub const VA_QUEUE: &str = "csi-attacher-va";
/// Name of the PV queue.
pub const PV_QUEUE: &str = "csi-attacher-pv";

impl Lane {
    /// The VA queue's lanes, in queue order.
    pub const VA: [Lane; 2] = [Lane::Attach, Lane::Detach];
    /// The PV queue's lanes.
    pub const PV: [Lane; 1] = [Lane::Pv];

    /// The lane's label in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Lane::Attach => "attach",
            Lane::Detach => "detach",
            Lane::Pv => "pv",
        }
    }

    /// The lane's index in its queue.
    pub fn index(self) -> usize {
        match self {
            Lane::Attach | Lane::Pv => 0,
            Lane::Detach => 1,
        }
    }

    /// The labels of `lanes`, in order (for the queue's metrics).
    pub fn names<const N: usize>(lanes: [Lane; N]) -> [&'static str; N] {
        lanes.map(Lane::name)
    }

    /// The lane `va` belongs in: detach once it is being deleted.
    pub fn of_va(va: &CachedVa) -> Lane {
        if va.is_deleting() {
            Lane::Detach
        } else {
            Lane::Attach
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_indexes_are_the_queues_own() {
        // Metric label values are part of the interface: never change them.
        assert_eq!(Lane::names(Lane::VA), ["attach", "detach"]);
        assert_eq!(Lane::names(Lane::PV), ["pv"]);
        for lanes in [&Lane::VA[..], &Lane::PV[..]] {
            for (i, lane) in lanes.iter().enumerate() {
                assert_eq!(lane.index(), i);
            }
        }
    }
}
