//! The reconciliation core: caches, lanes, workers and the flows they run.
//!
//! ```text
//! watches ─▶ informers.rs ─▶ store.rs (caches)      queue.rs lanes (lane.rs):
//!                  │                                  attach ─┐
//!                  └──────── keys ──────────────────▶ detach ─┴▶ workers.rs ─▶ decision.rs
//!                                                     pv ─────▶ workers.rs ─▶ pv_finalizer.rs
//!
//! decision.rs: Step ─▶ attach.rs / detach.rs / trivial.rs ─▶ api.rs (ClusterApi), driver.rs (Driver)
//! ```
//!
//! Flows return `Ok` or the failed step; only the worker loops touch the
//! queues (forget on success, rate-limited re-add on failure). `wiring.rs`
//! builds all of it; `context.rs` holds what a flow reads and calls.

mod api;
pub mod attach;
pub mod capability;
pub mod compact;
pub mod context;
pub mod decision;
pub mod detach;
pub mod driver;
pub mod error;
pub mod events;
pub mod failing;
pub mod fenced;
pub mod flow_metrics;
pub mod informers;
pub mod lane;
pub mod names;
pub mod node_id;
pub mod patches;
pub mod pv_finalizer;
pub mod queue;
pub mod reconcile;
pub mod source;
pub mod store;
#[cfg(test)]
mod testing;
pub mod trivial;
pub mod watch_backoff;
mod wiring;
pub mod workers;

pub use api::{ClusterApi, KubeApi};
pub use context::{seconds_since, Ctx};
pub use error::{ApiError, FlowError};
pub use lane::{Lane, PV_QUEUE, VA_QUEUE};
pub use wiring::{run, Hooks, Settings};
