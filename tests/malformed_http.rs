//! Bad HTTP requests to `/metrics` and `/healthz` (docs/malformed-inputs.md,
//! "HTTP"): raw bytes over TCP to a running attacher; each row checks the
//! answer's status line (or that the connection is closed without one), and
//! afterwards the endpoint still serves and nothing panicked.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::controlplane::free_port;
use support::env::Env;
use support::http_get;

/// Sends `bytes` on a fresh connection; the status codes of every answer
/// read within 3 s (empty: closed without an answer).
async fn statuses(addr: SocketAddr, bytes: &[u8]) -> Vec<u16> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    // The server may close before reading everything (e.g. oversized headers).
    let _ = stream.write_all(bytes).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer);
    text.match_indices("HTTP/1.")
        .filter_map(|(at, _)| text[at..].split(' ').nth(1)?.parse().ok())
        .collect()
}

/// (row, raw request bytes, the status codes answered, in order)
fn rows() -> Vec<(&'static str, Vec<u8>, Vec<u16>)> {
    let get = |path: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").into_bytes()
    };
    let with_headers = |extra: String| {
        format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n").into_bytes()
    };
    vec![
        ("get_metrics", get("/metrics"), vec![200]),
        ("get_healthz", get("/healthz"), vec![200]),
        ("unknown_path", get("/nope"), vec![404]),
        ("path_traversal", get("/../metrics"), vec![404]),
        ("metrics_with_query", get("/metrics?format=evil&x=%00"), vec![200]),
        ("absolute_form_uri", get("http://evil.example/healthz"), vec![200]),
        ("post_to_metrics", b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc".to_vec(), vec![405]),
        ("delete_healthz", b"DELETE /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(), vec![405]),
        ("unknown_method", b"BREW /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(), vec![405]),
        ("connect_method", b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n".to_vec(), vec![405]),
        ("head_healthz", b"HEAD /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(), vec![200]),
        ("garbage_request_line", b"HELLO THERE\r\n\r\n".to_vec(), vec![400]),
        ("binary_garbage", vec![0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03], vec![400]),
        ("http_0_9_request", b"GET /metrics\r\n\r\n".to_vec(), vec![400]),
        ("unknown_http_version", b"GET /healthz HTTP/7.3\r\nHost: x\r\n\r\n".to_vec(), vec![400]),
        ("non_utf8_path", b"GET /\xff\xfe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(), vec![400]),
        ("uri_of_100KiB", get(&format!("/{}", "a".repeat(100 << 10))), vec![414]),
        // Under hyper's 400 KiB read buffer: read and answered.
        ("header_of_100KiB", with_headers(format!("X-Big: {}\r\n", "b".repeat(100 << 10))), vec![200]),
        ("header_of_1MiB", with_headers(format!("X-Big: {}\r\n", "b".repeat(1 << 20))), vec![431]),
        ("two_hundred_headers", with_headers((0..200).map(|i| format!("X-H{i}: v\r\n")).collect()), vec![431]),
        ("header_without_colon", with_headers("NoColonHere\r\n".into()), vec![400]),
        ("http2_preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(), vec![]),
        ("invalid_content_length", b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n".to_vec(), vec![400]),
        ("request_after_connection_close", [get("/nope"), get("/healthz")].concat(), vec![404]),
        (
            "ten_pipelined_keep_alive_requests",
            (0..10)
                .flat_map(|i| {
                    let close = if i == 9 { "Connection: close\r\n" } else { "" };
                    format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{close}\r\n").into_bytes()
                })
                .collect(),
            vec![200; 10],
        ),
    ]
}

#[tokio::test]
async fn bad_requests_get_an_http_error_and_the_endpoint_keeps_serving() {
    let port = free_port().expect("port");
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let http = format!("--http-endpoint=127.0.0.1:{port}");
    let env = Env::start(&[], &[&http]).await;
    support::eventually("the endpoint", Duration::from_secs(20), || async {
        http_get(addr, "/healthz").await.filter(|(s, _)| *s == 200)
    })
    .await;

    // Idle connections held open meanwhile (a slow client) block nobody.
    let mut idle = Vec::new();
    for _ in 0..50 {
        idle.push(TcpStream::connect(addr).await.expect("idle connection"));
    }
    let mut wrong = Vec::new();
    for (name, bytes, want) in rows() {
        let got = statuses(addr, &bytes).await;
        if got != want {
            wrong.push(format!("{name}: answered {got:?}, want {want:?}"));
        }
        let health = http_get(addr, "/healthz").await;
        assert_eq!(
            health.map(|(s, _)| s),
            Some(200),
            "{name}: /healthz afterwards"
        );
    }
    assert!(
        wrong.is_empty(),
        "rows with other answers:\n{}",
        wrong.join("\n")
    );
    drop(idle);

    let (status, metrics) = http_get(addr, "/metrics").await.expect("metrics");
    assert_eq!(status, 200);
    assert!(metrics.contains("process_start_time_seconds"));
    let mut env = env;
    let process = env.attacher.as_mut().expect("attacher");
    assert_eq!(process.try_wait().expect("try_wait"), None, "still running");
    assert!(!env.logs().contains("panicked"));
    // And it still attaches.
    env.attached().await;
}
