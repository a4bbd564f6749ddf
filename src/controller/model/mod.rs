//! The views the caches hold: [`CachedVa`] and [`CachedPv`], the controller's
//! domain model of a VolumeAttachment and a PersistentVolume.
//!
//! The watches decode straight into them ([`Deserialize`]), once per event;
//! the stores hold them, and every flow, the informers, the reconciler, the
//! patch builders and the Events read them through their accessors. No
//! k8s-openapi `VolumeAttachment` or `PersistentVolume` is built on the way,
//! and none is rebuilt from a view.
//!
//! Why not the k8s-openapi structs: they keep every optional field inline. A
//! `VolumeAttachment` is 3.6 KB and a `PersistentVolume` 3.5 KB before any of
//! their strings, almost all of it the thirty-odd volume sources a PV spec may
//! have (a VA carries one for its inline spec). Each non-empty `BTreeMap`
//! (labels, annotations, capacity, attachment metadata) costs a 0.5 KB node
//! however few entries it has. The views keep maps as sorted slices of pairs
//! and box what is rarely set; `managedFields` (often the largest part of an
//! object, and read by nothing here) is skipped by the parser instead of being
//! built and dropped.
//!
//! kube-runtime's store keys objects through [`Lookup`], which the views
//! implement. Its watcher needs a `kube::Resource`; [`Wire`] is the one type
//! that is, and only at the watch boundary.
//!
//! The files: `docs/architecture.md`, the module map.
//!
//! [`Deserialize`]: serde::Deserialize
//! [`Lookup`]: kube::runtime::reflector::Lookup

mod lane;
mod lookup;
mod meta;
pub mod names;
pub mod proto;
mod pv;
pub mod store;
mod va;
mod wire;

pub use lane::Lane;
pub use pv::{CachedPv, CompactPvSpec};
pub use va::{CachedVa, CompactVaStatus};
pub use wire::Wire;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;
