//! The views the caches hold: [`CachedVa`] and [`CachedPv`], the controller's
//! domain model of a VolumeAttachment and a PersistentVolume.
//!
//! The watches decode each event's protobuf into the few fields the views
//! keep (`proto`), and compact those into a view through a short-lived
//! k8s-openapi object that has only them set; JSON (`check`, the tests)
//! decodes straight into the views ([`Deserialize`]). The stores hold the
//! views, and every flow, the informers, the reconciler, the patch builders
//! and the Events read them through their accessors; no k8s-openapi object is
//! kept or rebuilt from a view.
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
//! implement. kube's `Api` (the watches' requests, `check`'s lists) needs a
//! `kube::Resource`; [`Wire`] is the one type that is, and only at that
//! boundary.
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
