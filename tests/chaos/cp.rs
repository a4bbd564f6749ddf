//! The chaos suite's control plane: the shared test control plane
//! (`support::controlplane`) started in the run's directory with the chaos
//! settings, and what the faults do to it on top of the shared kill, start and
//! signal handles: a restart that waits for readiness, and etcd compaction.
//!
//! Differences from the shared test control plane: API Priority and Fairness
//! is on (the 429 fault needs it), and the audit policy records every Lease,
//! VolumeAttachment and PersistentVolume write with its response (leadership
//! terms, finalizer removals) and every request of the attacher replicas
//! (request rates), never a Secret's content; the audit log does not rotate.

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::support::base64_encode;
use crate::support::controlplane::{ControlPlane, Options};

/// The group every replica user is in (bound to cluster-admin; not system:masters,
/// which API Priority and Fairness exempts).
pub const REPLICA_GROUP: &str = "chaos-attachers";

const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
  - level: Metadata
    resources:
      - group: ""
        resources: [secrets]
  - level: RequestResponse
    verbs: [create, update, patch, delete]
    resources:
      - group: coordination.k8s.io
        resources: [leases]
      - group: storage.k8s.io
        resources: [volumeattachments, volumeattachments/status]
      - group: ""
        resources: [persistentvolumes]
  - level: Metadata
    userGroups: [chaos-attachers]
  - level: None
"#;

/// The shared [`ControlPlane`] (its fields and handles through `Deref`), with
/// the chaos suite's operations. Its `client` and `write_kubeconfig` take the
/// place of the shared ones: a client with timeouts, a kubeconfig for a port.
pub struct ChaosCp(ControlPlane);

impl Deref for ChaosCp {
    type Target = ControlPlane;
    fn deref(&self) -> &ControlPlane {
        &self.0
    }
}

impl DerefMut for ChaosCp {
    fn deref_mut(&mut self) -> &mut ControlPlane {
        &mut self.0
    }
}

impl ChaosCp {
    /// Starts it with its files in `dir` (the caller's to keep or remove).
    pub async fn start(dir: &Path) -> Result<Self> {
        let options = Options {
            dir: Some(dir.to_path_buf()),
            audit_policy: AUDIT_POLICY,
            priority_and_fairness: true,
            // The default rotates at 100 MB, silently: the checks would read a
            // truncated history. Rotated files are read too, should it happen.
            apiserver_args: vec!["--audit-log-maxsize=1000000".into()],
        };
        Ok(Self(ControlPlane::start(options).await?))
    }

    /// SIGKILLs the API server, starts it again and waits until it is ready.
    pub async fn restart_apiserver(&mut self) -> Result<()> {
        self.kill_apiserver();
        self.start_apiserver()?;
        self.wait_ready(Duration::from_secs(90)).await
    }

    /// Compacts etcd at its current revision (every older revision is gone:
    /// watches resuming from one get 410 Gone).
    pub async fn compact_etcd(&self) -> Result<i64> {
        let addr = ([127, 0, 0, 1], self.etcd_port).into();
        let range = serde_json::json!({"key": base64_encode(b"/"), "range_end": base64_encode(b"0"), "limit": 1, "keys_only": true});
        let reply = http_post(addr, "/v3/kv/range", &range.to_string()).await?;
        let revision: i64 = reply["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .context("no revision in etcd's range reply")?;
        http_post(
            addr,
            "/v3/kv/compaction",
            &serde_json::json!({"revision": revision.to_string(), "physical": true}).to_string(),
        )
        .await?;
        Ok(revision)
    }

    /// A kubeconfig for `user` in `groups` that reaches the API server through
    /// 127.0.0.1:`port` (a replica's fault proxy, or the API server's own port).
    pub fn write_kubeconfig(
        &self,
        file_stem: &str,
        user: &str,
        groups: &[&str],
        port: u16,
    ) -> Result<PathBuf> {
        self.0.write_kubeconfig_via(
            file_stem,
            user,
            groups,
            &format!("https://127.0.0.1:{port}"),
        )
    }

    /// An admin client whose requests give up (10 s read, 3 s connect) while
    /// the API server is down or stopped.
    pub async fn client(&self) -> Result<kube::Client> {
        let mut config = self.config_for(&self.kubeconfig).await?;
        config.read_timeout = Some(Duration::from_secs(10));
        config.connect_timeout = Some(Duration::from_secs(3));
        Ok(kube::Client::try_from(config)?)
    }
}

/// POST a JSON body over plain HTTP/1 to a loopback address.
pub async fn http_post(
    addr: std::net::SocketAddr,
    path: &str,
    body: &str,
) -> Result<serde_json::Value> {
    use http_body_util::{BodyExt, Full};
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let request = http::Request::post(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(hyper::body::Bytes::from(body.to_string())))?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let bytes = response.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        bail!("POST {path}: {status} {}", String::from_utf8_lossy(&bytes));
    }
    Ok(serde_json::from_slice(&bytes)?)
}
