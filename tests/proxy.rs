//! Proxies to the API server as client-go uses them, against a real CONNECT
//! and SOCKS5 proxy on loopback (`support::connect_proxy`) that counts its
//! tunnels.
//!
//! The API server listens on 127.0.0.1, which Go never proxies from the
//! environment. So the kubeconfigs here name it `apiserver.test`, a name
//! only the proxy resolves (to 127.0.0.1): an attacher that attaches a VA
//! with that name reached the API server through the proxy, and could not
//! have otherwise. TLS verifies against the API server's certificate through
//! `tls-server-name: localhost`, inside the tunnel.

use crate::support;

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use serde_json::json;

use support::connect_proxy::{Answer, ConnectProxy};
use support::env::{tail, Env, WAIT};
use support::{eventually, unique};

/// The made-up name of the API server that only the proxy resolves.
const NAME: &str = "apiserver.test";

fn api_port(env: &Env) -> u16 {
    env.cp
        .server
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .expect("https://127.0.0.1:<port>")
}

/// A copy of the admin kubeconfig whose cluster is `server` (verified as
/// `localhost`) with `proxy_url` if given.
fn kubeconfig(env: &Env, server: &str, proxy_url: Option<&str>) -> PathBuf {
    let text = std::fs::read_to_string(&env.cp.kubeconfig).expect("admin kubeconfig");
    let mut config: serde_json::Value = serde_json::from_str(&text).expect("JSON kubeconfig");
    let cluster = &mut config["clusters"][0]["cluster"];
    cluster["server"] = json!(server);
    cluster["tls-server-name"] = json!("localhost");
    if let Some(url) = proxy_url {
        cluster["proxy-url"] = json!(url);
    }
    let path = env.cp.dir.join(format!("{}.kubeconfig", unique("proxy")));
    std::fs::write(&path, serde_json::to_vec_pretty(&config).expect("JSON")).expect("write");
    path
}

/// Every CONNECT asked the proxy for the API server by the name the
/// kubeconfig gives (the proxy resolved it, not the attacher).
fn assert_tunnelled_to(proxy: &ConnectProxy, target: &str, env: &Env) {
    let targets = proxy.targets();
    assert!(
        proxy.tunnels() > 0,
        "no tunnel opened; targets {targets:?}\n{}",
        tail(&env.logs(), 20)
    );
    assert!(
        targets.iter().all(|t| t == target),
        "CONNECT targets {targets:?}, expected only {target}"
    );
}

/// `--kubeconfig` with `HTTPS_PROXY`: every API request goes through the
/// proxy (NO_PROXY entries that do not name the API server change nothing).
/// Before, the attacher exited 1 at start-up.
#[tokio::test]
async fn https_proxy_carries_the_api_requests_through_a_tunnel() {
    let proxy = ConnectProxy::start(&[NAME], Answer::Tunnel).await;
    let env = Env::without_attacher(&[]).await;
    let target = format!("{NAME}:{}", api_port(&env));
    let kubeconfig = kubeconfig(&env, &format!("https://{target}"), None);
    let env = env.with_attacher_env(
        &kubeconfig,
        &[],
        &[
            ("HTTPS_PROXY", &proxy.url()),
            (
                "NO_PROXY",
                "127.0.0.1,localhost,.svc,other.test,apiserver.test:443",
            ),
            // HTTP_PROXY is for http:// servers only.
            ("HTTP_PROXY", "http://127.0.0.1:1"),
        ],
    );
    env.attached().await;
    assert_tunnelled_to(&proxy, &target, &env);
}

/// Lower case `https_proxy` applies when `HTTPS_PROXY` is empty (Go's
/// `getEnvAny`).
#[tokio::test]
async fn lower_case_https_proxy_applies_when_the_upper_case_one_is_empty() {
    let proxy = ConnectProxy::start(&[NAME], Answer::Tunnel).await;
    let env = Env::without_attacher(&[]).await;
    let target = format!("{NAME}:{}", api_port(&env));
    let kubeconfig = kubeconfig(&env, &format!("https://{target}"), None);
    let env = env.with_attacher_env(
        &kubeconfig,
        &[],
        &[("HTTPS_PROXY", ""), ("https_proxy", &proxy.url())],
    );
    env.attached().await;
    assert_tunnelled_to(&proxy, &target, &env);
}

/// NO_PROXY naming the API server's host bypasses the proxy. The server is
/// `https://0.0.0.0:<port>`: not a loopback address to Go (so proxied
/// without NO_PROXY, which the first replica shows), and the kernel delivers
/// a connection to it to 127.0.0.1 on this machine.
#[tokio::test]
async fn no_proxy_naming_the_api_server_bypasses_the_proxy() {
    let proxy = ConnectProxy::start(&[], Answer::Tunnel).await;
    let env = Env::without_attacher(&[]).await;
    let port = api_port(&env);
    let kubeconfig = kubeconfig(&env, &format!("https://0.0.0.0:{port}"), None);

    // Without NO_PROXY: the attacher asks the proxy (which tunnels to
    // loopback only, so it answers 502 and nothing attaches).
    let proxied = env.spawn_attacher_with_env(
        "proxied",
        &kubeconfig,
        &[],
        &[("HTTPS_PROXY", &proxy.url())],
    );
    let target = format!("0.0.0.0:{port}");
    eventually("the proxy asked for 0.0.0.0", WAIT, || {
        let asked = proxy.targets().contains(&target);
        async move { asked.then_some(()) }
    })
    .await;
    drop(proxied);
    let asked = proxy.targets().len();

    let env = env.with_attacher_env(
        &kubeconfig,
        &[],
        &[
            ("HTTPS_PROXY", &proxy.url()),
            ("NO_PROXY", "example.com, 0.0.0.0"),
        ],
    );
    env.attached().await;
    assert_eq!(proxy.tunnels(), 0);
    assert_eq!(
        proxy.targets().len(),
        asked,
        "NO_PROXY: the proxy was not asked again"
    );
}

/// A kubeconfig cluster's `proxy-url` is used for every request, whatever
/// NO_PROXY says and whatever HTTPS_PROXY names (client-go's
/// `http.ProxyURL`).
#[tokio::test]
async fn a_kubeconfig_proxy_url_is_used_whatever_the_environment_says() {
    let proxy = ConnectProxy::start(&[NAME], Answer::Tunnel).await;
    let env = Env::without_attacher(&[]).await;
    let target = format!("{NAME}:{}", api_port(&env));
    let kubeconfig = kubeconfig(&env, &format!("https://{target}"), Some(&proxy.url()));
    let env = env.with_attacher_env(
        &kubeconfig,
        &[],
        &[("NO_PROXY", NAME), ("HTTPS_PROXY", "http://127.0.0.1:1")],
    );
    env.attached().await;
    assert_tunnelled_to(&proxy, &target, &env);
}

/// An `https://` proxy: TLS to the proxy, verified as Go's transport
/// verifies it (the cluster's CA and `tls-server-name`: the proxy serves a
/// certificate of that CA for `localhost`), CONNECT inside it, and the API
/// server's TLS inside the tunnel.
#[tokio::test]
async fn an_https_proxy_gets_tls_with_the_clusters_settings_and_the_tunnel_inside() {
    let env = Env::without_attacher(&[]).await;
    let proxy = ConnectProxy::start_tls(
        &[NAME],
        Answer::Tunnel,
        &env.cp.dir.join("apiserver.crt"),
        &env.cp.dir.join("apiserver.key"),
    )
    .await;
    let target = format!("{NAME}:{}", api_port(&env));
    let kubeconfig = kubeconfig(&env, &format!("https://{target}"), None);
    let env = env.with_attacher_env(&kubeconfig, &[], &[("HTTPS_PROXY", &proxy.tls_url())]);
    env.attached().await;
    assert_tunnelled_to(&proxy, &target, &env);
}

/// A proxy that refuses CONNECT: the log says which proxy refused which
/// target with which status, and the attacher keeps retrying (no panic).
#[tokio::test]
async fn a_proxy_that_refuses_connect_is_named_in_the_log_with_its_status() {
    let proxy = ConnectProxy::start(&[NAME], Answer::Refuse(403, "Forbidden")).await;
    let env = Env::without_attacher(&[]).await;
    let target = format!("{NAME}:{}", api_port(&env));
    let kubeconfig = kubeconfig(&env, &format!("https://{target}"), None);
    let mut env = env.with_attacher_env(&kubeconfig, &[], &[("HTTPS_PROXY", &proxy.url())]);
    let expected = format!(
        "the proxy {} refused CONNECT to {target}: 403 Forbidden",
        proxy.url()
    );
    eventually("the refusal in the log", WAIT, || {
        let seen = env.logs().contains(&expected);
        async move { seen.then_some(()) }
    })
    .await;
    let logs = env.logs();
    assert!(!logs.contains("panicked"), "{logs}");
    let attacher = env.attacher.as_mut().expect("attacher");
    assert!(
        attacher.try_wait().expect("try_wait").is_none(),
        "the attacher keeps running (and retrying):\n{}",
        tail(&logs, 20)
    );
    assert_eq!(proxy.tunnels(), 0);
}

/// `HTTPS_PROXY=socks5://…`: every API request goes through a SOCKS5 tunnel,
/// the API server's name resolved by the proxy (Go sends it as a name).
/// Before, the attacher exited 1 at start-up.
#[tokio::test]
async fn a_socks5_proxy_carries_the_api_requests_with_the_name_resolved_by_the_proxy() {
    let proxy = ConnectProxy::start(&[NAME], Answer::Tunnel).await;
    let env = Env::without_attacher(&[]).await;
    let target = format!("{NAME}:{}", api_port(&env));
    let kubeconfig = kubeconfig(&env, &format!("https://{target}"), None);
    let env = env.with_attacher_env(
        &kubeconfig,
        &[],
        &[
            ("HTTPS_PROXY", &proxy.socks_url()),
            ("NO_PROXY", "127.0.0.1,localhost,other.test"),
        ],
    );
    env.attached().await;
    assert_tunnelled_to(&proxy, &target, &env);
}

/// A SOCKS5 `proxy-url` with userinfo logs in with username/password
/// (RFC 1929, percent-decoded as Go decodes it), for every request whatever
/// the environment says.
#[tokio::test]
async fn a_socks5_proxy_url_with_credentials_logs_in_with_them() {
    let proxy = ConnectProxy::start(&[NAME], Answer::Tunnel).await;
    proxy.require_login("csi", "p@ss:word");
    let env = Env::without_attacher(&[]).await;
    let target = format!("{NAME}:{}", api_port(&env));
    let url = format!("socks5://csi:p%40ss%3Aword@{}", proxy.addr);
    let kubeconfig = kubeconfig(&env, &format!("https://{target}"), Some(&url));
    let env = env.with_attacher_env(
        &kubeconfig,
        &[],
        &[("NO_PROXY", NAME), ("HTTPS_PROXY", "http://127.0.0.1:1")],
    );
    env.attached().await;
    assert_tunnelled_to(&proxy, &target, &env);
    assert!(
        !env.logs().contains("p@ss"),
        "the password stays out of the log"
    );
}

/// A SOCKS5 proxy that refuses the CONNECT, or the login: the log names the
/// proxy, the target and the reply as Go names it, and the attacher keeps
/// retrying (no panic).
#[tokio::test]
async fn a_socks5_proxy_that_refuses_is_named_in_the_log_with_its_reply() {
    let refusing = ConnectProxy::start(&[NAME], Answer::Refuse(403, "Forbidden")).await;
    let login = ConnectProxy::start(&[NAME], Answer::Tunnel).await;
    login.require_login("csi", "right");
    let env = Env::without_attacher(&[]).await;
    let target = format!("{NAME}:{}", api_port(&env));
    let kubeconfig = kubeconfig(&env, &format!("https://{target}"), None);
    let wrong_login = env.spawn_attacher_with_env(
        &unique("wrong-login"),
        &kubeconfig,
        &[],
        &[("HTTPS_PROXY", &format!("socks5://csi:wrong@{}", login.addr))],
    );
    let mut env =
        env.with_attacher_env(&kubeconfig, &[], &[("HTTPS_PROXY", &refusing.socks_url())]);
    for (logs, expected) in [
        (
            &wrong_login.log,
            format!(
                "the proxy {} did not open a tunnel to {target}: username/password authentication failed",
                login.socks_url()
            ),
        ),
        (
            &env.log,
            format!(
                "the proxy {} refused CONNECT to {target}: connection not allowed by ruleset",
                refusing.socks_url()
            ),
        ),
    ] {
        eventually(&expected, WAIT, || {
            let seen = std::fs::read_to_string(logs)
                .unwrap_or_default()
                .contains(&expected);
            async move { seen.then_some(()) }
        })
        .await;
    }
    let logs = env.logs() + &wrong_login.logs();
    assert!(!logs.contains("panicked"), "{logs}");
    let attacher = env.attacher.as_mut().expect("attacher");
    assert!(
        attacher.try_wait().expect("try_wait").is_none(),
        "the attacher keeps running (and retrying):\n{}",
        tail(&logs, 20)
    );
    assert_eq!(refusing.tunnels() + login.tunnels(), 0);
}

/// A `proxy-url` scheme client-go refuses ends start-up with exit code 1 and
/// client-go's text: `socks5h` too (Go's transport takes it, client-go's
/// kubeconfig check does not).
#[tokio::test]
async fn unsupported_proxy_schemes_end_start_up_with_client_gos_error() {
    let env = Env::without_attacher(&[]).await;
    let server = format!("https://{NAME}:{}", api_port(&env));
    for scheme in ["socks4", "socks5h"] {
        let url = format!("{scheme}://127.0.0.1:1080");
        let expected = format!(
            "invalid 'proxy-url' \"{url}\" for cluster \"test\": unsupported scheme \"{scheme}\", must be http, https, or socks5"
        );
        let kubeconfig = kubeconfig(&env, &server, Some(&url));
        let mut replica =
            env.spawn_attacher_with_env(&unique("refused"), &kubeconfig, &[], &[("NO_PROXY", "")]);
        let status = eventually("the attacher to exit", Duration::from_secs(20), || {
            let status = replica.process.try_wait().expect("try_wait");
            async move { status }
        })
        .await;
        let logs = replica.logs();
        assert_eq!(status.code(), Some(1), "{url}: {logs}");
        // klog quotes the error as a value: its quotes are escaped.
        let expected = expected.replace('"', "\\\"");
        assert!(logs.contains(&expected), "{url}: {logs}");
        assert!(!logs.contains("panicked"), "{logs}");
    }
}

/// A connection to the API server that goes silent (the proxy keeps the
/// attacher's side open and forwards nothing either way: the kernel still
/// acknowledges, so TCP keepalive sees nothing) is left within 45 s, as
/// client-go leaves it (its HTTP/2 health ping: 30 s without a frame, 15 s
/// for the answer), and the watches and writes move to new tunnels: a VA
/// created a second after every tunnel froze is attached within 60 s.
/// Before, the watches waited for their own silence bound (90 s): 89 s;
/// with the ping, 44 s (upstream's, in the issue: 44 s).
#[tokio::test]
async fn a_silent_tunnel_is_left_and_a_va_created_after_it_froze_attaches_within_60_s() {
    const BOUND: Duration = Duration::from_secs(60);
    let proxy = ConnectProxy::start(&[NAME], Answer::Tunnel).await;
    let env = Env::without_attacher(&[]).await;
    let target = format!("{NAME}:{}", api_port(&env));
    let kubeconfig = kubeconfig(&env, &format!("https://{target}"), None);
    let env = env.with_attacher_env(&kubeconfig, &[], &[("HTTPS_PROXY", &proxy.url())]);
    env.attached().await;

    let frozen = proxy.freeze_open();
    let opened = proxy.tunnels();
    assert!(frozen > 0, "no tunnel open to freeze");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = std::time::Instant::now();
    let attachment = env
        .create_attachment(support::objects::pv(&unique("pv"), &env.driver))
        .await;
    // Waited for well past the bound, so that a failure says how long it took.
    let attached = tokio::time::timeout(
        Duration::from_secs(240),
        kube::runtime::wait::await_condition(
            env.vas.clone(),
            &attachment.va,
            |va: Option<&VolumeAttachment>| {
                va.and_then(|v| v.status.as_ref())
                    .is_some_and(|s| s.attached)
            },
        ),
    )
    .await;
    let took = started.elapsed();
    let logs = env.logs();
    for line in logs.lines().filter(|l| l.contains("watch failed")) {
        eprintln!("{line}");
    }
    eprintln!(
        "froze {frozen} tunnels; the VA created 1 s later was attached after {took:.1?} ({} new tunnels)",
        proxy.tunnels() - opened
    );
    assert!(
        matches!(attached, Ok(Ok(Some(_)))),
        "not attached within {took:?}: {attached:?}\n{}",
        tail(&logs, 40)
    );
    assert!(
        took <= BOUND,
        "attached after {took:?}, more than {BOUND:?}\n{}",
        tail(&logs, 40)
    );
    assert!(proxy.tunnels() > opened, "no new tunnel opened");
    assert_tunnelled_to(&proxy, &target, &env);
}
