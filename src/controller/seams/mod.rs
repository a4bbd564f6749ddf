//! The seams between the flows and the world, each a trait with the real
//! implementation here and an in-memory fake in `testing`:
//!
//! - `cluster`: [`cluster::ClusterApi`], every API read and write a flow
//!   makes ([`cluster::KubeApi`] the real one; the urgent client chosen by
//!   the patch's type);
//! - `driver`: [`driver::Driver`], the controller RPCs ([`crate::csi::Client`]);
//! - `fenced`: [`fenced::FencedDriver`], the only way to the driver, with
//!   the leadership window inside, and where every answer arrives: the
//!   Publishes owed an Unpublish are kept there.

pub mod cluster;
pub mod driver;
pub mod fenced;
pub mod patches;
