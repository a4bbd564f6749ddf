//! Running a deployment's csi-attacher container the way a kubelet would: the
//! fixtures of `tests/corpus/*.yaml` with their own args and env, against the
//! test control plane and a driver socket. `tests/deployment_corpus.rs` runs
//! every fixture against the mock driver; `tests/gce_pd.rs` runs the GCE PD
//! fixture against the real GCE PD driver.
//!
//! A fixture holds facts transcribed from its source (named in its header):
//! `source` (repo, path, version), `pod` (the pod's `name`, made up in the form
//! its controller generates, and its `namespace`), optional
//! `scrapes` (HTTP `port`/`path` a chart's Service or ServiceMonitor scrapes) and
//! `container`, a Kubernetes Container as rendered.
//!
//! The harness changes only what a test machine must: the CSI socket becomes the
//! test driver's, HTTP ports become free ones (the host part is kept), and it adds
//! `--kubeconfig` and `--termination-log-path`. `POD_NAMESPACE` stands in for the
//! service-account namespace file a pod has. Each run must attach a VA, take the
//! Lease in the namespace the flags name, answer every probe and scrape with 200
//! on 127.0.0.1 and, for a wildcard host, on [::1] too, and keep running without
//! a flag error in its log.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Container, EnvVar, HTTPGetAction, Namespace, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, PostParams};
use serde::Deserialize;

use super::controlplane;
use super::env::tail;
use super::objects::{csinode, va, PvBuilder};
use super::procs::{self, Guard};
use super::{http_get, unique};

/// Bound for each step of a run (start, lease, attach, first HTTP answer).
const STEP: Duration = Duration::from_secs(20);

/// Bound for each further HTTP address once the server has answered once.
const QUICK: Duration = Duration::from_secs(3);

/// Log text that only a rejected flag produces: Go's flag package, clap, our
/// `Config::validate`, and feature-gate parsing in both.
const FLAG_ERROR_MARKERS: &[&str] = &[
    "flag provided but not defined",
    "bad flag syntax",
    "invalid value",
    "invalid boolean",
    "cannot be used multiple times",
    "unexpected argument",
    "invalid flags",
    "invalid --feature-gates",
    "unrecognized feature gate",
    "failed to store flag gates",
];

/// One transcribed deployment.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fixture {
    /// Where it was transcribed from.
    pub source: Source,
    /// The pod facts the container sees.
    pub pod: Pod,
    /// What a chart's monitoring objects scrape.
    #[serde(default)]
    pub scrapes: Vec<Scrape>,
    /// The csi-attacher container as rendered.
    pub container: Container,
}

/// Where a fixture was transcribed from.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// `owner/name`.
    pub repo: String,
    /// File(s) in the repository.
    pub path: String,
    /// Tag or commit.
    pub version: String,
}

/// The pod facts the container sees.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Pod {
    /// The pod's name.
    pub name: String,
    /// The pod's namespace.
    pub namespace: String,
}

/// An HTTP endpoint a chart's monitoring objects scrape.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scrape {
    /// Container port (number or name).
    pub port: IntOrString,
    /// HTTP path.
    pub path: String,
}

/// `tests/corpus/`.
pub fn corpus_dir() -> PathBuf {
    super::repo_root().join("tests/corpus")
}

/// The fixture `tests/corpus/<file>`.
pub fn load(file: &str) -> Fixture {
    let path = corpus_dir().join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// Kubernetes' `$(VAR)` expansion (kubelet, third_party/forked/golang/expansion):
/// `$$` is a literal `$`, `$(NAME)` is replaced when NAME is defined and kept
/// as written when not, an unclosed `$(` and any other `$x` stay as they are.
pub fn expand(input: &str, vars: &HashMap<String, String>) -> String {
    let bytes = input.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(bytes.len());
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < bytes.len() {
        if bytes[cursor] == b'$' && cursor + 1 < bytes.len() {
            out.extend_from_slice(&bytes[checkpoint..cursor]);
            let rest = &bytes[cursor + 1..];
            let advance = match rest[0] {
                b'$' => {
                    out.push(b'$');
                    1
                }
                b'(' => match rest.iter().position(|b| *b == b')') {
                    Some(close) => {
                        let name = String::from_utf8_lossy(&rest[1..close]);
                        match vars.get(name.as_ref()) {
                            Some(value) => out.extend_from_slice(value.as_bytes()),
                            None => out.extend_from_slice(format!("$({name})").as_bytes()),
                        }
                        close + 1
                    }
                    None => {
                        out.extend_from_slice(b"$(");
                        1
                    }
                },
                other => {
                    out.extend_from_slice(&[b'$', other]);
                    1
                }
            };
            cursor += advance;
            checkpoint = cursor + 1;
        }
        cursor += 1;
    }
    out.extend_from_slice(&bytes[checkpoint..]);
    String::from_utf8(out).expect("expansion keeps UTF-8: it only moves whole input bytes")
}

/// The container's environment as the kubelet builds it: in order, each value
/// expanded with the variables defined before it, downward-API fields from `pod`.
fn environment(env: &[EnvVar], pod: &Pod) -> Vec<(String, String)> {
    let mut defined: HashMap<String, String> = HashMap::new();
    let mut ordered = Vec::new();
    for var in env {
        let value = match (&var.value, &var.value_from) {
            (Some(value), _) => expand(value, &defined),
            (None, Some(source)) => {
                let field = source.field_ref.as_ref().unwrap_or_else(|| {
                    panic!("env {}: only fieldRef sources are supported", var.name)
                });
                match field.field_path.as_str() {
                    "metadata.name" => pod.name.clone(),
                    "metadata.namespace" => pod.namespace.clone(),
                    other => panic!("env {}: fieldRef {other} is not supported", var.name),
                }
            }
            (None, None) => String::new(),
        };
        defined.insert(var.name.clone(), value.clone());
        ordered.push((var.name.clone(), value));
    }
    ordered
}

/// Positions of the values of flag `name` in Go flag syntax: `-name=v`,
/// `--name=v`, or `-name v`/`--name v`; every occurrence, in order.
fn value_slots(args: &[String], name: &str) -> Vec<(usize, Option<String>)> {
    let mut slots = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let body = args[i]
            .strip_prefix("--")
            .or_else(|| args[i].strip_prefix('-'));
        if let Some(body) = body {
            if body == name && i + 1 < args.len() {
                slots.push((i + 1, None));
                i += 1;
            } else if body.strip_prefix(name).is_some_and(|r| r.starts_with('=')) {
                let dashes = &args[i][..args[i].len() - body.len()];
                slots.push((i, Some(format!("{dashes}{name}="))));
            }
        }
        i += 1;
    }
    slots
}

/// The value of one occurrence (see [`value_slots`]).
fn slot_value(args: &[String], slot: &(usize, Option<String>)) -> String {
    match &slot.1 {
        Some(prefix) => args[slot.0][prefix.len()..].to_string(),
        None => args[slot.0].clone(),
    }
}

/// Replaces the value of every occurrence of flag `name` with `rewrite(old)`.
pub fn rewrite_flag(
    args: &mut [String],
    name: &str,
    mut rewrite: impl FnMut(&str) -> String,
) -> usize {
    let slots = value_slots(args, name);
    for slot in &slots {
        let new = rewrite(&slot_value(args, slot));
        args[slot.0] = match &slot.1 {
            Some(prefix) => format!("{prefix}{new}"),
            None => new,
        };
    }
    slots.len()
}

/// The last value of flag `name`, as Go's flag package keeps it.
pub fn last_value(args: &[String], name: &str) -> Option<String> {
    value_slots(args, name)
        .last()
        .map(|slot| slot_value(args, slot))
}

/// The last setting of bool flag `name` (`-name`, `-name=v`), parsed like Go's
/// strconv.ParseBool.
pub fn last_bool(args: &[String], name: &str) -> Option<bool> {
    let mut result = None;
    for arg in args {
        let Some(body) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            continue;
        };
        if body == name {
            result = Some(true);
        } else if let Some(value) = body.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
            result = Some(matches!(value, "1" | "t" | "T" | "TRUE" | "true" | "True"));
        }
    }
    result
}

/// A port free on both 127.0.0.1 and ::1 (a dual-stack wildcard bind, released).
fn free_dual_stack_port() -> u16 {
    TcpListener::bind((Ipv6Addr::UNSPECIFIED, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on [::]")
}

/// Where a `host:port` listener must answer: both loopbacks for an empty or
/// wildcard host (Go listens dual-stack there), else the literal address.
fn loopbacks_for(host: &str, port: u16) -> Vec<SocketAddr> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host {
        "" | "0.0.0.0" | "::" => vec![
            (Ipv4Addr::LOCALHOST, port).into(),
            (Ipv6Addr::LOCALHOST, port).into(),
        ],
        literal => {
            let ip: IpAddr = literal
                .parse()
                .unwrap_or_else(|_| panic!("HTTP host {literal:?} is not an IP address"));
            vec![(ip, port).into()]
        }
    }
}

/// An HTTP endpoint the kubelet or Prometheus will hit.
struct Target {
    what: String,
    path: String,
    addrs: Vec<SocketAddr>,
}

/// The fixture made runnable: final args, env, and what must answer.
struct Plan {
    args: Vec<String>,
    env: Vec<(String, String)>,
    targets: Vec<Target>,
    lease_namespace: Option<String>,
}

fn plan(fixture: &Fixture, socket: &Path) -> Plan {
    let container = &fixture.container;
    let env = environment(container.env.as_deref().unwrap_or_default(), &fixture.pod);
    let vars: HashMap<String, String> = env.iter().cloned().collect();
    let mut args: Vec<String> = container
        .args
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|a| expand(a, &vars))
        .collect();
    assert!(
        container.command.is_none(),
        "{}: a command override is not supported",
        fixture.source.path
    );

    let sockets = rewrite_flag(&mut args, "csi-address", |old| {
        // Keep the scheme the manifest used; only the path is the machine's.
        match old.strip_prefix("unix://") {
            Some(_) => format!("unix://{}", socket.display()),
            None => socket.display().to_string(),
        }
    });
    assert!(sockets > 0, "{}: no --csi-address", fixture.source.path);

    // Old port -> (host, new port), for every HTTP listener the flags ask for.
    let mut listeners: BTreeMap<u16, (String, u16)> = BTreeMap::new();
    for flag in ["http-endpoint", "metrics-address"] {
        rewrite_flag(&mut args, flag, |old| {
            let (host, port) = old
                .rsplit_once(':')
                .unwrap_or_else(|| panic!("--{flag}={old} has no port"));
            let port: u16 = port
                .parse()
                .unwrap_or_else(|_| panic!("--{flag}={old}: bad port"));
            let new = listeners
                .entry(port)
                .or_insert_with(|| (host.to_string(), free_dual_stack_port()))
                .1;
            format!("{host}:{new}")
        });
    }

    let named_ports: HashMap<String, u16> = container
        .ports
        .iter()
        .flatten()
        .filter_map(|p| Some((p.name.clone()?, u16::try_from(p.container_port).ok()?)))
        .collect();
    let resolve = |port: &IntOrString, what: &str| -> Vec<SocketAddr> {
        let old = match port {
            IntOrString::Int(n) => u16::try_from(*n).unwrap_or_else(|_| panic!("{what}: port {n}")),
            IntOrString::String(name) => *named_ports
                .get(name)
                .unwrap_or_else(|| panic!("{what}: no container port named {name}")),
        };
        let (host, new) = listeners
            .get(&old)
            .unwrap_or_else(|| panic!("{what}: port {old} is not served by any HTTP flag"));
        loopbacks_for(host, *new)
    };

    let mut targets = Vec::new();
    let probes = [
        ("livenessProbe", &container.liveness_probe),
        ("readinessProbe", &container.readiness_probe),
        ("startupProbe", &container.startup_probe),
    ];
    for (what, probe) in probes {
        let Some(probe) = probe else { continue };
        let Some(HTTPGetAction {
            path,
            port,
            host,
            scheme,
            ..
        }) = &probe.http_get
        else {
            panic!("{what}: only httpGet probes are supported");
        };
        assert!(host.is_none(), "{what}: httpGet.host is not supported");
        assert!(
            scheme.as_deref().unwrap_or("HTTP") == "HTTP",
            "{what}: only HTTP is supported"
        );
        let path = path.clone().unwrap_or_else(|| "/".into());
        targets.push(Target {
            addrs: resolve(port, what),
            what: format!("{what} {path}"),
            path,
        });
    }
    for scrape in &fixture.scrapes {
        targets.push(Target {
            addrs: resolve(&scrape.port, "scrape"),
            what: format!("scrape {}", scrape.path),
            path: scrape.path.clone(),
        });
    }

    // In a pod, an empty --leader-election-namespace means the pod's own
    // namespace (from the service-account file, which POD_NAMESPACE stands in for).
    let lease_namespace = last_bool(&args, "leader-election")
        .unwrap_or(false)
        .then(|| {
            last_value(&args, "leader-election-namespace")
                .filter(|ns| !ns.is_empty())
                .unwrap_or_else(|| fixture.pod.namespace.clone())
        });

    Plan {
        args,
        env,
        targets,
        lease_namespace,
    }
}

fn flag_errors(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|line| {
            line.trim_start().starts_with("error:")
                || FLAG_ERROR_MARKERS.iter().any(|m| line.contains(m))
        })
        .collect()
}

/// Panics with the log when the attacher has exited.
fn assert_running(process: &mut Guard, log: &Path, file: &str) {
    let status = process.try_wait().expect("try_wait");
    if let Some(status) = status {
        panic!(
            "{file}: csi-attacher exited ({status}); log:\n{}",
            tail(&std::fs::read_to_string(log).unwrap_or_default(), 30)
        );
    }
}

async fn ensure_namespace(client: &kube::Client, name: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("Namespace");
    match namespaces.create(&PostParams::default(), &namespace).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(err) => panic!("creating namespace {name}: {err}"),
    }
}

/// Which csi-attacher runs the fixture.
#[derive(Clone, Copy, Debug)]
pub enum Binary {
    /// This project's, from cargo.
    Ours,
    /// The pinned Go external-attacher.
    Upstream,
}

/// The CSI driver a fixture runs against and the volume it attaches.
pub struct Driver<'a> {
    /// The driver's Unix socket (replaces every `--csi-address`).
    pub socket: &'a Path,
    /// The name the driver reports (VA `spec.attacher`, Lease name).
    pub name: &'a str,
    /// The node the VA names; a CSINode is created for it.
    pub node: String,
    /// The node ID that CSINode reports for this driver.
    pub node_id: String,
    /// The PV to attach (created by the run).
    pub volume: PvBuilder,
}

/// A fixture's attacher still running after [`run_fixture`]'s checks passed.
pub struct Run {
    /// The attacher process.
    pub process: Guard,
    /// Its log (stdout and stderr).
    pub log: PathBuf,
    /// The VA it attached.
    pub va: String,
    _dir: tempfile::TempDir,
}

/// Runs fixture `file` with `binary` against `driver` and checks it (see the
/// module doc); panics with what failed. The attacher keeps running in the
/// returned [`Run`] (dropping it kills the process).
pub async fn run_fixture(file: &str, binary: Binary, driver: Driver<'_>) -> Run {
    let fixture = load(file);
    let cp = controlplane::shared();
    let client = cp.client().await;
    ensure_namespace(&client, &fixture.pod.namespace).await;
    let plan = plan(&fixture, driver.socket);

    let dir = tempfile::tempdir().expect("tempdir");
    let log_path = dir.path().join("attacher.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut command = match binary {
        Binary::Ours => {
            let mut command = Command::new(super::attacher_binary());
            // /dev/termination-log is a pod's; upstream has no such flag and only
            // writes there when the driver connection is lost.
            command.arg(format!(
                "--termination-log-path={}",
                dir.path().join("termination-log").display()
            ));
            command
        }
        Binary::Upstream => Command::new(
            controlplane::tools_dir()
                .expect("pinned tools")
                .join("csi-attacher-upstream"),
        ),
    };
    command
        .arg(format!("--kubeconfig={}", cp.kubeconfig.display()))
        .args(&plan.args)
        .env_clear()
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .stdout(log.try_clone().expect("log handle"))
        .stderr(log)
        .stdin(Stdio::null());
    if !plan.env.iter().any(|(k, _)| k == "POD_NAMESPACE") {
        command.env("POD_NAMESPACE", &fixture.pod.namespace);
    }
    let mut process = Guard(Some(procs::spawn(command).expect("start csi-attacher")));

    if let Some(namespace) = &plan.lease_namespace {
        let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
        let name = format!("external-attacher-leader-{}", driver.name.replace('.', "-"));
        super::eventually(&format!("Lease {namespace}/{name} held"), STEP, || {
            assert_running(&mut process, &log_path, file);
            let leases = leases.clone();
            let name = name.clone();
            async move {
                let lease = leases.get_opt(&name).await.ok().flatten()?;
                lease.spec?.holder_identity.filter(|h| !h.is_empty())
            }
        })
        .await;
    }

    // The objects kube-controller-manager and the driver's node plugin make.
    let csinodes: Api<CSINode> = Api::all(client.clone());
    csinodes
        .create(
            &PostParams::default(),
            &csinode(&driver.node, driver.name, &driver.node_id),
        )
        .await
        .expect("create CSINode");
    let pv_name = driver.volume.name();
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    pvs.create(&PostParams::default(), &driver.volume.build())
        .await
        .expect("create PV");
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let va_name = unique("va");
    vas.create(
        &PostParams::default(),
        &va(&va_name, driver.name, &driver.node).pv(&pv_name).build(),
    )
    .await
    .expect("create VA");
    super::eventually(&format!("{file}: VA {va_name} attached"), STEP, || {
        assert_running(&mut process, &log_path, file);
        let vas = vas.clone();
        let name = va_name.clone();
        async move {
            let va = vas.get_opt(&name).await.ok().flatten()?;
            va.status.filter(|s| s.attached).map(|_| ())
        }
    })
    .await;

    // The first answer waits for the server to start; after that every address
    // of a listener that is up must answer at once.
    let mut bound = STEP;
    let mut failures = Vec::new();
    for target in &plan.targets {
        for addr in &target.addrs {
            let deadline = Instant::now() + bound;
            let answer = loop {
                assert_running(&mut process, &log_path, file);
                if let Some(answer) = http_get(*addr, &target.path).await {
                    break Some(answer);
                }
                if Instant::now() >= deadline {
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            match answer {
                Some((200, _)) => bound = QUICK,
                Some((status, body)) => {
                    bound = QUICK;
                    failures.push(format!("{} on {addr}: {status} {body:?}", target.what));
                }
                None => failures.push(format!(
                    "{} on {addr}: no answer within {bound:?}",
                    target.what
                )),
            }
        }
    }

    assert_running(&mut process, &log_path, file);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let errors = flag_errors(&log);
    if !errors.is_empty() {
        failures.push(format!("flag errors in the log:\n{}", errors.join("\n")));
    }
    assert!(failures.is_empty(), "{file}:\n{}", failures.join("\n"));
    Run {
        process,
        log: log_path,
        va: va_name,
        _dir: dir,
    }
}
