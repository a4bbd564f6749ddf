//! The project's mock CSI driver as a child process, with a client for its admin API.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::SystemTime;

use anyhow::{bail, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;

use super::procs::{self, Guard};

/// The `csi-mock-driver` binary, built for this test binary's profile.
///
/// The mock driver is a workspace member of its own (`tools/csi-mock-driver`),
/// and a test binary can name only its own package's binaries
/// (`CARGO_BIN_EXE_*`). `cargo test --workspace` (hack/test.sh, the demo)
/// builds it beside this binary, in `target/<profile>/`, with the same
/// dependency features; where it is missing or older than its sources (or the
/// product's CSI module it uses), this builds it with `cargo build -p
/// csi-mock-driver`, once per test binary.
pub fn binary() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| match locate_or_build() {
            Ok(path) => path,
            Err(err) => panic!("csi-mock-driver: {err:#}"),
        })
        .clone()
}

fn locate_or_build() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // target/<profile dir>/deps/<this test binary>, or target/<profile
    // dir>/<the benchmark's binary>.
    let dir = exe.parent().context("no directory above this binary")?;
    let profile_dir = if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent()
            .context("no target directory above this test binary")?
    } else {
        dir
    };
    let path = profile_dir.join("csi-mock-driver");
    let root = super::repo_root();
    let sources = [root.join("tools/csi-mock-driver"), root.join("src/csi")];
    let built = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
    if built.is_some_and(|built| sources.iter().all(|dir| newest(dir) <= built)) {
        return Ok(path);
    }
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(other) => other,
        None => bail!("no profile directory in {}", exe.display()),
    };
    let target_dir = profile_dir.parent().context("no target directory")?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "--locked",
            "-p",
            "csi-mock-driver",
            "--profile",
            profile,
        ])
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(root)
        .status()
        .context("running cargo build -p csi-mock-driver")?;
    if !status.success() {
        bail!("cargo build -p csi-mock-driver failed ({status})");
    }
    Ok(path)
}

/// The latest modification time of the files under `dir`.
fn newest(dir: &Path) -> SystemTime {
    let mut latest = SystemTime::UNIX_EPOCH;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if let Ok(modified) = meta.modified() {
                latest = latest.max(modified);
            }
        }
    }
    latest
}

/// A running `csi-mock-driver` on a temp socket.
pub struct MockDriver {
    /// The socket path.
    pub socket: PathBuf,
    /// The JSON-lines ledger file.
    pub ledger_path: PathBuf,
    /// Admin API address.
    pub admin: SocketAddr,
    /// The process.
    pub process: Guard,
    _dir: tempfile::TempDir,
}

impl MockDriver {
    /// Starts the mock with extra flags (e.g. `--name=x`, `--capabilities=...`).
    pub fn start(extra_args: &[&str]) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("csi-mock-").tempdir()?;
        let socket = dir.path().join("csi.sock");
        let ledger_path = dir.path().join("ledger.jsonl");
        let mut command = Command::new(binary());
        command
            .arg(format!("--endpoint={}", socket.display()))
            .arg(format!("--ledger={}", ledger_path.display()))
            .arg("--admin-addr=127.0.0.1:0")
            .args(extra_args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = procs::spawn(command).context("starting csi-mock-driver")?;
        let stdout = child.stdout.take().context("mock stdout")?;
        let mut process = Guard(Some(child));
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let banner: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(_) => {
                let status = process.wait()?;
                bail!("csi-mock-driver did not start ({status}): {line:?}");
            }
        };
        let admin = banner["admin"]
            .as_str()
            .context("no admin address in banner")?
            .parse()?;
        Ok(Self {
            socket,
            ledger_path,
            admin,
            process,
            _dir: dir,
        })
    }

    /// `--csi-address` value for this mock.
    pub fn address(&self) -> String {
        self.socket.display().to_string()
    }

    /// Sets a fault on `method` (body: the mock's `Fault` JSON).
    pub async fn set_fault(&self, method: &str, fault: Value) {
        self.admin_call("PUT", &format!("/faults/{method}"), Some(fault))
            .await;
    }

    /// Clears the fault on one method (releases its hung calls).
    pub async fn clear_fault(&self, method: &str) {
        self.admin_call("DELETE", &format!("/faults/{method}"), None)
            .await;
    }

    /// Makes `method` answer with hand-made bytes: `raw` is the mock's `RawReply` JSON
    /// (`body_hex`, `unframed`, `grpc_status`, `grpc_message_hex`, `grpc_status_details`).
    pub async fn set_raw_reply(&self, method: &str, raw: Value) {
        self.set_fault(method, serde_json::json!({ "raw": raw }))
            .await;
    }

    /// Clears all faults (releases hung calls).
    pub async fn clear_faults(&self) {
        self.admin_call("DELETE", "/faults", None).await;
    }

    /// Sets what Probe answers.
    pub async fn set_ready(&self, ready: bool) {
        self.admin_call("PUT", "/ready", Some(serde_json::json!({ "ready": ready })))
            .await;
    }

    /// The published table `{volume: [node, ...]}`.
    pub async fn published(&self) -> Value {
        self.admin_call("GET", "/published", None).await
    }

    /// Replaces the published table.
    pub async fn set_published(&self, table: Value) {
        self.admin_call("PUT", "/published", Some(table)).await;
    }

    /// With a driver profile: the cloud deletes the instance `node_id`.
    pub async fn delete_instance(&self, node_id: &str) {
        let encoded =
            percent_encoding::utf8_percent_encode(node_id, percent_encoding::NON_ALPHANUMERIC);
        self.admin_call("DELETE", &format!("/nodes/{encoded}"), None)
            .await;
    }

    /// All ledger entries.
    pub async fn ledger(&self) -> Vec<Value> {
        match self.admin_call("GET", "/ledger", None).await {
            Value::Array(entries) => entries,
            other => panic!("ledger is not an array: {other}"),
        }
    }

    /// Ledger entries of one method.
    pub async fn calls(&self, method: &str) -> Vec<Value> {
        self.ledger()
            .await
            .into_iter()
            .filter(|e| e["method"] == method)
            .collect()
    }

    async fn admin_call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let stream = tokio::net::TcpStream::connect(self.admin)
            .await
            .expect("connect to mock admin API");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("admin handshake");
        tokio::spawn(conn);
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.admin.to_string())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("admin request");
        let response = sender.send_request(request).await.expect("admin response");
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("admin body")
            .to_bytes();
        assert!(
            status.is_success(),
            "admin {method} {path}: {status} {bytes:?}"
        );
        serde_json::from_slice(&bytes).expect("admin JSON")
    }
}

/// Lower-case hex of `bytes`, for `RawReply` fields.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The protobuf encoding of `message`, hex, for `RawReply.body_hex`.
pub fn proto_hex(message: &impl prost::Message) -> String {
    hex(&message.encode_to_vec())
}

/// A ledger call's start and end, in Unix nanoseconds.
pub fn call_span(call: &Value) -> (u64, u64) {
    let start = call["time_unix_nanos"].as_u64().expect("start");
    let took = call["duration_ms"].as_f64().expect("duration");
    (start, start + (took * 1e6) as u64)
}

/// The most driver calls of `methods` in flight at once, from the ledger.
pub fn peak_concurrency(ledger: &[Value], methods: &[&str]) -> usize {
    let mut edges: Vec<(u64, i32)> = Vec::new();
    for call in ledger {
        if !methods.iter().any(|m| call["method"] == *m) {
            continue;
        }
        let (start, end) = call_span(call);
        edges.push((start, 1));
        edges.push((end, -1));
    }
    // At equal times, an end comes before a start.
    edges.sort();
    let (mut now, mut peak) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        peak = peak.max(now);
    }
    peak as usize
}

/// A driver profile written to a file for csi-mock-driver's
/// `--profile-file` (the file lives as long as this).
pub struct ProfileFile(tempfile::NamedTempFile);

impl ProfileFile {
    /// Writes `text` (a profile's TOML).
    pub fn new(text: &str) -> Self {
        use std::io::Write;
        let mut file = tempfile::NamedTempFile::new().expect("profile file");
        file.write_all(text.as_bytes()).expect("write profile");
        Self(file)
    }

    /// Where it is.
    pub fn path(&self) -> &std::path::Path {
        self.0.path()
    }

    /// The csi-mock-driver flag that loads it.
    pub fn arg(&self) -> String {
        format!("--profile-file={}", self.path().display())
    }
}
