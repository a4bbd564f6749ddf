//! The behaviour tests, one module per file under tests/, linked into one
//! binary that starts one control plane for all of them (see Cargo.toml's
//! `[[test]]` entries for the files kept in binaries of their own).
//!
//! `cargo test --test suite <module>::` runs one file's tests, e.g.
//! `cargo test --test suite leader_election::`.

// Tests may unwrap, expect and panic: Cargo.toml's deny is for the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

mod attach;
mod bounds;
mod check;
mod csi_client;
mod deployment_corpus;
mod detach;
mod driver_profiles;
mod events;
mod http_endpoint;
mod interop_csi_test;
mod kube_roundtrip;
mod leader_election;
mod logging;
mod malformed_driver;
mod malformed_flags;
mod malformed_http;
mod malformed_objects;
mod migration;
mod monitoring;
mod process;
mod properties_go;
mod properties_migration;
mod properties_pager;
mod proto_views;
mod proxy;
mod rbac;
mod rbac_manifest;
mod reconcile;
mod release;
mod scale;
mod scheduling;
mod socket_permissions;
mod surface;
