//! Test harness shared by the behaviour tests: control plane, mock driver,
//! child processes and small helpers.
//!
//! Each test binary compiles this module on its own and uses a part of it.
#![allow(dead_code)]

pub mod connect_proxy;
pub mod controlplane;
pub mod corpus;
pub mod env;
pub mod gotool;
pub mod mock;
pub mod objects;
pub mod procs;
pub mod translation;

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The repository's root: the product's manifest directory, or two above the
/// benchmark's (tools/bench), which shares this module.
pub fn repo_root() -> std::path::PathBuf {
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    if here.join("hack").is_dir() {
        here.to_path_buf()
    } else {
        here.join("../..")
    }
}

/// The `csi-attacher` binary under test: cargo's for the product's tests,
/// else the one beside the running executable (the benchmark's, built into
/// the same target directory).
#[allow(dead_code)] // not every binary starts an attacher
pub fn attacher_binary() -> std::path::PathBuf {
    match option_env!("CARGO_BIN_EXE_csi-attacher") {
        Some(path) => path.into(),
        None => std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join("csi-attacher")))
            .unwrap_or_else(|| "csi-attacher".into()),
    }
}

/// A DNS-1123 name unique within this test run: `<prefix>-<pid>-<n>`.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// `report` (Markdown) with the run's provenance after its title, as
/// `hack/figures.py` reads it: `CSI_ATTACHER_PROVENANCE`, set by the hack/
/// scripts that publish reports; a run started otherwise says so.
#[allow(dead_code)] // not every test binary writes a report
pub fn with_provenance(report: &str) -> String {
    let provenance = std::env::var("CSI_ATTACHER_PROVENANCE")
        .unwrap_or_else(|_| r#"{"note": "not run by a hack/ script: no provenance"}"#.into());
    let (title, rest) = report.split_once('\n').unwrap_or((report, ""));
    format!("{title}\n\n<!-- provenance: {provenance} -->\n{rest}")
}

/// Now, in Unix nanoseconds: the clock of the mock driver's ledger.
pub fn unix_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Lets `window` pass before a negative assertion ("X did not happen").
///
/// Only for checks that something stays absent, where no event can say "it is
/// now certain X will not happen"; positive checks use [`eventually`].
pub async fn quiet_period(window: Duration) {
    tokio::time::sleep(window).await;
}

/// Polls `check` until it yields `Some`, or panics with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// GET `path` from an HTTP/1 server on `addr`: (status, body).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    use http_body_util::{BodyExt, Empty};
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .ok()?;
    tokio::spawn(conn);
    let request = http::Request::get(path)
        .header("host", addr.to_string())
        .body(Empty::<hyper::body::Bytes>::new())
        .ok()?;
    let response = sender.send_request(request).await.ok()?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Standard base64 (with padding), as Kubernetes writes `[]byte` fields.
pub fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The number of cases a property test runs: `PROPTEST_CASES`, else `default`.
pub fn proptest_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(default)
}
