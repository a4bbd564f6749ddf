use super::super::Scheme;
use super::*;

fn env(pairs: &[(&str, &str)]) -> Environment {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Environment::from_lookup(move |name| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    })
}

fn uri(s: &str) -> Uri {
    s.parse().expect("uri")
}

/// The proxy `route` picks for `server` from the environment, as a string.
fn env_route(pairs: &[(&str, &str)], server: &str) -> String {
    match route(&uri(server), None, &env(pairs)) {
        Ok(Route::Direct) => "direct".into(),
        Ok(Route::Proxy(proxy, origin)) => format!("{proxy} ({origin})"),
        Err(err) => format!("error: {err}"),
    }
}

#[test]
fn the_environment_is_read_as_go_reads_it() {
    // Upper case wins over lower case, unless empty.
    let e = env(&[
        ("HTTPS_PROXY", "upper:1"),
        ("https_proxy", "lower:1"),
        ("HTTP_PROXY", ""),
        ("http_proxy", "lower:2"),
        ("no_proxy", "x"),
    ]);
    assert_eq!(e.https_proxy, "upper:1");
    assert_eq!(e.http_proxy, "lower:2");
    assert_eq!(e.no_proxy, "x");
    assert!(!e.cgi);
    assert!(env(&[("REQUEST_METHOD", "GET")]).cgi);
    assert!(!env(&[("REQUEST_METHOD", "")]).cgi);
}

#[test]
fn the_proxy_for_the_api_server_follows_its_scheme_and_no_proxy() {
    let https = "https://apiserver.corp:6443";
    // httpproxy's proxyForURL table, for the API server's URL.
    assert_eq!(
        env_route(&[("HTTPS_PROXY", "127.0.0.1:8080")], https),
        "http://127.0.0.1:8080 (HTTPS_PROXY)"
    );
    assert_eq!(
        env_route(&[("https_proxy", "cache.corp.example.com")], https),
        "http://cache.corp.example.com:80 (HTTPS_PROXY)"
    );
    assert_eq!(
        env_route(&[("HTTPS_PROXY", "localhost")], https),
        "http://localhost:80 (HTTPS_PROXY)"
    );
    assert_eq!(
        env_route(&[("HTTPS_PROXY", "HTTPS://secure.proxy.tld")], https),
        "https://secure.proxy.tld:443 (HTTPS_PROXY)"
    );
    // HTTP_PROXY is not for https servers, HTTPS_PROXY not for http ones.
    assert_eq!(
        env_route(&[("HTTP_PROXY", "http.proxy.tld")], https),
        "direct"
    );
    assert_eq!(
        env_route(
            &[
                ("HTTP_PROXY", "http.proxy.tld"),
                ("HTTPS_PROXY", "secure.proxy.tld")
            ],
            "http://apiserver.corp"
        ),
        "http://http.proxy.tld:80 (HTTP_PROXY)"
    );
    // CGI: HTTP_PROXY refused, HTTPS_PROXY still used.
    assert_eq!(
        env_route(
            &[
                ("HTTP_PROXY", "http://10.1.2.3:8080"),
                ("REQUEST_METHOD", "GET")
            ],
            "http://apiserver.corp"
        ),
        "error: refusing to use HTTP_PROXY value in CGI environment; see golang.org/s/cgihttpproxy"
    );
    assert_eq!(
        env_route(
            &[
                ("HTTPS_PROXY", "https://secure.proxy.tld"),
                ("REQUEST_METHOD", "GET")
            ],
            https
        ),
        "https://secure.proxy.tld:443 (HTTPS_PROXY)"
    );
    // NO_PROXY against the API server's host and port (443 when not given).
    let proxy = ("HTTPS_PROXY", "proxy:3128");
    assert_eq!(env_route(&[proxy, ("NO_PROXY", "corp")], https), "direct");
    assert_eq!(
        env_route(&[proxy, ("NO_PROXY", ".corp:6443")], https),
        "direct"
    );
    assert_eq!(
        env_route(&[proxy, ("NO_PROXY", "apiserver.corp:443")], https),
        "http://proxy:3128 (HTTPS_PROXY)"
    );
    assert_eq!(
        env_route(
            &[proxy, ("NO_PROXY", "apiserver.corp:443")],
            "https://apiserver.corp"
        ),
        "direct"
    );
    assert_eq!(
        env_route(
            &[proxy, ("NO_PROXY", "10.96.0.0/12")],
            "https://10.96.0.1:443"
        ),
        "direct"
    );
    assert_eq!(
        env_route(
            &[proxy, ("NO_PROXY", "10.96.0.0/16")],
            "https://[2001:db8::1]:443"
        ),
        "http://proxy:3128 (HTTPS_PROXY)"
    );
    // Loopback and localhost API servers are never proxied from the environment.
    for server in [
        "https://127.0.0.1:6443",
        "https://localhost:6443",
        "https://[::1]:6443",
    ] {
        assert_eq!(env_route(&[proxy], server), "direct", "{server}");
    }
    // Unparseable values are ignored, as Go ignores them.
    assert_eq!(env_route(&[("HTTPS_PROXY", "http://a b")], https), "direct");
}

#[test]
fn a_kubeconfig_proxy_url_applies_to_every_host_whatever_the_environment_says() {
    let fixed = uri("http://user:p%40ss@127.0.0.1:3128");
    let e = env(&[("NO_PROXY", "*"), ("HTTPS_PROXY", "http://other:1")]);
    for server in ["https://127.0.0.1:6443", "https://apiserver.corp"] {
        match route(&uri(server), Some(&fixed), &e) {
            Ok(Route::Proxy(proxy, Origin::Kubeconfig)) => {
                assert_eq!(proxy.to_string(), "http://127.0.0.1:3128");
                let auth = proxy.authorization().expect("credentials");
                // base64("user:p@ss")
                assert_eq!(auth.to_str().ok(), Some("Basic dXNlcjpwQHNz"));
            }
            other => panic!("{server}: {other:?}"),
        }
    }
}

#[test]
fn socks5_is_routed_from_the_kubeconfig_and_socks5h_from_the_environment_too() {
    let kubeconfig = route(
        &uri("https://apiserver.corp"),
        Some(&uri("socks5://u:p%40ss@127.0.0.1:1080")),
        &Environment::default(),
    );
    let Ok(Route::Proxy(proxy, Origin::Kubeconfig)) = kubeconfig else {
        panic!("{kubeconfig:?}");
    };
    assert_eq!(proxy.scheme, Scheme::Socks5);
    assert_eq!(proxy.credentials, Some(("u".into(), "p@ss".into())));
    // Go's transport takes socks5h as socks5; url.Parse lower-cases schemes.
    for (value, expected) in [
        ("socks5://proxy", "socks5://proxy:1080 (HTTPS_PROXY)"),
        ("SOCKS5://proxy:1081", "socks5://proxy:1081 (HTTPS_PROXY)"),
        ("socks5h://proxy", "socks5h://proxy:1080 (HTTPS_PROXY)"),
    ] {
        assert_eq!(
            env_route(&[("HTTPS_PROXY", value)], "https://apiserver.corp"),
            expected
        );
    }
    // NO_PROXY exempts from a SOCKS5 proxy as from any other.
    assert_eq!(
        env_route(
            &[("HTTPS_PROXY", "socks5://proxy"), ("NO_PROXY", "corp")],
            "https://apiserver.corp"
        ),
        "direct"
    );
}

#[test]
fn kubeconfig_proxy_url_schemes_are_checked_as_client_go_checks_them() {
    // client-go's parseProxyURL: http, https, socks5, else its text.
    for ok in ["http://p:1", "HTTPS://p", "socks5://p:1080"] {
        assert!(check_kubeconfig_proxy_url(ok, "c").is_ok(), "{ok}");
    }
    let refused = |url: &str| {
        check_kubeconfig_proxy_url(url, "test")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    assert_eq!(
        refused("socks4://p:1080"),
        "invalid configuration: invalid 'proxy-url' \"socks4://p:1080\" for cluster \"test\": \
         unsupported scheme \"socks4\", must be http, https, or socks5"
    );
    assert_eq!(
        refused("p:3128"),
        "invalid configuration: invalid 'proxy-url' \"p:3128\" for cluster \"test\": \
         unsupported scheme \"p\", must be http, https, or socks5"
    );
    assert!(refused("127.0.0.1:3128").contains("unsupported scheme \"\""));
    // Go's transport takes socks5h; client-go's kubeconfig check does not.
    assert!(refused("socks5h://p").contains("unsupported scheme \"socks5h\""));
}

#[test]
fn proxy_urls_parse_with_default_ports_and_hide_credentials() {
    let p = ProxyUrl::from_env_value("https://u:secret@[2001:db8::1]").expect("parses");
    assert_eq!(p.scheme, Scheme::Https);
    assert_eq!(p.host, "2001:db8::1");
    assert_eq!(p.port, 443);
    assert_eq!(p.to_string(), "https://[2001:db8::1]:443");
    assert!(!format!("{p:?}").contains("secret"));
    assert_eq!(
        ProxyUrl::from_env_value("u@proxy:3128")
            .and_then(|p| p.authorization())
            .and_then(|a| a.to_str().ok().map(str::to_owned)),
        Some("Basic dTo=".to_string()) // base64("u:")
    );
    assert_eq!(redact("http://u:secret@p:1"), "http://p:1");
}
