//! Which flow a VA needs: [`Lane`], read off the view. The work queue keeps
//! a sub-queue per lane (`queue::QueueLane`), the metrics and logs label by it.

use crate::controller::model::CachedVa;

/// The flow a VA needs, and its lane in the VA queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lane {
    /// Live VolumeAttachments: the attach flow.
    Attach,
    /// Deleted VolumeAttachments: the detach flow.
    Detach,
}

impl Lane {
    /// The lane's label in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Lane::Attach => "attach",
            Lane::Detach => "detach",
        }
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
