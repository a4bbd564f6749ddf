//! The reconciliation core: caches, lanes, workers and the flows they run,
//! in five rooms one VolumeAttachment passes through in order:
//!
//! ```text
//! watch/ ──keys──▶ queue (lanes: queue/lane.rs) ──▶ sync/ ──step──▶ flows/ ──▶ seams/
//!  informers,       client-go semantics, Trigger      worker loops,     attach, detach,    cluster (API),
//!  caches (model/)  per key, ceiling per lane         decide, the one   trivial, pv_final- fenced driver
//!                                                     error policy      izer; plan, patches (leadership)
//! ```
//!
//! `model/` is the domain (the cached views, stores, names) and imports no
//! room; `reconcile.rs` queues mismatches with `Trigger::Reconciler`;
//! `events.rs` posts Warning Events; `context.rs` holds what a flow reads and
//! calls; `wiring.rs` builds all of it and is the only file that knows every
//! other. No file imports one that imports it back (`hack/cycles.py`).

pub mod context;
pub mod error;
pub mod events;
pub mod flows;
pub mod model;
pub mod queue;
pub mod reconcile;
pub mod seams;
pub mod sync;
#[cfg(test)]
mod testing;
pub mod watch;
mod wiring;

pub use queue::Gather;
pub use wiring::{run, Hooks, Settings};
