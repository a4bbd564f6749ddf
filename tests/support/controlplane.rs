//! A real control plane for tests: etcd + kube-apiserver on loopback.
//!
//! [`shared`] is started once per test binary (on first use) with random free
//! ports, a temp dir, its own CA, serving and client certificates, and
//! `--authorization-mode=RBAC`. Binaries come from `hack/build-controlplane.sh`
//! (built once, cached). `CSI_ATTACHER_KUBE_VERSION=1.34` picks
//! `kube-apiserver-1.34` (the oldest supported release) instead of the default
//! `kube-apiserver` (1.36). Everything is killed and removed when the test
//! process exits, also after a panic (see `procs`). Tests share it, so each
//! must use unique object names.
//!
//! [`ControlPlane::start`] with other [`Options`] starts one of a test's own,
//! the same way: the chaos suite's (tests/chaos/cp.rs) has API Priority and
//! Fairness on, its own audit policy, and an API server it kills, stops and
//! starts again ([`ControlPlane::kill_apiserver`], [`ControlPlane::start_apiserver`],
//! the `signal_*` methods).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use kube::config::{KubeConfigOptions, Kubeconfig};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

use super::base64_encode;
use super::procs::{self, Guard};

/// How long etcd + kube-apiserver may take to become ready.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Selects the kube-apiserver release (`<major>.<minor>`); unset means the default build.
const KUBE_VERSION_ENV: &str = "CSI_ATTACHER_KUBE_VERSION";

/// A running etcd + kube-apiserver pair.
pub struct ControlPlane {
    /// Scratch directory (certs, data, logs, kubeconfigs).
    pub dir: PathBuf,
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    /// The API server's port on 127.0.0.1.
    pub port: u16,
    /// etcd's client port on 127.0.0.1 (plain HTTP).
    pub etcd_port: u16,
    /// Admin kubeconfig (user in `system:masters`).
    pub kubeconfig: PathBuf,
    /// Directory holding the built tools (kube-apiserver, etcd, csi-test-driver).
    pub tools: PathBuf,
    /// Minor version the running kube-apiserver reports (`GET /version`).
    pub kube_minor: u32,
    ca: CertifiedIssuer<'static, KeyPair>,
    etcd: Guard,
    apiserver: Guard,
    /// The API server's binary and flags, to start it again.
    apiserver_command: (PathBuf, Vec<String>),
}

/// How a control plane is started; the default is [`shared`]'s.
pub struct Options {
    /// Where certificates, data, logs and kubeconfigs go (the caller's to
    /// remove); `None`: a temp dir removed when the test process exits.
    pub dir: Option<PathBuf>,
    /// The audit policy (YAML); the log is `audit.log` in the directory.
    pub audit_policy: &'static str,
    /// API Priority and Fairness on (off by default: no test queues behind it).
    pub priority_and_fairness: bool,
    /// More kube-apiserver flags.
    pub apiserver_args: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            dir: None,
            audit_policy: AUDIT_POLICY,
            priority_and_fairness: false,
            apiserver_args: Vec::new(),
        }
    }
}

static SHARED: OnceLock<std::result::Result<ControlPlane, String>> = OnceLock::new();

/// Audit only the writes the tests inspect: PV and VA patches.
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [patch]
    resources:
      - group: ""
        resources: [persistentvolumes]
      - group: storage.k8s.io
        resources: [volumeattachments, volumeattachments/status]
  # Every request of a service account (tests that bind RBAC to one): which
  # verbs the attacher really uses.
  - level: Metadata
    userGroups: [system:serviceaccounts, "system:serviceaccounts:default"]
  - level: None
"#;

/// The control plane of this test binary, started on first use.
///
/// Safe to call from inside a tokio runtime: the start runs on its own thread.
pub fn shared() -> &'static ControlPlane {
    let result = SHARED.get_or_init(|| {
        std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime
                .block_on(ControlPlane::start(Options::default()))
                .map_err(|e| format!("{e:#}"))
        })
        .join()
        .unwrap_or_else(|_| Err("control plane start panicked".into()))
    });
    match result {
        Ok(cp) => cp,
        Err(err) => panic!("cannot start the test control plane: {err}"),
    }
}

/// Builds (or finds in the cache) the pinned tools and returns their directory.
pub fn tools_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("CSI_ATTACHER_TOOLS_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let script = super::repo_root().join("hack/build-controlplane.sh");
    let output = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!("{} failed ({})", script.display(), output.status);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let dir = stdout
        .lines()
        .last()
        .context("build script printed no directory")?;
    Ok(PathBuf::from(dir.trim()))
}

/// The kube-apiserver to run and, when `CSI_ATTACHER_KUBE_VERSION` chose it,
/// the minor version it must report.
fn apiserver_binary(tools: &Path) -> Result<(PathBuf, Option<u32>)> {
    let Some(wanted) = std::env::var_os(KUBE_VERSION_ENV).filter(|v| !v.is_empty()) else {
        return Ok((tools.join("kube-apiserver"), None));
    };
    let wanted = wanted.to_string_lossy().into_owned();
    let minor = wanted
        .strip_prefix("1.")
        .and_then(|m| m.parse::<u32>().ok())
        .with_context(|| {
            format!("{KUBE_VERSION_ENV}={wanted:?}: expected <major>.<minor>, e.g. 1.34")
        })?;
    let binary = tools.join(format!("kube-apiserver-{wanted}"));
    if !binary.is_file() {
        bail!(
            "{KUBE_VERSION_ENV}={wanted}: no {} (hack/build-controlplane.sh builds the releases it pins)",
            binary.display()
        );
    }
    Ok((binary, Some(minor)))
}

/// A free TCP port on 127.0.0.1 (bound, then released).
///
/// Picked at random below the kernel's ephemeral range
/// (`ip_local_port_range`), so that no outgoing connection (etcd's clients
/// of itself, the API server's of etcd) can take it between the pick and the
/// bind of the process it is for; each port at most once per test process.
/// Where the range cannot be read, or leaves too little below it, the kernel
/// picks one of its own (port 0).
pub fn free_port() -> Result<u16> {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(0);
    if ephemeral_start > 12_000 {
        let mut given = GIVEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for _ in 0..200 {
            let port = fastrand::u16(10_000..ephemeral_start);
            if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
                given.push(port);
                return Ok(port);
            }
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver as `options` say and waits until the API
    /// server is ready.
    pub async fn start(options: Options) -> Result<Self> {
        let tools = tools_dir()?;
        let dir = match options.dir {
            Some(dir) => dir,
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("csi-attacher-cp-")
                    .tempdir()?
                    .keep();
                procs::remove_at_exit(dir.clone());
                dir
            }
        };

        // Certificates: one CA signs the serving cert and every client cert.
        let mut ca_params = CertificateParams::default();
        ca_params.distinguished_name = dn("csi-attacher-test-ca", &[]);
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

        // etcd
        let etcd_port = free_port()?;
        let peer_port = free_port()?;
        let etcd_log = std::fs::File::create(dir.join("etcd.log"))?;
        let mut etcd = Command::new(tools.join("etcd"));
        etcd.args([
            "--name=test",
            &format!("--data-dir={}", dir.join("etcd").display()),
            &format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
            &format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
            &format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
            &format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
            &format!("--initial-cluster=test=http://127.0.0.1:{peer_port}"),
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ])
        .stdout(etcd_log.try_clone()?)
        .stderr(etcd_log);
        let etcd = Guard(Some(procs::spawn(etcd).context("starting etcd")?));

        // Audit log (by default of the attacher's writes, VA and PV patches),
        // so tests can check the order the API server received them in.
        std::fs::write(dir.join("audit-policy.yaml"), options.audit_policy)?;

        // kube-apiserver
        let port = free_port()?;
        let p = |name: &str| dir.join(name).display().to_string();
        let (apiserver_bin, wanted_minor) = apiserver_binary(&tools)?;
        let mut args = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
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
        ];
        if !options.priority_and_fairness {
            args.push("--enable-priority-and-fairness=false".into());
        }
        args.extend([
            "--profiling=false".into(),
            format!("--audit-policy-file={}", p("audit-policy.yaml")),
            format!("--audit-log-path={}", p("audit.log")),
            "--audit-log-mode=blocking".into(),
            "--v=1".into(),
        ]);
        args.extend(options.apiserver_args);
        let apiserver_command = (apiserver_bin, args);
        let apiserver = spawn_apiserver(&dir, &apiserver_command)?;

        let mut cp = Self {
            server: format!("https://127.0.0.1:{port}"),
            port,
            etcd_port,
            kubeconfig: dir.join("admin.kubeconfig"),
            dir,
            tools,
            kube_minor: 0,
            ca,
            etcd,
            apiserver,
            apiserver_command,
        };
        cp.kubeconfig = cp.write_kubeconfig("admin", "admin", &["system:masters"])?;
        if let Err(e) = cp.wait_ready(START_TIMEOUT).await {
            let tail = |name: &str| {
                let text = std::fs::read_to_string(cp.dir.join(name)).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                lines[lines.len().saturating_sub(30)..].join("\n")
            };
            return Err(e.context(format!(
                "etcd.log:\n{}\nkube-apiserver.log:\n{}",
                tail("etcd.log"),
                tail("kube-apiserver.log")
            )));
        }
        cp.kube_minor = cp.server_minor().await?;
        // A mislabelled binary would make a 1.34 run test 1.36 without a word.
        if let Some(wanted) = wanted_minor {
            if cp.kube_minor != wanted {
                bail!(
                    "{} reports minor version {}, {KUBE_VERSION_ENV} asked for {wanted}",
                    cp.apiserver_command.0.display(),
                    cp.kube_minor
                );
            }
        }
        Ok(cp)
    }

    /// SIGKILLs the API server (continued first, should it be stopped) and reaps it.
    pub fn kill_apiserver(&mut self) {
        self.apiserver.signal(libc::SIGCONT);
        self.apiserver.signal(libc::SIGKILL);
        let _ = self.apiserver.wait();
    }

    /// Starts the API server again after [`Self::kill_apiserver`], same binary
    /// and flags (same port, certificates and etcd); its log is appended to.
    /// Does not wait: see [`Self::wait_ready`].
    pub fn start_apiserver(&mut self) -> Result<()> {
        self.apiserver = spawn_apiserver(&self.dir, &self.apiserver_command)?;
        Ok(())
    }

    /// Sends `signal` to the API server (e.g. SIGSTOP, SIGCONT).
    pub fn signal_apiserver(&self, signal: libc::c_int) {
        self.apiserver.signal(signal);
    }

    /// Sends `signal` to etcd (e.g. SIGSTOP, SIGCONT).
    pub fn signal_etcd(&self, signal: libc::c_int) {
        self.etcd.signal(signal);
    }

    /// Whether the API server keeps `VolumeError.errorCode` on a status write.
    ///
    /// The field exists from 1.34 behind the MutableCSINodeAllocatableCount
    /// feature gate, which is beta but off by default in 1.34 (on from 1.35,
    /// GA in 1.36): a default 1.34 cluster silently drops it.
    pub fn keeps_error_code(&self) -> bool {
        self.kube_minor >= 35
    }

    /// What the stored object holds after a status write of `errorCode: code`:
    /// the code, or nothing where the API server drops the field.
    pub fn stored_error_code(&self, code: i32) -> Option<i32> {
        self.keeps_error_code().then_some(code)
    }

    async fn server_minor(&self) -> Result<u32> {
        let client = kube::Client::try_from(self.config_for(&self.kubeconfig).await?)?;
        let info = client.apiserver_version().await?;
        // Release builds report e.g. "34"; some distributions append "+".
        info.minor
            .trim_end_matches('+')
            .parse()
            .with_context(|| format!("kube-apiserver minor version {:?}", info.minor))
    }

    /// The API server's audit events so far (by the default policy: patches of
    /// PVs and VAs, stage ResponseComplete), in the order it logged them:
    /// rotated files (`audit-<time>.log`, oldest first), then `audit.log`.
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

    /// Writes a kubeconfig for a client-certificate user and returns its path.
    ///
    /// For a service account use `system:serviceaccount:<ns>:<name>` with groups
    /// `system:serviceaccounts` and `system:serviceaccounts:<ns>`: RBAC bindings to
    /// the ServiceAccount subject then apply.
    pub fn write_kubeconfig(
        &self,
        file_stem: &str,
        user: &str,
        groups: &[&str],
    ) -> Result<PathBuf> {
        self.write_kubeconfig_via(file_stem, user, groups, &self.server)
    }

    /// [`Self::write_kubeconfig`] for a client that reaches the API server at
    /// `server` (e.g. through a TCP proxy on another port; the serving
    /// certificate is for 127.0.0.1 and localhost).
    pub fn write_kubeconfig_via(
        &self,
        file_stem: &str,
        user: &str,
        groups: &[&str],
        server: &str,
    ) -> Result<PathBuf> {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(user, groups);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.ca)?;
        let b64 = |s: String| base64_encode(s.as_bytes());
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {
                "server": server,
                "certificate-authority-data": b64(self.ca.pem()),
            }}],
            "users": [{"name": user, "user": {
                "client-certificate-data": b64(cert.pem()),
                "client-key-data": b64(key.serialize_pem()),
            }}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
            "current-context": "test",
        });
        let path = self.dir.join(format!("{file_stem}.kubeconfig"));
        std::fs::write(&path, serde_json::to_vec_pretty(&config)?)?;
        Ok(path)
    }

    /// An admin client.
    pub async fn client(&self) -> kube::Client {
        self.client_for(&self.kubeconfig).await
    }

    /// A client from a kubeconfig written by [`Self::write_kubeconfig`].
    pub async fn client_for(&self, kubeconfig: &Path) -> kube::Client {
        let config = self
            .config_for(kubeconfig)
            .await
            .expect("kubeconfig to config");
        kube::Client::try_from(config).expect("build kube client")
    }

    /// The client configuration of a kubeconfig written by [`Self::write_kubeconfig`].
    pub async fn config_for(&self, kubeconfig: &Path) -> Result<kube::Config> {
        let kubeconfig = Kubeconfig::read_from(kubeconfig)?;
        Ok(kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
    }

    /// Waits until the API server answers `/readyz` with `ok` (each probe
    /// bounded by 3 s, so a stopped server cannot hold it), at most `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let client = kube::Client::try_from(self.config_for(&self.kubeconfig).await?)?;
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
}

/// Starts `binary args` with its output appended to `kube-apiserver.log` in `dir`.
fn spawn_apiserver(dir: &Path, (binary, args): &(PathBuf, Vec<String>)) -> Result<Guard> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("kube-apiserver.log"))?;
    let mut apiserver = Command::new(binary);
    apiserver.args(args).stdout(log.try_clone()?).stderr(log);
    Ok(Guard(Some(procs::spawn(apiserver).with_context(|| {
        format!("starting {}", binary.display())
    })?)))
}

fn dn(common_name: &str, organizations: &[&str]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    for o in organizations {
        dn.push(DnType::OrganizationName, *o);
    }
    dn
}
