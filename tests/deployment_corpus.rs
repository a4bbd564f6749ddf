//! Deployment corpus: the csi-attacher containers of public manifests and Helm
//! charts (`tests/corpus/*.yaml`), run with their own args and env against the
//! control plane and the mock driver, the way a kubelet would start them.
//!
//! A fixture holds facts transcribed from its source (named in its header):
//! `source` (repo, path, version), `pod` (the pod's `name`, made up in the form
//! its controller generates, and its `namespace`), optional
//! `scrapes` (HTTP `port`/`path` a chart's Service or ServiceMonitor scrapes) and
//! `container`, a Kubernetes Container as rendered.
//!
//! The harness changes only what a test machine must: the CSI socket becomes the
//! mock's, HTTP ports become free ones (the host part is kept), and it adds
//! `--kubeconfig` and `--termination-log-path`. `POD_NAMESPACE` stands in for the
//! service-account namespace file a pod has. Each run must attach a VA, take the
//! Lease in the namespace the flags name, answer every probe and scrape with 200
//! on 127.0.0.1 and, for a wildcard host, on [::1] too, and keep running without
//! a flag error in its log.
//!
//! `ours::*` runs this project's binary, `upstream::*` the pinned Go
//! external-attacher on the same fixture: what upstream passes, ours must.

use crate::support;

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Container, EnvVar, HTTPGetAction, Namespace};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, PostParams};
use serde::Deserialize;

use support::env::{tail, Env};
use support::objects::pv;
use support::procs::{self, Guard};
use support::{http_get, unique};

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
struct Fixture {
    source: Source,
    pod: Pod,
    #[serde(default)]
    scrapes: Vec<Scrape>,
    container: Container,
}

/// Where a fixture was transcribed from.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Source {
    repo: String,
    path: String,
    version: String,
}

/// The pod facts the container sees.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Pod {
    name: String,
    namespace: String,
}

/// An HTTP endpoint a chart's monitoring objects scrape.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scrape {
    port: IntOrString,
    path: String,
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

fn load(file: &str) -> Fixture {
    let path = corpus_dir().join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// Kubernetes' `$(VAR)` expansion (kubelet, third_party/forked/golang/expansion):
/// `$$` is a literal `$`, `$(NAME)` is replaced when NAME is defined and kept
/// as written when not, an unclosed `$(` and any other `$x` stay as they are.
fn expand(input: &str, vars: &HashMap<String, String>) -> String {
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
fn rewrite_flag(args: &mut [String], name: &str, mut rewrite: impl FnMut(&str) -> String) -> usize {
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
fn last_value(args: &[String], name: &str) -> Option<String> {
    value_slots(args, name)
        .last()
        .map(|slot| slot_value(args, slot))
}

/// The last setting of bool flag `name` (`-name`, `-name=v`), parsed like Go's
/// strconv.ParseBool.
fn last_bool(args: &[String], name: &str) -> Option<bool> {
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
#[derive(Clone, Copy)]
enum Binary {
    /// This project's, from cargo.
    Ours,
    /// The pinned Go external-attacher.
    Upstream,
}

async fn run_fixture(file: &str, binary: Binary) {
    let fixture = load(file);
    let mut env = Env::without_attacher(&[]).await;
    ensure_namespace(&env.client, &fixture.pod.namespace).await;
    let plan = plan(&fixture, &env.mock.socket);

    let dir = tempfile::tempdir().expect("tempdir");
    let log_path = dir.path().join("attacher.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut command = match binary {
        Binary::Ours => {
            let mut command = Command::new(env!("CARGO_BIN_EXE_csi-attacher"));
            // /dev/termination-log is a pod's; upstream has no such flag and only
            // writes there when the driver connection is lost.
            command.arg(format!(
                "--termination-log-path={}",
                dir.path().join("termination-log").display()
            ));
            command
        }
        Binary::Upstream => Command::new(
            support::controlplane::tools_dir()
                .expect("pinned tools")
                .join("csi-attacher-upstream"),
        ),
    };
    command
        .arg(format!("--kubeconfig={}", env.cp.kubeconfig.display()))
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
    env.log = log_path.clone();

    if let Some(namespace) = &plan.lease_namespace {
        let leases: Api<Lease> = Api::namespaced(env.client.clone(), namespace);
        let name = format!("external-attacher-leader-{}", env.driver.replace('.', "-"));
        support::eventually(&format!("Lease {namespace}/{name} held"), STEP, || {
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

    let attachment = env.create_attachment(pv(&unique("pv"), &env.driver)).await;
    support::eventually(
        &format!("{file}: VA {} attached", attachment.va),
        STEP,
        || {
            assert_running(&mut process, &log_path, file);
            let vas = env.vas.clone();
            let name = attachment.va.clone();
            async move {
                let va = vas.get_opt(&name).await.ok().flatten()?;
                va.status.filter(|s| s.attached).map(|_| ())
            }
        },
    )
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
}

macro_rules! corpus {
    ($($test:ident => $file:literal,)*) => {
        const FILES: &[&str] = &[$($file),*];

        /// This project's binary on each fixture.
        mod ours {
            $(
                #[tokio::test]
                async fn $test() {
                    super::run_fixture($file, super::Binary::Ours).await;
                }
            )*
        }

        /// Upstream's binary on each fixture: the fixtures and checks are right.
        mod upstream {
            $(
                #[tokio::test]
                async fn $test() {
                    super::run_fixture($file, super::Binary::Upstream).await;
                }
            )*
        }
    };
}

corpus! {
    external_attacher_example => "external-attacher-example.yaml",
    csi_driver_host_path => "csi-driver-host-path.yaml",
    aws_ebs_chart_defaults => "aws-ebs-chart-defaults.yaml",
    aws_ebs_chart_metrics => "aws-ebs-chart-metrics.yaml",
    aws_ebs_chart_additional_args => "aws-ebs-chart-additional-args.yaml",
    azuredisk_deploy => "azuredisk-deploy.yaml",
    gcp_pd_stable_master => "gcp-pd-stable-master.yaml",
}

#[test]
fn every_fixture_in_the_corpus_has_a_test() {
    let mut on_disk: Vec<String> = std::fs::read_dir(corpus_dir())
        .expect("tests/corpus")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = FILES.iter().map(|f| f.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed);
    for file in FILES {
        let fixture = load(file);
        assert_eq!(fixture.container.name, "csi-attacher", "{file}");
        assert!(
            !fixture.source.repo.is_empty() && !fixture.source.version.is_empty(),
            "{file}: source"
        );
    }
}

#[test]
fn expansion_follows_the_kubernetes_rules() {
    let vars: HashMap<String, String> = [("A", "x"), ("EMPTY", "")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let cases = [
        ("--csi-address=$(A)", "--csi-address=x"),
        ("$(A)$(A)", "xx"),
        ("[$(EMPTY)]", "[]"),
        ("$(UNSET)", "$(UNSET)"),
        ("$$(A)", "$(A)"),
        ("$$$(A)", "$x"),
        ("$$", "$"),
        ("$(A", "$(A"),
        ("a$b", "a$b"),
        ("end$", "end$"),
        ("$", "$"),
        ("é$(A)é", "éxé"),
        ("", ""),
    ];
    for (input, want) in cases {
        assert_eq!(expand(input, &vars), want, "{input:?}");
    }
}

#[test]
fn flags_are_found_in_every_go_form() {
    let mut args: Vec<String> = [
        "-csi-address=/a",
        "--csi-address",
        "/b",
        "--http-endpoint=:1",
        "-v=2",
    ]
    .map(String::from)
    .to_vec();
    assert_eq!(
        rewrite_flag(&mut args, "csi-address", |old| format!("{old}!")),
        2
    );
    assert_eq!(args[..3], ["-csi-address=/a!", "--csi-address", "/b!"]);
    assert_eq!(last_value(&args, "http-endpoint").as_deref(), Some(":1"));
    assert_eq!(last_value(&args, "csi-address").as_deref(), Some("/b!"));
    let bools = |a: &[&str]| {
        last_bool(
            &a.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            "leader-election",
        )
    };
    assert_eq!(bools(&["--leader-election"]), Some(true));
    assert_eq!(
        bools(&["-leader-election=true", "--leader-election=false"]),
        Some(false)
    );
    assert_eq!(bools(&["--leader-election-namespace=x"]), None);
}
