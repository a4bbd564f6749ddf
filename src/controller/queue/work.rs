//! What a worker gets from the queue: a key and why it was queued.

/// Why a key was queued. It travels with the key: [`super::WorkQueue::get`] hands
/// it to the worker, and a key queued again while it waits or runs keeps the
/// strongest reason (`Reconciler` over `Event`) until a worker takes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Trigger {
    /// A watch event, a resync or a retry.
    #[default]
    Event,
    /// The reconciler saw the driver disagree with the object's status: run
    /// the flow even though the object looks done.
    Reconciler,
}

/// A key handed to a worker, with why it was queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Work {
    /// The object's key.
    pub key: String,
    /// Why it was queued.
    pub trigger: Trigger,
}
