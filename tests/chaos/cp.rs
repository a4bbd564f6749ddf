//! The chaos suite's own control plane: etcd + kube-apiserver on loopback with
//! fixed ports, so the API server can be killed, stopped and restarted (and
//! etcd stalled and compacted) while attachers run against it.
//!
//! Differences from the shared test control plane: API Priority and Fairness
//! is on (the 429 fault needs it), and the audit policy records every Lease,
//! VolumeAttachment and PersistentVolume write with its response (leadership
//! terms, finalizer removals) and every request of the attacher replicas
//! (request rates), never a Secret's content.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use kube::config::{KubeConfigOptions, Kubeconfig};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

use crate::support::controlplane::{free_port, tools_dir};
use crate::support::procs::{self, Guard};

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

pub struct ChaosCp {
    pub dir: PathBuf,
    pub api_port: u16,
    pub etcd_port: u16,
    pub kubeconfig: PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
    tools: PathBuf,
    etcd: Guard,
    apiserver: Guard,
    api_args: Vec<String>,
}

fn dn(common_name: &str, organizations: &[&str]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    for o in organizations {
        dn.push(DnType::OrganizationName, *o);
    }
    dn
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

impl ChaosCp {
    pub async fn start(dir: &Path) -> Result<Self> {
        let tools = tools_dir()?;
        let mut ca_params = CertificateParams::default();
        ca_params.distinguished_name = dn("chaos-ca", &[]);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
        std::fs::write(dir.join("ca.crt"), ca.pem())?;
        let mut serving = CertificateParams::new(vec!["localhost".to_string()])?;
        serving
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        serving.distinguished_name = dn("kube-apiserver", &[]);
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let serving_key = KeyPair::generate()?;
        let serving_cert = serving.signed_by(&serving_key, &ca)?;
        std::fs::write(dir.join("apiserver.crt"), serving_cert.pem())?;
        std::fs::write(dir.join("apiserver.key"), serving_key.serialize_pem())?;
        let sa_key = KeyPair::generate()?;
        std::fs::write(dir.join("sa.key"), sa_key.serialize_pem())?;
        std::fs::write(dir.join("sa.pub"), sa_key.public_key_pem())?;
        std::fs::write(dir.join("audit-policy.yaml"), AUDIT_POLICY)?;

        let etcd_port = free_port()?;
        let peer_port = free_port()?;
        let api_port = free_port()?;
        let p = |name: &str| dir.join(name).display().to_string();
        let api_args = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={api_port}"),
            format!("--cert-dir={}", p("certs")),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            "--authorization-mode=RBAC".into(),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--endpoint-reconciler-type=none".into(),
            "--profiling=false".into(),
            format!("--audit-policy-file={}", p("audit-policy.yaml")),
            format!("--audit-log-path={}", p("audit.log")),
            "--audit-log-mode=blocking".into(),
            // The default rotates at 100 MB, silently: the checks would read a
            // truncated history. Rotated files are read too, should it happen.
            "--audit-log-maxsize=1000000".into(),
            "--v=1".into(),
        ];
        let etcd = Self::spawn_etcd(&tools, dir, etcd_port, peer_port)?;
        let apiserver = Self::spawn_apiserver(&tools, dir, &api_args)?;
        let mut cp = Self {
            dir: dir.to_path_buf(),
            api_port,
            etcd_port,
            kubeconfig: PathBuf::new(),
            ca,
            tools,
            etcd,
            apiserver,
            api_args,
        };
        cp.kubeconfig =
            cp.write_kubeconfig("admin", "chaos-admin", &["system:masters"], api_port)?;
        cp.wait_ready(Duration::from_secs(120)).await?;
        Ok(cp)
    }

    fn spawn_etcd(tools: &Path, dir: &Path, port: u16, peer: u16) -> Result<Guard> {
        let log = std::fs::File::create(dir.join("etcd.log"))?;
        let mut etcd = Command::new(tools.join("etcd"));
        etcd.args([
            "--name=chaos",
            &format!("--data-dir={}", dir.join("etcd").display()),
            &format!("--listen-client-urls=http://127.0.0.1:{port}"),
            &format!("--advertise-client-urls=http://127.0.0.1:{port}"),
            &format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
            &format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
            &format!("--initial-cluster=chaos=http://127.0.0.1:{peer}"),
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ])
        .stdout(log.try_clone()?)
        .stderr(log);
        Ok(Guard(Some(procs::spawn(etcd).context("starting etcd")?)))
    }

    fn spawn_apiserver(tools: &Path, dir: &Path, args: &[String]) -> Result<Guard> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("kube-apiserver.log"))?;
        let mut api = Command::new(tools.join("kube-apiserver"));
        api.args(args).stdout(log.try_clone()?).stderr(log);
        Ok(Guard(Some(
            procs::spawn(api).context("starting kube-apiserver")?,
        )))
    }

    /// SIGKILLs the API server, starts it again and waits until it is ready.
    pub async fn restart_apiserver(&mut self) -> Result<()> {
        self.kill_apiserver();
        self.start_apiserver()?;
        self.wait_ready(Duration::from_secs(90)).await
    }

    /// SIGKILLs the API server and reaps it.
    pub fn kill_apiserver(&mut self) {
        self.apiserver.signal(libc::SIGCONT);
        self.apiserver.signal(libc::SIGKILL);
        let _ = self.apiserver.wait();
    }

    /// Starts the API server again (after [`Self::kill_apiserver`]), same flags.
    pub fn start_apiserver(&mut self) -> Result<()> {
        self.apiserver = Self::spawn_apiserver(&self.tools, &self.dir, &self.api_args)?;
        Ok(())
    }

    pub fn signal_apiserver(&self, signal: libc::c_int) {
        self.apiserver.signal(signal);
    }

    pub fn signal_etcd(&self, signal: libc::c_int) {
        self.etcd.signal(signal);
    }

    /// Compacts etcd at its current revision (every older revision is gone:
    /// watches resuming from one get 410 Gone).
    pub async fn compact_etcd(&self) -> Result<i64> {
        let addr = ([127, 0, 0, 1], self.etcd_port).into();
        let range = serde_json::json!({"key": b64(b"/"), "range_end": b64(b"0"), "limit": 1, "keys_only": true});
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

    pub fn write_kubeconfig(
        &self,
        file_stem: &str,
        user: &str,
        groups: &[&str],
        port: u16,
    ) -> Result<PathBuf> {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(user, groups);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.ca)?;
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "chaos", "cluster": {
                "server": format!("https://127.0.0.1:{port}"),
                "certificate-authority-data": b64(self.ca.pem().as_bytes()),
            }}],
            "users": [{"name": user, "user": {
                "client-certificate-data": b64(cert.pem().as_bytes()),
                "client-key-data": b64(key.serialize_pem().as_bytes()),
            }}],
            "contexts": [{"name": "chaos", "context": {"cluster": "chaos", "user": user}}],
            "current-context": "chaos",
        });
        let path = self.dir.join(format!("{file_stem}.kubeconfig"));
        std::fs::write(&path, serde_json::to_vec_pretty(&config)?)?;
        Ok(path)
    }

    pub async fn client(&self) -> Result<kube::Client> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        config.read_timeout = Some(Duration::from_secs(10));
        config.connect_timeout = Some(Duration::from_secs(3));
        Ok(kube::Client::try_from(config)?)
    }

    pub async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let client = self.client().await?;
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        while Instant::now() < deadline {
            let req = http::Request::get("/readyz").body(Vec::new())?;
            match tokio::time::timeout(Duration::from_secs(3), client.request_text(req)).await {
                Ok(Ok(body)) if body.trim() == "ok" => return Ok(()),
                Ok(Ok(body)) => last = body,
                Ok(Err(err)) => last = err.to_string(),
                Err(_) => last = "timeout".into(),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        bail!("kube-apiserver not ready after {timeout:?}: {last}")
    }

    /// Audit events so far: rotated files (`audit-<time>.log`, oldest first) and `audit.log`.
    pub fn audit_events(&self) -> Vec<serde_json::Value> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("audit") && n.ends_with(".log"))
            })
            .collect();
        // "audit-2026…" sorts before "audit.log" ('-' < '.'), and by time among themselves.
        files.sort();
        files
            .iter()
            .flat_map(|f| {
                std::fs::read_to_string(f)
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|line| serde_json::from_str(line).ok())
                    .collect::<Vec<_>>()
            })
            .collect()
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
