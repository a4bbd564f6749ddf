//! The behaviour tests, one module per file under tests/, linked into one
//! binary that starts one control plane for all of them (see Cargo.toml's
//! `[[test]]` entries for the files kept in binaries of their own).
//!
//! `cargo test --test suite <module>::` runs one file's tests, e.g.
//! `cargo test --test suite leader_election::`.

#[path = "../support/mod.rs"]
mod support;

#[path = "../attach.rs"]
mod attach;
#[path = "../bounds.rs"]
mod bounds;
#[path = "../check.rs"]
mod check;
#[path = "../csi_client.rs"]
mod csi_client;
#[path = "../deployment_corpus.rs"]
mod deployment_corpus;
#[path = "../detach.rs"]
mod detach;
#[path = "../events.rs"]
mod events;
#[path = "../http_endpoint.rs"]
mod http_endpoint;
#[path = "../interop_csi_test.rs"]
mod interop_csi_test;
#[path = "../kube_roundtrip.rs"]
mod kube_roundtrip;
#[path = "../leader_election.rs"]
mod leader_election;
#[path = "../logging.rs"]
mod logging;
#[path = "../malformed_driver.rs"]
mod malformed_driver;
#[path = "../malformed_flags.rs"]
mod malformed_flags;
#[path = "../malformed_http.rs"]
mod malformed_http;
#[path = "../malformed_objects.rs"]
mod malformed_objects;
#[path = "../migration.rs"]
mod migration;
#[path = "../monitoring.rs"]
mod monitoring;
#[path = "../process.rs"]
mod process;
#[path = "../properties_go.rs"]
mod properties_go;
#[path = "../properties_migration.rs"]
mod properties_migration;
#[path = "../properties_pager.rs"]
mod properties_pager;
#[path = "../rbac.rs"]
mod rbac;
#[path = "../rbac_manifest.rs"]
mod rbac_manifest;
#[path = "../reconcile.rs"]
mod reconcile;
#[path = "../release.rs"]
mod release;
#[path = "../scale.rs"]
mod scale;
#[path = "../socket_permissions.rs"]
mod socket_permissions;
#[path = "../surface.rs"]
mod surface;
