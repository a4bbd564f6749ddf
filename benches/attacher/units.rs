//! The unit tests of the benchmark's pure modules (the `attacher` target has
//! `harness = false`, so its own `#[test]`s would never run): the same files,
//! compiled a second time as a test target. `cargo test --bench attacher_units`,
//! and part of every `cargo test`.

// Each module is compiled here for its tests; what only the benchmark calls is unused.
#![allow(dead_code)]
// Test tooling: Cargo.toml's deny of unwrap/expect/panic is for the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod charts;
mod cli;
mod metric;
mod p8;
mod p8_charts;
mod p8_floor;
mod plan;
mod procstat;
mod report;
mod sizes;
mod stats;
mod writes;
