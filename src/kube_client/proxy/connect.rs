//! Connections to the API server, direct or through a proxy: TCP_NODELAY,
//! TLS to an `https` proxy, the CONNECT tunnel or the SOCKS5 one
//! ([`Connector`]; see the [`proxy`](super) module docs, "How").

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_util::either::Either;
use tower::{BoxError, Service};

use super::route::Route;
use super::url::{host_port, uri_host, ProxyUrl, Scheme};

/// Why a connection through `proxy` failed; `target` is the `host:port`
/// asked for.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("proxyconnect: cannot reach the proxy {proxy}: {source}")]
    Reach { proxy: ProxyUrl, source: BoxError },
    #[error("proxyconnect: TLS with the proxy {proxy} failed: {source}")]
    Tls { proxy: ProxyUrl, source: io::Error },
    /// The proxy answered CONNECT with another status than 200 (HTTP: its
    /// status line's code and reason), or with another reply than
    /// "succeeded" (SOCKS5: the reply as Go names it).
    #[error("the proxy {proxy} refused CONNECT to {target}: {status}")]
    Refused {
        proxy: ProxyUrl,
        target: String,
        status: String,
    },
    /// The CONNECT (or SOCKS5) exchange broke off or made no sense.
    #[error("the proxy {proxy} did not open a tunnel to {target}: {reason}")]
    Handshake {
        proxy: ProxyUrl,
        target: String,
        reason: String,
    },
    /// No tunnel within the connect timeout.
    #[error("the proxy {proxy} did not open a tunnel to {target} within {timeout:?}")]
    Timeout {
        proxy: ProxyUrl,
        target: String,
        timeout: Duration,
    },
}

/// The most a CONNECT answer's head may take.
const MAX_CONNECT_RESPONSE: usize = 16 * 1024;

/// Connections to the API server: direct, or through the proxy of a
/// [`Route`] (see the [`proxy`](super) module docs); TCP_NODELAY on every one.
#[derive(Clone)]
pub struct Connector {
    http: HttpConnector,
    via: Option<Arc<Via>>,
}

struct Via {
    proxy: ProxyUrl,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    timeout: Option<Duration>,
}

impl Connector {
    /// A connector for `route`. `tls` is the API server's TLS configuration
    /// (used towards an `https` proxy) and `tls_server_name` its override.
    pub fn new(
        http: HttpConnector,
        route: &Route,
        tls: impl FnOnce() -> Result<tokio_rustls::rustls::ClientConfig, kube::Error>,
        tls_server_name: Option<&str>,
        timeout: Option<Duration>,
    ) -> Result<Self, kube::Error> {
        let Route::Proxy(proxy, _) = route else {
            return Ok(Self { http, via: None });
        };
        let mut tls_to_proxy = None;
        if proxy.scheme == Scheme::Https {
            let mut config = tls()?;
            // HTTP/1.1 to the proxy: CONNECT, never h2.
            config.alpn_protocols.clear();
            let name = tls_server_name.unwrap_or(&proxy.host).to_string();
            let name = ServerName::try_from(name).map_err(|e| {
                kube::Error::Service(format!("proxy {proxy}: invalid TLS server name: {e}").into())
            })?;
            tls_to_proxy = Some((tokio_rustls::TlsConnector::from(Arc::new(config)), name));
        }
        let via = Via {
            proxy: proxy.clone(),
            tls: tls_to_proxy,
            timeout,
        };
        Ok(Self {
            http,
            via: Some(Arc::new(via)),
        })
    }
}

impl Service<Uri> for Connector {
    type Response = Stream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Stream, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(BoxError::from)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let mut http = self.http.clone();
        let Some(via) = self.via.clone() else {
            let connecting = self.http.call(dst);
            return Box::pin(async move {
                let tcp = connecting.await?;
                Ok(Stream {
                    io: TokioIo::new(Either::Left(tcp.into_inner())),
                    forwarded: false,
                })
            });
        };
        Box::pin(async move {
            let plain = dst.scheme_str() == Some("http");
            let port = dst.port_u16().unwrap_or(if plain { 80 } else { 443 });
            let target = host_port(uri_host(&dst), port);
            // Through SOCKS5 always a tunnel, as Go's transport.
            let forwarded = plain && matches!(via.proxy.scheme, Scheme::Http | Scheme::Https);
            let connecting = connect_via(&mut http, &via, (uri_host(&dst), port), !forwarded);
            let io = match via.timeout {
                Some(timeout) => {
                    tokio::time::timeout(timeout, connecting)
                        .await
                        .map_err(|_| ConnectError::Timeout {
                            proxy: via.proxy.clone(),
                            target,
                            timeout,
                        })??
                }
                None => connecting.await?,
            };
            Ok(Stream {
                io: TokioIo::new(io),
                forwarded,
            })
        })
    }
}

/// A connection to the proxy, TLS to it if `https`, and the tunnel to
/// `host:port`: SOCKS5's, else CONNECT if `tunnel`.
async fn connect_via(
    http: &mut HttpConnector,
    via: &Via,
    (host, port): (&str, u16),
    tunnel: bool,
) -> Result<Io, ConnectError> {
    let proxy = &via.proxy;
    let reach = |source: BoxError| ConnectError::Reach {
        proxy: proxy.clone(),
        source,
    };
    let proxy_uri = Uri::builder()
        .scheme("http")
        .authority(host_port(&proxy.host, proxy.port))
        .path_and_query("/")
        .build()
        .map_err(|e| reach(e.into()))?;
    std::future::poll_fn(|cx| http.poll_ready(cx))
        .await
        .map_err(|e| reach(e.into()))?;
    let tcp = http.call(proxy_uri).await.map_err(|e| reach(e.into()))?;
    let tcp = tcp.into_inner();
    let mut io = match &via.tls {
        None => Either::Left(tcp),
        Some((connector, name)) => Either::Right(Box::new(
            connector
                .connect(name.clone(), tcp)
                .await
                .map_err(|source| ConnectError::Tls {
                    proxy: proxy.clone(),
                    source,
                })?,
        )),
    };
    match proxy.scheme {
        Scheme::Socks5 | Scheme::Socks5h => socks5_connect(&mut io, proxy, (host, port)).await?,
        _ if tunnel => connect_tunnel(&mut io, proxy, &host_port(host, port)).await?,
        _ => {}
    }
    Ok(io)
}

/// RFC 1928 CONNECT to `host:port` as Go's `socksDialer` asks it: the host
/// as named (the proxy resolves it) unless an IP; no authentication
/// offered, and username/password too (RFC 1929) if the URL has userinfo.
async fn socks5_connect(
    io: &mut Io,
    proxy: &ProxyUrl,
    (host, port): (&str, u16),
) -> Result<(), ConnectError> {
    let target = host_port(host, port);
    let handshake = |reason: String| ConnectError::Handshake {
        proxy: proxy.clone(),
        target: target.clone(),
        reason,
    };
    let broke = |e: io::Error| handshake(format!("SOCKS5 exchange: {e}"));
    let credentials = proxy.credentials.as_ref();
    let methods: &[u8] = match credentials {
        Some(_) => &[5, 2, 0, 2],
        None => &[5, 1, 0],
    };
    io.write_all(methods).await.map_err(broke)?;
    let mut answer = [0u8; 2];
    io.read_exact(&mut answer).await.map_err(broke)?;
    match (answer, credentials) {
        ([5, 0], _) => {}
        ([5, 2], Some((user, password))) => {
            let (Ok(user_len @ 1..), Ok(password_len)) =
                (u8::try_from(user.len()), u8::try_from(password.len()))
            else {
                return Err(handshake("invalid username/password".into()));
            };
            let auth = [
                &[1, user_len],
                user.as_bytes(),
                &[password_len],
                password.as_bytes(),
            ];
            io.write_all(&auth.concat()).await.map_err(broke)?;
            io.read_exact(&mut answer).await.map_err(broke)?;
            if answer != [1, 0] {
                return Err(handshake("username/password authentication failed".into()));
            }
        }
        ([5, 0xff], _) => return Err(handshake("no acceptable authentication methods".into())),
        ([5, method], _) => {
            return Err(handshake(format!(
                "unsupported authentication method {method}"
            )))
        }
        ([version, _], _) => {
            return Err(handshake(format!("unexpected protocol version {version}")))
        }
    }
    let request = socks5_request(host, port).ok_or_else(|| handshake("FQDN too long".into()))?;
    io.write_all(&request).await.map_err(broke)?;
    let mut reply = [0u8; 4];
    io.read_exact(&mut reply).await.map_err(broke)?;
    let len = match reply {
        [5, 0, 0, 1] => 4,
        [5, 0, 0, 4] => 16,
        [5, 0, 0, 3] => io.read_u8().await.map_err(broke)?.into(),
        [5, 0, 0, atyp] => return Err(handshake(format!("unknown address type {atyp}"))),
        [5, 0, ..] => return Err(handshake("non-zero reserved field".into())),
        [5, code, ..] => {
            return Err(ConnectError::Refused {
                proxy: proxy.clone(),
                target: target.clone(),
                status: SOCKS5_REPLIES
                    .get(usize::from(code))
                    .map_or_else(|| format!("unknown code: {code}"), |r| r.to_string()),
            })
        }
        [version, ..] => return Err(handshake(format!("unexpected protocol version {version}"))),
    };
    // The address the proxy bound, which Go reads and ignores.
    io.read_exact(&mut vec![0u8; len + 2])
        .await
        .map_err(broke)?;
    Ok(())
}

/// The CONNECT request for `host:port`: an IP as an address, a name as a
/// name (`None` past 255 bytes).
fn socks5_request(host: &str, port: u16) -> Option<Vec<u8>> {
    let mut request = vec![5, 1, 0];
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => request.extend([1].iter().chain(&ip.octets())),
        Ok(IpAddr::V6(ip)) => request.extend([4].iter().chain(&ip.octets())),
        Err(_) => request.extend(
            [3, u8::try_from(host.len()).ok()?]
                .iter()
                .chain(host.as_bytes()),
        ),
    }
    request.extend(port.to_be_bytes());
    Some(request)
}

/// SOCKS5 reply codes as Go's `socksReply` names them.
const SOCKS5_REPLIES: [&str; 9] = [
    "succeeded",
    "general SOCKS server failure",
    "connection not allowed by ruleset",
    "network unreachable",
    "host unreachable",
    "connection refused",
    "TTL expired",
    "command not supported",
    "address type not supported",
];

/// Sends `CONNECT target` and reads the answer's head.
async fn connect_tunnel(io: &mut Io, proxy: &ProxyUrl, target: &str) -> Result<(), ConnectError> {
    let handshake = |reason: String| ConnectError::Handshake {
        proxy: proxy.clone(),
        target: target.to_string(),
        reason,
    };
    let mut request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(auth) = proxy.authorization() {
        request.push_str("Proxy-Authorization: ");
        request.push_str(auth.to_str().unwrap_or_default());
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    let sent = async {
        io.write_all(request.as_bytes()).await?;
        io.flush().await
    };
    sent.await
        .map_err(|e| handshake(format!("sending CONNECT: {e}")))?;
    // Byte by byte up to the blank line: nothing of the tunnel's own bytes
    // (the API server's TLS) may be read here. The head is small and comes once.
    let mut head = Vec::with_capacity(256);
    loop {
        let byte = io.read_u8().await.map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => {
                handshake("the proxy closed the connection before answering CONNECT".into())
            }
            _ => handshake(format!("reading the answer to CONNECT: {e}")),
        })?;
        head.push(byte);
        if head.ends_with(b"\r\n\r\n") {
            break;
        }
        if head.len() > MAX_CONNECT_RESPONSE {
            return Err(handshake(format!(
                "the answer to CONNECT is longer than {MAX_CONNECT_RESPONSE} bytes"
            )));
        }
    }
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    if !matches!(response.parse(&head), Ok(httparse::Status::Complete(_))) {
        let line = String::from_utf8_lossy(head.split(|b| *b == b'\n').next().unwrap_or_default());
        let line = line.trim_end();
        return Err(handshake(format!(
            "not an HTTP answer to CONNECT: {line:?}"
        )));
    }
    match response.code {
        Some(200) => Ok(()),
        code => Err(ConnectError::Refused {
            proxy: proxy.clone(),
            target: target.to_string(),
            status: format!(
                "{} {}",
                code.unwrap_or_default(),
                response.reason.unwrap_or_default()
            )
            .trim_end()
            .to_string(),
        }),
    }
}

/// A connection to the API server or to the proxy: TCP, or TLS to an `https` proxy.
type Io = Either<TcpStream, Box<tokio_rustls::client::TlsStream<TcpStream>>>;

/// What [`Connector`] hands to hyper (and, for `https`, to rustls first).
pub struct Stream {
    io: TokioIo<Io>,
    /// Requests go to the proxy with absolute URLs (a plain `http` API
    /// server behind a proxy).
    forwarded: bool,
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        Connected::new().proxy(self.forwarded)
    }
}

impl Read for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl Write for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
}

#[cfg(test)]
mod tests;
