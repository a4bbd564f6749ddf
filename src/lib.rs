//! csi-attacher: the Kubernetes CSI external-attacher sidecar, in Rust. README.md
//! and `docs/` (index: `docs/README.md`; the architecture: `docs/architecture.md`)
//! say what it does for operators; each module's doc says how.

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
