//! Two replicas on the real API server: only the leader acts, a standby takes
//! over after SIGKILL within lease duration + 2 s and after SIGTERM within 2 s;
//! a leader frozen (SIGSTOP) past its lease calls its driver no more once
//! resumed; timing client-go refuses exits as upstream does.

use crate::support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::Api;
use kube::runtime::watcher;

use support::controlplane::free_port;
use support::env::{Env, Replica};
use support::mock::MockDriver;
use support::objects::{pv, va};
use support::procs::{self, Guard};
use support::{http_get, unique};

const LEASE: Duration = Duration::from_secs(4);

struct Member {
    name: String,
    http: SocketAddr,
    replica: Replica,
}

fn start(env: &Env, name: &str) -> Member {
    let port = free_port().expect("port");
    let http = format!("--http-endpoint=127.0.0.1:{port}");
    let identity = format!("--leader-election-identity={name}");
    let replica = env.spawn_attacher(
        name,
        &env.cp.kubeconfig,
        &[
            "--leader-election",
            "--leader-election-namespace=default",
            "--leader-election-lease-duration=4s",
            "--leader-election-renew-deadline=3s",
            "--leader-election-retry-period=1s",
            "--leader-election-labels=app:csi-attacher",
            &http,
            &identity,
        ],
    );
    Member {
        name: name.to_string(),
        http: ([127, 0, 0, 1], port).into(),
        replica,
    }
}

async fn holder(leases: &Api<Lease>, name: &str) -> Option<String> {
    leases
        .get_opt(name)
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
}

/// Publish calls this member made, from its own metrics.
async fn publishes(member: &Member) -> u64 {
    let (_, body) = http_get(member.http, "/metrics").await.unwrap_or_default();
    body.lines()
        .filter(|l| {
            l.starts_with("csi_sidecar_operations_seconds_count{")
                && l.contains("ControllerPublishVolume")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Creates a VA and returns how long it took to be attached.
async fn attach_new(env: &Env, node: &str) -> Duration {
    let pv_name = unique("pv");
    env.create_pv(pv(&pv_name, &env.driver).build()).await;
    let va_name = unique("va");
    let started = Instant::now();
    env.create_va(va(&va_name, &env.driver, node).pv(&pv_name).build())
        .await;
    env.wait_attached(&va_name).await;
    started.elapsed()
}

#[tokio::test]
async fn only_the_leader_acts_and_a_standby_takes_over_after_kill_and_term() {
    let env = Env::without_attacher(&[]).await;
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), "default");
    let lease_name = format!("external-attacher-leader-{}", env.driver.replace('.', "-"));
    let node = unique("node");
    env.create_node(&node).await;

    let mut members = vec![start(&env, "replica-a"), start(&env, "replica-b")];
    let first = support::eventually("a leader", Duration::from_secs(20), || async {
        holder(&leases, &lease_name).await.filter(|h| !h.is_empty())
    })
    .await;
    let lease = leases.get(&lease_name).await.expect("lease");
    assert_eq!(
        lease
            .metadata
            .labels
            .and_then(|l| l.get("app").cloned())
            .as_deref(),
        Some("csi-attacher")
    );

    // Only the leader publishes; the standby's caches are warm but it writes nothing.
    attach_new(&env, &node).await;
    let leader_index = members
        .iter()
        .position(|m| m.name == first)
        .expect("leader is a member");
    let standby_index = 1 - leader_index;
    support::eventually("standby ready", Duration::from_secs(10), || async {
        http_get(members[standby_index].http, "/readyz")
            .await
            .filter(|(s, _)| *s == 200)
    })
    .await;
    assert_eq!(publishes(&members[leader_index]).await, 1);
    assert_eq!(publishes(&members[standby_index]).await, 0);
    let (_, standby_metrics) = http_get(members[standby_index].http, "/metrics")
        .await
        .expect("metrics");
    // The standby queues no work it will not do (upstream's standby runs no informers).
    for queue in ["csi-attacher-va", "csi-attacher-pv"] {
        for family in ["workqueue_adds_total", "workqueue_depth"] {
            let line = format!(r#"{family}{{name="{queue}"}} 0"#);
            assert!(
                standby_metrics.contains(&line),
                "standby: no {line} in\n{standby_metrics}"
            );
        }
    }
    let (_, leader_metrics) = http_get(members[leader_index].http, "/metrics")
        .await
        .expect("metrics");
    assert!(
        !leader_metrics.contains(r#"workqueue_adds_total{name="csi-attacher-va"} 0"#),
        "the leader counts its adds"
    );
    assert!(standby_metrics.contains(r#"leader_election_master_status{name=""} 0"#));

    // SIGKILL the leader: the standby attaches within lease duration + 2 s.
    members[leader_index].replica.process.signal(libc::SIGKILL);
    let took = attach_new(&env, &node).await;
    println!("attach after SIGKILL of the leader took {took:?}");
    if took > Duration::from_millis(4500) {
        println!("{}", members[standby_index].replica.logs());
    }
    assert!(
        took < LEASE + Duration::from_secs(2),
        "takeover after SIGKILL took {took:?}"
    );
    let second = members[standby_index].name.clone();
    assert_eq!(
        holder(&leases, &lease_name).await.as_deref(),
        Some(second.as_str())
    );
    members.remove(leader_index);

    // A new standby joins; SIGTERM the leader: takeover within 2 s, Lease released, exit 0.
    members.push(start(&env, "replica-c"));
    support::eventually("replica-c ready", Duration::from_secs(20), || async {
        http_get(members[1].http, "/readyz")
            .await
            .filter(|(s, _)| *s == 200)
    })
    .await;
    members[0].replica.process.signal(libc::SIGTERM);
    let took = attach_new(&env, &node).await;
    println!("attach after SIGTERM of the leader took {took:?}");
    assert!(
        took < Duration::from_secs(2),
        "takeover after SIGTERM took {took:?}"
    );
    assert_eq!(
        holder(&leases, &lease_name).await.as_deref(),
        Some("replica-c")
    );
    let code = support::eventually("old leader to exit", Duration::from_secs(10), || {
        let status = members[0].replica.process.try_wait().expect("try_wait");
        async move { status.map(|s| s.code()) }
    })
    .await;
    assert_eq!(
        code,
        Some(0),
        "graceful exit:\n{}",
        support::env::tail(&members[0].replica.logs(), 20)
    );
    assert!(members[0].replica.logs().contains("Released leader lease"));
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_exits_1() {
    let env = Env::without_attacher(&[]).await;
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), "default");
    let lease_name = format!("external-attacher-leader-{}", env.driver.replace('.', "-"));
    let mut member = start(&env, "replica-x");
    support::eventually("replica-x leads", Duration::from_secs(20), || async {
        holder(&leases, &lease_name)
            .await
            .filter(|h| h == "replica-x")
    })
    .await;
    // It created the Lease, so it holds it a lease duration before it acts;
    // wait until it acts (a Lease taken during that hold only makes it a
    // standby again: it never led).
    support::eventually("replica-x acts", Duration::from_secs(20), || {
        let acting = member
            .replica
            .logs()
            .contains("Successfully acquired lease");
        async move { acting.then_some(()) }
    })
    .await;
    // Someone else grabs the lease (as after a long network partition). The
    // leader renews meanwhile: a 409 Conflict means read again and retry.
    support::eventually(
        "the intruder to take the lease",
        Duration::from_secs(10),
        || async {
            let mut lease = leases.get(&lease_name).await.expect("lease");
            if let Some(spec) = lease.spec.as_mut() {
                spec.holder_identity = Some("intruder".into());
                spec.lease_duration_seconds = Some(3600);
            }
            match leases
                .replace(&lease_name, &Default::default(), &lease)
                .await
            {
                Ok(_) => Some(()),
                Err(kube::Error::Api(status)) if status.code == 409 => None,
                Err(err) => panic!("take the lease: {err}"),
            }
        },
    )
    .await;
    let code = support::eventually("the old leader to exit", Duration::from_secs(15), || {
        let status = member.replica.process.try_wait().expect("try_wait");
        async move { status.map(|s| s.code()) }
    })
    .await;
    assert_eq!(code, Some(1));
    assert!(member.replica.logs().contains("Stopped leading"));
}

/// Starts an attacher named `name` on its own driver `mock` (so the driver's
/// ledger is this replica's), logging to `<dir>/<name>.log`.
fn start_on(env: &Env, mock: &MockDriver, dir: &Path, name: &str, extra: &[&str]) -> Replica {
    let log_path = dir.join(format!("{name}.log"));
    let log = std::fs::File::create(&log_path).expect("attacher log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_csi-attacher"));
    command
        .arg(format!("--csi-address={}", mock.address()))
        .arg(format!("--kubeconfig={}", env.cp.kubeconfig.display()))
        .arg(format!(
            "--termination-log-path={}",
            dir.join(format!("{name}.termination-log")).display()
        ))
        .arg(format!("--leader-election-identity={name}"))
        .args([
            "--v=2",
            "--kube-api-qps=1000",
            "--kube-api-burst=2000",
            "--leader-election",
            "--leader-election-namespace=default",
            "--leader-election-lease-duration=4s",
            "--leader-election-renew-deadline=3s",
            "--leader-election-retry-period=1s",
        ])
        .args(extra)
        .env("RUST_LOG", "info,csi_attacher=debug")
        .stdout(Stdio::null())
        .stderr(log);
    Replica {
        process: Guard(Some(procs::spawn(command).expect("start csi-attacher"))),
        log: log_path,
    }
}

/// Every version of the Lease `name`, in order, from a watch.
fn record_lease(leases: Api<Lease>, name: &str) -> Arc<Mutex<Vec<LeaseSpec>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher::watcher(leases, config));
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) = event {
                if let Some(spec) = lease.spec {
                    sink.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(spec);
                }
            }
        }
    });
    seen
}

fn nanos(time: &k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime) -> i128 {
    time.0.as_nanosecond()
}

/// (method, received at in Unix nanoseconds) of every call in `mock`'s ledger.
async fn driver_calls(mock: &MockDriver) -> Vec<(String, i128)> {
    mock.ledger()
        .await
        .iter()
        .map(|e| {
            (
                e["method"].as_str().unwrap_or_default().to_string(),
                i128::from(e["time_unix_nanos"].as_u64().unwrap_or_default()),
            )
        })
        .collect()
}

const RENEW_DEADLINE: Duration = Duration::from_secs(3);
const STATE_CALLS: [&str; 3] = [
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "ListVolumes",
];

#[tokio::test]
async fn a_leader_frozen_past_its_lease_calls_its_driver_no_more_when_resumed() {
    let env = Env::without_attacher(&[]).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), "default");
    let lease_name = format!("external-attacher-leader-{}", env.driver.replace('.', "-"));
    let history = record_lease(leases.clone(), &lease_name);
    // Each replica has a driver of its own: its ledger tells who called.
    let mock_a = &env.mock;
    let mock_b = MockDriver::start(&[&format!("--name={}", env.driver)]).expect("mock b");
    let node = unique("node");
    env.create_node(&node).await;
    // Fast retries, so the frozen leader has a retry due the moment it resumes.
    let retries = ["--retry-interval-start=100ms", "--retry-interval-max=200ms"];

    let mut a = start_on(&env, mock_a, dir.path(), "replica-a", &retries);
    support::eventually("replica-a leads", Duration::from_secs(20), || async {
        holder(&leases, &lease_name)
            .await
            .filter(|h| h == "replica-a")
    })
    .await;
    let b = start_on(&env, &mock_b, dir.path(), "replica-b", &retries);

    // replica-a's driver refuses the publish: replica-a keeps retrying it.
    mock_a
        .set_fault(
            "ControllerPublishVolume",
            serde_json::json!({"code": "Internal", "message": "injected"}),
        )
        .await;
    let pv_name = unique("pv");
    env.create_pv(pv(&pv_name, &env.driver).build()).await;
    let va_name = unique("va");
    env.create_va(va(&va_name, &env.driver, &node).pv(&pv_name).build())
        .await;
    support::eventually("replica-a retrying", Duration::from_secs(20), || async {
        let publishes = mock_a.calls("ControllerPublishVolume").await.len();
        (publishes >= 3).then_some(())
    })
    .await;

    // Freeze replica-a until replica-b has taken over and attached the volume.
    a.process.signal(libc::SIGSTOP);
    let frozen_at = Instant::now();
    support::eventually("replica-b takes over", Duration::from_secs(20), || async {
        holder(&leases, &lease_name)
            .await
            .filter(|h| h == "replica-b")
    })
    .await;
    let took_over = frozen_at.elapsed();
    env.wait_attached(&va_name).await;
    a.process.signal(libc::SIGCONT);
    let code = support::eventually("replica-a to exit", Duration::from_secs(20), || {
        let status = a.process.try_wait().expect("try_wait");
        async move { status.map(|s| s.code()) }
    })
    .await;
    let a_log = a.logs();
    assert_eq!(
        code,
        Some(1),
        "lost leadership:\n{}",
        support::env::tail(&a_log, 30)
    );

    // replica-a's window: its last renewal (by its own timestamp, taken after
    // the attempt started) + renew deadline; replica-b's starts at its acquisition.
    let specs = history
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let holder_is = |s: &LeaseSpec, who: &str| s.holder_identity.as_deref() == Some(who);
    let a_last_renewal = specs
        .iter()
        .filter(|s| holder_is(s, "replica-a"))
        .filter_map(|s| s.renew_time.as_ref().map(nanos))
        .max()
        .expect("replica-a renewed");
    let a_window_end = a_last_renewal + RENEW_DEADLINE.as_nanos() as i128;
    let b_acquired = specs
        .iter()
        .find(|s| holder_is(s, "replica-b"))
        .and_then(|s| s.acquire_time.as_ref().map(nanos))
        .expect("replica-b acquired");
    let a_calls = driver_calls(mock_a).await;
    let b_calls = driver_calls(&mock_b).await;
    let late: Vec<_> = a_calls
        .iter()
        .filter(|(method, at)| STATE_CALLS.contains(&method.as_str()) && *at >= a_window_end)
        .map(|(method, at)| (method, (at - a_window_end) as f64 / 1e9))
        .collect();
    println!(
        "frozen for {took_over:?} until replica-b took over; replica-a's window ended {:.3}s before replica-b acquired; replica-a made {} calls, replica-b {}; replica-a refused {} syncs after it resumed",
        (b_acquired - a_window_end) as f64 / 1e9,
        a_calls.len(),
        b_calls.len(),
        a_log.matches("Not leading").count()
    );
    assert!(
        late.is_empty(),
        "replica-a called its driver after its window (method, seconds late): {late:?}\n{}",
        support::env::tail(&a_log, 30)
    );
    assert!(
        b_acquired >= a_window_end,
        "replica-b acquired {:.3}s inside replica-a's window",
        (a_window_end - b_acquired) as f64 / 1e9
    );
    let early: Vec<_> = b_calls
        .iter()
        .filter(|(method, at)| STATE_CALLS.contains(&method.as_str()) && *at < b_acquired)
        .collect();
    assert!(
        early.is_empty(),
        "replica-b called before it led: {early:?}"
    );
    assert!(
        b_calls.iter().any(|(m, _)| m == "ControllerPublishVolume"),
        "replica-b attached the volume"
    );
    drop(b);
}

/// A kubeconfig for a server that is never reached: timing is checked first.
fn unreachable_kubeconfig(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\n\
         clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n\
         users: [{name: u, user: {token: t}}]\n\
         contexts: [{name: x, context: {cluster: c, user: u}}]\n\
         current-context: x\n",
    )
    .expect("kubeconfig");
    path
}

#[test]
fn leader_election_timing_client_go_refuses_exits_as_upstream() {
    let ours = Path::new(env!("CARGO_BIN_EXE_csi-attacher"));
    let upstream = support::controlplane::tools_dir()
        .expect("tools")
        .join("csi-attacher-upstream");
    // Upstream checks the timing after it has probed the driver.
    let mock = MockDriver::start(&[]).expect("mock");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = format!(
        "--kubeconfig={}",
        unreachable_kubeconfig(dir.path()).display()
    );
    let csi = format!("--csi-address={}", mock.address());
    // Measured on upstream v4.12.0: client-go's NewLeaderElector error as a panic, exit 2.
    let cases: &[(&[&str], &str)] = &[
        (
            &["--leader-election-lease-duration=10s"],
            "leaseDuration must be greater than renewDeadline",
        ),
        (
            &["--leader-election-renew-deadline=20s"],
            "leaseDuration must be greater than renewDeadline",
        ),
        (
            &[
                "--leader-election-lease-duration=900ms",
                "--leader-election-renew-deadline=950ms",
                "--leader-election-retry-period=100ms",
            ],
            "leaseDuration must be greater than renewDeadline",
        ),
        (
            &["--leader-election-retry-period=9s"],
            "renewDeadline must be greater than retryPeriod*JitterFactor",
        ),
        (
            &["--leader-election-retry-period=0"],
            "retryPeriod must be greater than zero",
        ),
    ];
    for (extra, text) in cases {
        for binary in [ours, upstream.as_path()] {
            let output = Command::new(binary)
                .args([kubeconfig.as_str(), csi.as_str(), "--leader-election"])
                .args(*extra)
                .env_remove("KUBERNETES_SERVICE_HOST")
                .output()
                .expect("run");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(
                output.status.code(),
                Some(2),
                "{} {extra:?}: {stderr}",
                binary.display()
            );
            assert!(
                stderr.contains(text),
                "{} {extra:?}: {stderr}",
                binary.display()
            );
        }
    }
}
