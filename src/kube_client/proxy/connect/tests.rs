use super::*;

use tokio::net::TcpListener;

/// Runs [`socks5_connect`] for `target` through `proxy_url` against a scripted
/// SOCKS5 server on loopback: it reads what the client sends at each step and
/// answers the next of `steps` (`(bytes to read, answer)`); returns what it
/// read, the result, and the first byte after the exchange.
async fn exchange(
    proxy_url: &str,
    target: (&str, u16),
    steps: &[(usize, &'static [u8])],
) -> (Vec<Vec<u8>>, Result<(), String>, Option<u8>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let steps = steps.to_vec();
    let server = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.expect("accept");
        let mut seen = Vec::new();
        for (len, answer) in steps {
            let mut got = vec![0; len];
            if conn.read_exact(&mut got).await.is_err() {
                break;
            }
            seen.push(got);
            let _ = conn.write_all(answer).await;
        }
        // The tunnel's first byte.
        let _ = conn.write_all(&[42]).await;
        seen
    });
    let proxy = ProxyUrl::parse(proxy_url).expect("proxy URL");
    let mut io: Io = Either::Left(TcpStream::connect(addr).await.expect("connect"));
    // Bounded: a client that sends less than the script expects waits for
    // an answer that never comes.
    let result = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        socks5_connect(&mut io, &proxy, target),
    )
    .await
    .map_err(|_| "the exchange stalled".to_string())
    .and_then(|r| r.map_err(|e| e.to_string()));
    let next = match result {
        Ok(()) => io.read_u8().await.ok(),
        Err(_) => None,
    };
    drop(io);
    let seen = server.await.unwrap_or_default();
    (seen, result, next)
}

#[tokio::test]
async fn socks5_offers_no_auth_with_credentials_too_and_sends_ips_as_ips() {
    // Credentials in the URL: no auth and username/password offered, as Go
    // offers them; the proxy picks no auth. The target, an IPv4 address,
    // goes as one; the bound address (a name here) is read to its end.
    let (seen, result, next) = exchange(
        "socks5://u:p@127.0.0.1",
        ("10.0.0.1", 6443),
        &[
            (4, &[5, 0]),
            (10, &[5, 0, 0, 3, 4, b'h', b'o', b's', b't', 0, 80]),
        ],
    )
    .await;
    assert_eq!(result, Ok(()));
    assert_eq!(next, Some(42), "the tunnel starts right after the reply");
    assert_eq!(seen[0], [5, 2, 0, 2]);
    assert_eq!(seen[1], [5, 1, 0, 1, 10, 0, 0, 1, 0x19, 0x2b]);

    // No credentials: no auth only; IPv6 as IPv6.
    let (seen, result, _) = exchange(
        "socks5h://127.0.0.1",
        ("2001:db8::1", 443),
        &[(3, &[5, 0]), (22, &[5, 0, 0, 1, 0, 0, 0, 0, 0, 0])],
    )
    .await;
    assert_eq!(result, Ok(()));
    assert_eq!(seen[0], [5, 1, 0]);
    assert_eq!(&seen[1][..4], [5, 1, 0, 4]);
    assert_eq!(
        seen[1][4..20],
        "2001:db8::1"
            .parse::<std::net::Ipv6Addr>()
            .expect("ip")
            .octets()
    );

    // A proxy that accepts no method, or answers with an unknown reply code.
    let (_, result, _) =
        exchange("socks5://127.0.0.1", ("apiserver", 443), &[(3, &[5, 0xff])]).await;
    assert_eq!(
        result,
        Err(
            "the proxy socks5://127.0.0.1:1080 did not open a tunnel to apiserver:443: \
             no acceptable authentication methods"
                .into()
        )
    );
    let (seen, result, _) = exchange(
        "socks5://127.0.0.1",
        ("apiserver", 443),
        &[(3, &[5, 0]), (16, &[5, 9, 0, 1, 0, 0, 0, 0, 0, 0])],
    )
    .await;
    assert_eq!(seen[1][3..5], [3, 9], "the name, for the proxy to resolve");
    assert_eq!(
        result,
        Err(
            "the proxy socks5://127.0.0.1:1080 refused CONNECT to apiserver:443: unknown code: 9"
                .into()
        )
    );
}
