//! A CONNECT proxy on 127.0.0.1 for the proxy tests: it counts the tunnels
//! it opened and records the targets it was asked for.
//!
//! It is a SOCKS5 proxy (RFC 1928 CONNECT) on the same port too: a
//! connection whose first byte is 5 gets SOCKS5 ([`ConnectProxy::socks_url`]),
//! with no authentication, or only username/password (RFC 1929) once
//! [`ConnectProxy::require_login`] is called. Its targets are recorded as
//! `host:port` as the client named them: a made-up name appears only when
//! the client left resolving it to the proxy.
//!
//! It resolves targets itself, from a table of made-up names (e.g.
//! `apiserver.test` → 127.0.0.1), so a client given such a name can reach
//! the API server only through it. It opens tunnels to loopback addresses
//! only; anything else is answered 502. [`Answer::Refuse`] makes it answer
//! every CONNECT with that status instead (SOCKS5: with the reply
//! "connection not allowed by ruleset"). [`ConnectProxy::start_tls`]
//! makes it an `https://` proxy. [`ConnectProxy::freeze_open`] makes every
//! tunnel open at that moment go silent for good (nothing forwarded either
//! way, both sockets kept open, so the client's kernel still sees its data
//! acknowledged and TCP keepalive answered), while new tunnels work.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How the proxy answers CONNECT.
#[derive(Clone, Copy, Debug)]
pub enum Answer {
    /// Open the tunnel (loopback targets only).
    Tunnel,
    /// Answer with this status line's code and reason, and close.
    Refuse(u16, &'static str),
}

/// A running proxy; stops when dropped.
pub struct ConnectProxy {
    /// Where it listens.
    pub addr: SocketAddr,
    tunnels: Arc<AtomicUsize>,
    targets: Arc<Mutex<Vec<String>>>,
    login: Arc<OnceLock<(String, String)>>,
    /// Bumped by [`ConnectProxy::freeze_open`]; each tunnel subscribes when
    /// it opens, so only a later bump freezes it.
    freeze: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ConnectProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ConnectProxy {
    /// Starts a proxy that resolves each of `names` to 127.0.0.1.
    pub async fn start(names: &[&str], answer: Answer) -> Self {
        Self::start_with(names, answer, None).await
    }

    /// [`ConnectProxy::start`], speaking TLS with the PEM certificate chain
    /// and key in `cert` and `key` (an `https://` proxy).
    pub async fn start_tls(
        names: &[&str],
        answer: Answer,
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> Self {
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .expect("certificate file")
            .collect::<Result<_, _>>()
            .expect("certificates");
        let key = PrivateKeyDer::from_pem_file(key).expect("private key");
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server certificate");
        Self::start_with(
            names,
            answer,
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))),
        )
        .await
    }

    /// `https://127.0.0.1:<port>` for a proxy from [`ConnectProxy::start_tls`].
    pub fn tls_url(&self) -> String {
        format!("https://{}", self.addr)
    }

    async fn start_with(
        names: &[&str],
        answer: Answer,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let names: Arc<HashMap<String, IpAddr>> = Arc::new(
            names
                .iter()
                .map(|n| (n.to_string(), IpAddr::V4(Ipv4Addr::LOCALHOST)))
                .collect(),
        );
        let tunnels = Arc::new(AtomicUsize::new(0));
        let targets = Arc::new(Mutex::new(Vec::new()));
        let login = Arc::new(OnceLock::new());
        let (freeze, _) = watch::channel(0);
        let task = tokio::spawn({
            let shared = Shared {
                names,
                tunnels: Arc::clone(&tunnels),
                targets: Arc::clone(&targets),
                login: Arc::clone(&login),
                freeze: freeze.clone(),
            };
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let shared = shared.clone();
                    let tls = tls.clone();
                    tokio::spawn(async move {
                        match tls {
                            None => serve(client, answer, &shared).await,
                            Some(tls) => {
                                if let Ok(client) = tls.accept(client).await {
                                    serve(client, answer, &shared).await;
                                }
                            }
                        }
                    });
                }
            }
        });
        Self {
            addr,
            tunnels,
            targets,
            login,
            freeze,
            task,
        }
    }

    /// `socks5://127.0.0.1:<port>`.
    pub fn socks_url(&self) -> String {
        format!("socks5://{}", self.addr)
    }

    /// From now on a SOCKS5 client must log in with `user` and `password`
    /// (username/password is the only method offered).
    pub fn require_login(&self, user: &str, password: &str) {
        self.login
            .set((user.to_string(), password.to_string()))
            .expect("one login");
    }

    /// Freezes every tunnel open now: from here on it forwards nothing in
    /// either direction, and keeps both its sockets open (the client's
    /// kernel still acknowledges what it sends; nothing ever answers).
    /// Tunnels opened later work. Returns how many tunnels it froze.
    pub fn freeze_open(&self) -> usize {
        let open = self.freeze.receiver_count();
        self.freeze.send_modify(|generation| *generation += 1);
        open
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many tunnels it has opened.
    pub fn tunnels(&self) -> usize {
        self.tunnels.load(Ordering::SeqCst)
    }

    /// Every CONNECT target asked for, in order.
    pub fn targets(&self) -> Vec<String> {
        self.targets.lock().map(|t| t.clone()).unwrap_or_default()
    }
}

/// What every connection's task shares with the proxy.
#[derive(Clone)]
struct Shared {
    names: Arc<HashMap<String, IpAddr>>,
    tunnels: Arc<AtomicUsize>,
    targets: Arc<Mutex<Vec<String>>>,
    login: Arc<OnceLock<(String, String)>>,
    freeze: watch::Sender<u64>,
}

/// The answers of the two protocols, by what happened.
enum Reply {
    Refused(u16, &'static str),
    Unreachable,
    Established,
}

fn reply(socks: bool, reply: Reply) -> Vec<u8> {
    // SOCKS5: the reply code, then a zero IPv4 address and port.
    let socks_reply = |code: u8| vec![5, code, 0, 1, 0, 0, 0, 0, 0, 0];
    match (socks, reply) {
        (true, Reply::Refused(..)) => socks_reply(2),
        (true, Reply::Unreachable) => socks_reply(4),
        (true, Reply::Established) => socks_reply(0),
        (false, Reply::Refused(code, reason)) => {
            format!("HTTP/1.1 {code} {reason}\r\nContent-Length: 0\r\n\r\n").into_bytes()
        }
        (false, Reply::Unreachable) => {
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n".to_vec()
        }
        (false, Reply::Established) => b"HTTP/1.1 200 Connection established\r\n\r\n".to_vec(),
    }
}

/// A SOCKS5 greeting (its first byte read), the login if required, and the
/// CONNECT request: its target as `host:port` (IPv6 in brackets).
async fn socks_target(
    client: &mut (impl AsyncRead + AsyncWrite + Unpin),
    login: Option<&(String, String)>,
) -> Option<String> {
    let mut methods = vec![0; usize::from(client.read_u8().await.ok()?)];
    client.read_exact(&mut methods).await.ok()?;
    let method = if login.is_some() { 2 } else { 0 };
    if !methods.contains(&method) {
        let _ = client.write_all(&[5, 0xff]).await;
        return None;
    }
    client.write_all(&[5, method]).await.ok()?;
    if let Some((user, password)) = login {
        let mut version_and_len = [0; 2];
        client.read_exact(&mut version_and_len).await.ok()?;
        let mut given_user = vec![0; usize::from(version_and_len[1])];
        client.read_exact(&mut given_user).await.ok()?;
        let mut given_password = vec![0; usize::from(client.read_u8().await.ok()?)];
        client.read_exact(&mut given_password).await.ok()?;
        let ok = given_user == user.as_bytes() && given_password == password.as_bytes();
        client.write_all(&[1, u8::from(!ok)]).await.ok()?;
        if !ok {
            return None;
        }
    }
    let mut head = [0; 4];
    client.read_exact(&mut head).await.ok()?;
    let host = match head {
        [5, 1, 0, 1] => {
            let mut ip = [0; 4];
            client.read_exact(&mut ip).await.ok()?;
            Ipv4Addr::from(ip).to_string()
        }
        [5, 1, 0, 4] => {
            let mut ip = [0; 16];
            client.read_exact(&mut ip).await.ok()?;
            format!("[{}]", std::net::Ipv6Addr::from(ip))
        }
        [5, 1, 0, 3] => {
            let mut name = vec![0; usize::from(client.read_u8().await.ok()?)];
            client.read_exact(&mut name).await.ok()?;
            String::from_utf8(name).ok()?
        }
        _ => return None,
    };
    let port = client.read_u16().await.ok()?;
    Some(format!("{host}:{port}"))
}

async fn serve(mut client: impl AsyncRead + AsyncWrite + Unpin, answer: Answer, shared: &Shared) {
    let Shared {
        names,
        tunnels,
        targets,
        login,
        freeze,
    } = shared;
    let Ok(first) = client.read_u8().await else {
        return;
    };
    let socks = first == 5;
    let target = if socks {
        match socks_target(&mut client, login.get()).await {
            Some(target) => target,
            None => return,
        }
    } else {
        let mut head = vec![first];
        while !head.ends_with(b"\r\n\r\n") {
            if head.len() > 16 * 1024 {
                return;
            }
            match client.read_u8().await {
                Ok(byte) => head.push(byte),
                Err(_) => return,
            }
        }
        let head = String::from_utf8_lossy(&head);
        let mut words = head.split_whitespace();
        let (Some("CONNECT"), Some(target)) = (words.next(), words.next()) else {
            let _ = client
                .write_all(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                .await;
            return;
        };
        target.to_string()
    };
    if let Ok(mut all) = targets.lock() {
        all.push(target.clone());
    }
    if let Answer::Refuse(code, reason) = answer {
        let _ = client
            .write_all(&reply(socks, Reply::Refused(code, reason)))
            .await;
        return;
    }
    let upstream = target.rsplit_once(':').and_then(|(host, port)| {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let ip = names
            .get(host)
            .copied()
            .or_else(|| host.parse::<IpAddr>().ok())?;
        Some(SocketAddr::new(ip, port.parse().ok()?))
    });
    // Loopback only: nothing in the tests may leave this machine.
    let Some(upstream) = upstream.filter(|a| a.ip().is_loopback()) else {
        let _ = client.write_all(&reply(socks, Reply::Unreachable)).await;
        return;
    };
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        let _ = client.write_all(&reply(socks, Reply::Unreachable)).await;
        return;
    };
    if client
        .write_all(&reply(socks, Reply::Established))
        .await
        .is_err()
    {
        return;
    }
    // Subscribed now: only a later freeze concerns this tunnel.
    let mut frozen = freeze.subscribe();
    tunnels.fetch_add(1, Ordering::SeqCst);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        Ok(()) = frozen.changed() => {
            // Silent for good: both sockets stay open, nothing is read or
            // written, until the test's runtime ends.
            std::future::pending::<()>().await;
        }
    }
}
