//! This binary's identity, from build.rs: `--version` and `csi_attacher_build_info`.

use prometheus::{IntGaugeVec, Opts, Registry};

use super::family::register;

/// The crate version (Cargo.toml).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit built, or `unknown` (no checkout and no `CSI_ATTACHER_GIT_COMMIT`).
pub const GIT_COMMIT: &str = env!("CSI_ATTACHER_GIT_COMMIT");
/// RFC 3339 UTC: `SOURCE_DATE_EPOCH` when the build set it, else when build.rs ran.
pub const BUILD_DATE: &str = env!("CSI_ATTACHER_BUILD_DATE");
/// `rustc --version` of the compiler that built this binary.
pub const RUSTC_VERSION: &str = env!("CSI_ATTACHER_RUSTC_VERSION");

/// `csi_attacher_build_info{version,commit,build_date,rustc_version} 1`: joins
/// any series to the build that produced it (`* on(pod) group_left(version)`).
pub(super) fn register_build_info(registry: &Registry) -> prometheus::Result<()> {
    let info = register(
        registry,
        IntGaugeVec::new(
            Opts::new(
                "csi_attacher_build_info",
                "A metric with a constant '1' value labeled by the version, git commit, build date and rustc version this attacher was built from.",
            ),
            &["version", "commit", "build_date", "rustc_version"],
        ),
    )?;
    info.with_label_values(&[VERSION, GIT_COMMIT, BUILD_DATE, RUSTC_VERSION])
        .set(1);
    Ok(())
}
