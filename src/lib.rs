//! csi-attacher: the Kubernetes CSI external-attacher sidecar, in Rust.
//!
//! ```text
//!  kube-apiserver ──watch──▶ reflectors (VA, PV, CSINode; own-driver objects only)
//!                                │
//!                          work queues (attach, detach, PV lanes)
//!                                │
//!             attach flow / detach flow / PV finalizer flow
//!                                │
//!        CSI client (tonic over UDS; per-call deadline; metrics) ──▶ driver socket
//! ```
//!
//! README.md and `docs/` (index: `docs/README.md`; the compatibility contract, the architecture,
//! operations, migration guide, bounds, chaos suite, malformed inputs) say what it
//! does for operators; each module's doc says how.

pub mod check;
pub mod config;
pub mod controller;
pub mod csi;
pub mod gofmt;
pub mod http;
pub mod kube_client;
pub mod leader;
pub mod logging;
pub mod metrics;
pub mod migration;
pub mod run;

pub use run::run;
