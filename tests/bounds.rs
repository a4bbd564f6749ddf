//! Bounded waits and loud failures, against the real API server and
//! csi-mock-driver: a black-holed API connection, a slow Events API, a
//! ListVolumes listing that does not end, a Secret that is not UTF-8.

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use support::env::{attach_error_message, Env};
use support::objects::pv;
use support::{base64_encode, unique};

/// A loopback TCP proxy to the API server that can stop forwarding: while
/// black-holed it accepts connections and holds every byte, on old
/// connections and new ones alike.
struct Proxy {
    port: u16,
    blackhole: Arc<AtomicBool>,
}

impl Proxy {
    async fn start(upstream: std::net::SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let blackhole = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&blackhole);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let flag = Arc::clone(&flag);
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        pipe(client_read, server_write, Arc::clone(&flag)),
                        pipe(server_read, client_write, flag),
                    );
                });
            }
        });
        Self { port, blackhole }
    }

    fn set_blackhole(&self, on: bool) {
        self.blackhole.store(on, Ordering::SeqCst);
    }
}

/// Copies `from` to `to`, holding each chunk while the proxy is black-holed.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    blackhole: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        while blackhole.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while blackhole.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// A copy of the admin kubeconfig that points at `port` on 127.0.0.1 (the
/// API server's certificate is for that IP, so TLS still verifies).
fn kubeconfig_via(env: &Env, port: u16) -> std::path::PathBuf {
    let text = std::fs::read_to_string(&env.cp.kubeconfig).expect("admin kubeconfig");
    let proxied = text.replace(&env.cp.server, &format!("https://127.0.0.1:{port}"));
    assert_ne!(text, proxied, "the kubeconfig names {}", env.cp.server);
    let path = env.cp.dir.join(format!("{}.kubeconfig", unique("proxied")));
    std::fs::write(&path, proxied).expect("write kubeconfig");
    path
}

fn server_addr(env: &Env) -> std::net::SocketAddr {
    let host_port = env
        .cp
        .server
        .strip_prefix("https://")
        .expect("https server");
    host_port.parse().expect("ip:port")
}

/// A black-holed API connection holds a worker no longer than the request
/// deadline (`--timeout`, at least 5 s); the key is retried, and the VA
/// attaches once the connection heals.
#[tokio::test]
async fn a_black_holed_api_server_fails_the_attempt_within_the_bound_and_the_va_attaches_once_healed(
) {
    let env = Env::without_attacher(&[]).await;
    let proxy = Proxy::start(server_addr(&env)).await;
    let kubeconfig = kubeconfig_via(&env, proxy.port);
    let env = env.with_attacher(
        &kubeconfig,
        &[
            "--timeout=5s",
            "--retry-interval-start=200ms",
            "--retry-interval-max=1s",
        ],
    );
    env.attached().await; // caches synced and leading, all through the proxy

    // Publish hangs; the API goes silent meanwhile, so the next write
    // (attached=true on /status) meets the black hole.
    env.mock
        .set_fault("ControllerPublishVolume", json!({"hang": true}))
        .await;
    let a = env.create_attachment(pv(&unique("pv"), &env.driver)).await;
    // Our finalizer is written just before Publish is called.
    env.wait_va(&a.va, "given our finalizer", |va| {
        va.and_then(|v| v.metadata.finalizers.as_ref())
            .is_some_and(|f| f.contains(&env.finalizer))
    })
    .await;
    proxy.set_blackhole(true);
    env.mock.clear_faults().await;
    let silent_since = Instant::now();
    let text = "the API server did not answer within 5s";
    wait_log(&env, text, Duration::from_secs(20)).await;
    let gave_up_after = silent_since.elapsed();
    assert!(
        gave_up_after < Duration::from_secs(12),
        "gave up after {gave_up_after:?}"
    );
    // The key is retried (with backoff), each attempt bounded the same way.
    support::eventually("a retried attempt", Duration::from_secs(20), || async {
        (env.logs().matches(text).count() >= 2).then_some(())
    })
    .await;

    proxy.set_blackhole(false);
    env.wait_attached(&a.va).await;
}

/// Waits until the attacher's log contains `text`; panics with its tail.
async fn wait_log(env: &Env, text: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while !env.logs().contains(text) {
        assert!(
            Instant::now() < deadline,
            "no {text:?} in the log after {within:?}:\n{}",
            support::env::tail(&env.logs(), 30)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A validating webhook on Events whose server accepts and never answers:
/// every Event create then takes the webhook's 10 s timeout.
async fn slow_events_api(env: &Env) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&hits);
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            held.push(stream);
        }
    });
    // Any CA will do: the TLS handshake never completes.
    let ca = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).expect("cert");
    let ca_bundle = base64_encode(ca.cert.pem().as_bytes());
    let name = unique("slow-events");
    let webhook: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": name},
        "webhooks": [{
            "name": "slow.events.example.com",
            "clientConfig": {"url": format!("https://127.0.0.1:{port}/"), "caBundle": ca_bundle},
            "rules": [{
                "apiGroups": ["", "events.k8s.io"],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["events"],
            }],
            "failurePolicy": "Ignore",
            "timeoutSeconds": 10,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
        }],
    }))
    .expect("webhook");
    Api::<MutatingWebhookConfiguration>::all(env.client.clone())
        .create(&PostParams::default(), &webhook)
        .await
        .expect("create webhook");
    (name, hits)
}

/// Events are posted off the worker path: with every Event create taking
/// 10 s, an attach that failed four times (two Events) still completes at the
/// pace of its backoff.
#[tokio::test]
async fn a_slow_events_api_does_not_slow_attaches() {
    let env = Env::start(
        &[],
        &["--retry-interval-start=100ms", "--retry-interval-max=400ms"],
    )
    .await;
    let (webhook, hits) = slow_events_api(&env).await;
    env.mock
        .set_fault(
            "ControllerPublishVolume",
            json!({"code": "Internal", "message": "not yet", "times": 4}),
        )
        .await;
    let started = Instant::now();
    let a = env.create_attachment(pv(&unique("pv"), &env.driver)).await;
    env.wait_attached(&a.va).await;
    let took = started.elapsed();
    assert_eq!(
        env.mock.calls("ControllerPublishVolume").await.len(),
        5,
        "four failures, then success"
    );
    // Inline posting waited 2 x 10 s here; backoff alone is under 2 s.
    assert!(took < Duration::from_secs(8), "attach took {took:?}");
    support::eventually(
        "the Events to reach the slow webhook",
        Duration::from_secs(20),
        || async { (hits.load(Ordering::SeqCst) > 0).then_some(()) },
    )
    .await;
    Api::<MutatingWebhookConfiguration>::all(env.client.clone())
        .delete(&webhook, &DeleteParams::default())
        .await
        .expect("delete webhook");
}

/// A listing that does not end within the pass limit (max(--reconcile-sync,
/// --timeout) = 1 s here; 30 pages of 100 ms each) ends the pass with an error.
#[tokio::test]
async fn a_listing_longer_than_the_pass_limit_ends_the_pass_with_an_error() {
    let env = Env::start(
        &[],
        &["--reconcile-sync=300ms", "--timeout=1s", "--max-entries=1"],
    )
    .await;
    let table: serde_json::Map<String, serde_json::Value> = (0..30)
        .map(|i| (format!("vol-{i:02}"), json!(["n"])))
        .collect();
    env.mock
        .set_published(serde_json::Value::Object(table))
        .await;
    env.mock
        .set_fault("ListVolumes", json!({"delay_ms": 100}))
        .await;
    support::eventually(
        "the pass limit in the log",
        Duration::from_secs(15),
        || async {
            env.logs()
                .contains("the listing did not end within 1s")
                .then_some(())
        },
    )
    .await;
    // The next pass starts again from the first page.
    let before = env.mock.calls("ListVolumes").await.len();
    support::eventually("another pass", Duration::from_secs(10), || async {
        let lists = env.mock.calls("ListVolumes").await;
        lists[before..]
            .iter()
            .any(|c| c["starting_token"] == "")
            .then_some(())
    })
    .await;
}

/// A Secret value that is not UTF-8 fails the attach with a clear error on the
/// VA and in the log, naming the key and never the value; the driver is not called.
#[tokio::test]
async fn a_secret_that_is_not_utf8_fails_the_attach_without_showing_it() {
    let env = Env::start(&[], &[]).await;
    let secret = unique("secret");
    // "hunter2" followed by bytes that are not UTF-8.
    let value = base64_encode(b"hunter2\xff\xfe");
    env.create_secret(
        &secret,
        json!({"username": base64_encode(b"admin"), "password": value}),
    )
    .await;
    let a = env
        .create_attachment(pv(&unique("pv"), &env.driver).publish_secret("default", &secret))
        .await;
    let va = env.wait_attach_error(&a.va).await;
    let message = attach_error_message(&va).expect("attachError message");
    assert_eq!(
        message,
        format!(
            "failed to load secret \"default/{secret}\": the value of key \"password\" is not valid UTF-8 (CSI secrets are strings)"
        )
    );
    assert!(!va.status.is_some_and(|s| s.attached));
    support::eventually("the error in the log", Duration::from_secs(10), || async {
        env.logs().contains("is not valid UTF-8").then_some(())
    })
    .await;
    let logs = env.logs();
    assert!(!logs.contains("hunter2"), "the value is never logged");
    assert!(env.mock.calls("ControllerPublishVolume").await.is_empty());
}

/// Zero intervals are raised to 100 ms instead of spinning: the driver is
/// reached at all (a zero --timeout fails every call before it is sent), a
/// failing attach is retried no faster than every 100 ms, and ListVolumes
/// passes come no faster either.
#[tokio::test]
async fn zero_intervals_are_raised_instead_of_spinning() {
    let env = Env::start(
        &[],
        &[
            "--timeout=0",
            "--retry-interval-start=0",
            "--retry-interval-max=0",
            "--reconcile-sync=0",
        ],
    )
    .await;
    env.attached().await;
    assert!(env.logs().contains("Flag value out of range"));

    env.mock
        .set_fault(
            "ControllerPublishVolume",
            json!({"code": "Internal", "message": "no"}),
        )
        .await;
    let a = env.create_attachment(pv(&unique("pv"), &env.driver)).await;
    env.wait_attach_error(&a.va).await;
    let publishes = || async {
        env.mock
            .calls("ControllerPublishVolume")
            .await
            .iter()
            .filter(|c| c["volume_id"] == a.handle)
            .count()
    };
    let (started, before) = (Instant::now(), publishes().await);
    support::eventually("five more attempts", Duration::from_secs(20), || async {
        (publishes().await >= before + 5).then_some(())
    })
    .await;
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(400), "5 retries in {took:?}");

    let lists = || async { env.mock.calls("ListVolumes").await.len() };
    let (started, before) = (Instant::now(), lists().await);
    support::eventually("five more passes", Duration::from_secs(20), || async {
        (lists().await >= before + 5).then_some(())
    })
    .await;
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(400), "5 passes in {took:?}");
    env.mock.clear_faults().await;
}
