//! Two replicas on the real API server: only the leader acts, a standby takes
//! over after SIGKILL within lease duration + 2 s and after SIGTERM within 2 s.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

use support::controlplane::free_port;
use support::env::{Env, Replica};
use support::objects::{pv, va};
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
