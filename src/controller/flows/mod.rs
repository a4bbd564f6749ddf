//! The flows: what one sync does to make a VolumeAttachment (or a PV's
//! finalizer) true, and the pure parts they plan with.
//!
//! - `attach`, `detach`, `trivial`: the VA flows; `pv_finalizer`: a PV's
//!   finalizer released once no VA needs it;
//! - `source`, `capability`, `node_id`: the plan (pure): VA → CSI volume →
//!   capability, which node IDs to publish to or unpublish from; `request`:
//!   the Publish request but for its node ID and secrets' values (the write
//!   bodies the flows send are built by `seams::patches`);
//! - `metrics`: the flows' metric families;
//! - `undo`: Publishes owed an Unpublish after their VA went away.
//!
//! A flow returns `Ok` or the step that failed; it never touches the queue
//! and never decides what is saved on the VA (`sync` does both).

pub mod attach;
pub mod capability;
pub mod detach;
pub mod metrics;
pub mod node_id;
pub mod pv_finalizer;
pub mod request;
pub mod source;
pub mod trivial;
