//! Build-time inputs:
//!
//! - `proto/csi.proto` and `proto/k8s_views.proto` (the Kubernetes messages
//!   the views decode, with only the fields they keep), compiled with a
//!   pure-Rust protobuf compiler (protox), so building needs no system `protoc`;
//! - the build's identity for `--version` and the `csi_attacher_build_info`
//!   metric: git commit, build date and rustc version, as the environment
//!   variables `CSI_ATTACHER_GIT_COMMIT`, `CSI_ATTACHER_BUILD_DATE` and
//!   `CSI_ATTACHER_RUSTC_VERSION` of the crate.
//!
//! The commit is `CSI_ATTACHER_GIT_COMMIT` when set (the image build passes
//! it, as its context has no `.git`), else `git rev-parse HEAD`, else
//! `unknown`. The date is `SOURCE_DATE_EPOCH` when set (reproducible builds),
//! else the time this script ran, in RFC 3339 UTC.

use std::path::Path;
use std::process::Command;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/csi.proto", "proto/k8s_views.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // The views keep maps sorted, as k8s-openapi does.
        .btree_map(".k8s.views")
        // Requests that carry secrets get a hand-written Debug that redacts them
        // (src/csi/proto.rs): a derived Debug would print the secrets map.
        .skip_debug([
            "csi.v1.ControllerPublishVolumeRequest",
            "csi.v1.ControllerUnpublishVolumeRequest",
        ])
        .compile_fds(descriptors)?;

    build_identity()
}

fn build_identity() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-env-changed=CSI_ATTACHER_GIT_COMMIT");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");

    let commit = match non_empty_env("CSI_ATTACHER_GIT_COMMIT") {
        Some(commit) => commit,
        None => {
            watch_git_head();
            git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".to_string())
        }
    };

    let date = match non_empty_env("SOURCE_DATE_EPOCH") {
        Some(epoch) => {
            let seconds: i64 = epoch.parse().map_err(|e| {
                format!("SOURCE_DATE_EPOCH={epoch:?} is not a number of seconds: {e}")
            })?;
            jiff::Timestamp::from_second(seconds)?
        }
        None => jiff::Timestamp::now(),
    };
    // Whole seconds, `Z`: 2026-11-26T11:40:54Z.
    let date = jiff::Timestamp::from_second(date.as_second())?.to_string();

    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let rustc_version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".to_string());

    println!("cargo:rustc-env=CSI_ATTACHER_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=CSI_ATTACHER_BUILD_DATE={date}");
    println!("cargo:rustc-env=CSI_ATTACHER_RUSTC_VERSION={rustc_version}");
    Ok(())
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `git <args>` in the crate's directory: its trimmed stdout, or None when git
/// is missing, this is not a checkout, or the command fails.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

/// Re-runs this script when HEAD moves (commit, checkout, reset): git appends
/// to `logs/HEAD` on every move, and rewrites `HEAD` on a branch switch.
/// Without a checkout nothing is watched; the proto watch above still applies.
fn watch_git_head() {
    let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) else {
        return;
    };
    for file in ["HEAD", "logs/HEAD"] {
        let path = Path::new(&git_dir).join(file);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}
