//! Proxies to the API server, chosen as client-go chooses them.
//!
//! # Which proxy
//! client-go's transport (`transport/cache.go`) uses the rest config's
//! `Proxy` function if there is one, else Go's `http.ProxyFromEnvironment`
//! (wrapped by apimachinery's `NewProxierWithNoProxyCIDR`, whose CIDR rule
//! `httpproxy` has had itself for years). The rest config has a `Proxy`
//! only when the kubeconfig's cluster has a `proxy-url`
//! (`tools/clientcmd/client_config.go`: `http.ProxyURL(u)`): that proxy is
//! then used for every request, whatever the environment says, NO_PROXY and
//! loopback included. In-cluster (`rest.InClusterConfig`) and kubeconfigs
//! without `proxy-url` get the environment. [`route`] is that choice, made
//! once per client: every request of a client goes to the same API server
//! URL, and Go reads the environment once per process.
//!
//! # The environment (golang.org/x/net/http/httpproxy)
//! [`Environment::from_env`] is `httpproxy.FromEnvironment`: each of
//! `HTTP_PROXY`, `HTTPS_PROXY`, `NO_PROXY` is the upper-case variable if it
//! is set and not empty, else the lower-case one; a non-empty
//! `REQUEST_METHOD` means a CGI process. `ALL_PROXY` is not read. For an
//! `https` API server only `HTTPS_PROXY` applies (no fallback to
//! `HTTP_PROXY`); for `http`, only `HTTP_PROXY`, which a CGI process refuses
//! (here at start-up, with Go's text; Go fails every request). A value
//! without an `http`, `https` or `socks5` scheme is read as `http://<value>`
//! (`proxy.corp:3128`); a value that does not parse is ignored, as Go
//! ignores it.
//!
//! [`NoProxy`] is `useProxy`: a `localhost` host (exactly that, before any
//! case folding) and loopback IPs (127.0.0.0/8, ::1, and IPv4-mapped
//! 127.x) are never proxied. `NO_PROXY` is split at commas; entries are
//! trimmed and lower-cased, empty ones skipped; `*` turns proxying off; an
//! entry that parses as a CIDR matches IPs within it; `ip` or `ip:port`
//! (`[v6]:port`) matches that IP (and port); any other entry is a domain,
//! with an optional port: `foo.com` matches `foo.com` and its subdomains,
//! `.foo.com` and `*.foo.com` only the subdomains. The API server's port
//! is its URL's, or 443/80 by scheme. Ports are compared as strings, as Go
//! does.
//!
//! Hand-written: hyper-util's proxy matcher (`client::proxy::matcher`, not
//! in this build) follows curl's rules instead: it reads `ALL_PROXY`, lets
//! `.foo.com` match `foo.com`, has no ports in `NO_PROXY` and no loopback
//! rule, so an operator's Go-tuned `NO_PROXY` would mean something else.
//! Not ported: Go converts internationalised domain names in `NO_PROXY` to
//! punycode (`idna`); here such an entry is compared as written, so it
//! matches no API server URL (which are ASCII).
//!
//! # How
//! Go's transport reaches an `https` API server through an `http` proxy
//! with `CONNECT host:port` (the host as the URL names it, resolved by the
//! proxy) and TLS to the API server inside the tunnel; through an `https`
//! proxy the same inside TLS to the proxy, which uses the transport's TLS
//! settings (the cluster's CA and client certificate; `tls-server-name` if
//! set, else the proxy's host name); userinfo in the proxy URL becomes
//! `Proxy-Authorization: Basic`. A plain `http` API server is not tunnelled:
//! requests go to the proxy with their absolute URL. [`Connector`] does the
//! same, on connections with TCP_NODELAY, and bounds the proxy handshake by
//! the connect timeout. The CONNECT exchange is hand-written (a request and
//! a bounded read of the answer) so that a refusal says which proxy refused
//! which target with which status; hyper-util's `Tunnel` reports only
//! "unsuccessful".
//!
//! SOCKS5 proxies (which client-go supports) are refused at start-up with
//! an error that names the scheme.

use std::fmt;
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
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tower::{BoxError, Service};

/// Why no proxy route could be chosen.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A kubeconfig `proxy-url` client-go would refuse (its text).
    #[error(
        "invalid configuration: invalid 'proxy-url' {url:?} for cluster {cluster:?}: {reason}"
    )]
    KubeconfigProxyUrl {
        /// The value.
        url: String,
        /// The cluster's name.
        cluster: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A proxy scheme client-go supports and this build does not.
    #[error(
        "proxy {url} (from {origin}) uses the scheme {scheme:?}, which csi-attacher-rs does not support (client-go does); use an http:// or https:// proxy{hint}"
    )]
    Unsupported {
        /// The proxy, credentials hidden.
        url: String,
        /// Where it was set.
        origin: Origin,
        /// Its scheme.
        scheme: String,
        /// How else to get past it.
        hint: &'static str,
    },
    /// `HTTP_PROXY` in a CGI process (`REQUEST_METHOD` set), as Go refuses it.
    #[error("refusing to use HTTP_PROXY value in CGI environment; see golang.org/s/cgihttpproxy")]
    Cgi,
}

/// Where a proxy was configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The kubeconfig cluster's `proxy-url`.
    Kubeconfig,
    /// `HTTPS_PROXY`/`https_proxy`.
    HttpsProxy,
    /// `HTTP_PROXY`/`http_proxy`.
    HttpProxy,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Origin::Kubeconfig => "the kubeconfig's proxy-url",
            Origin::HttpsProxy => "HTTPS_PROXY",
            Origin::HttpProxy => "HTTP_PROXY",
        })
    }
}

/// The proxy variables, as `httpproxy.FromEnvironment` reads them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Environment {
    /// `HTTP_PROXY`, else `http_proxy`.
    pub http_proxy: String,
    /// `HTTPS_PROXY`, else `https_proxy`.
    pub https_proxy: String,
    /// `NO_PROXY`, else `no_proxy`.
    pub no_proxy: String,
    /// `REQUEST_METHOD` is set and not empty.
    pub cgi: bool,
}

impl Environment {
    /// This process's environment.
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// The variables as `lookup` gives them (for tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        // Go's getEnvAny: the first one set and not empty.
        let any = |names: [&str; 2]| {
            names
                .into_iter()
                .find_map(|name| lookup(name).filter(|v| !v.is_empty()))
                .unwrap_or_default()
        };
        Self {
            http_proxy: any(["HTTP_PROXY", "http_proxy"]),
            https_proxy: any(["HTTPS_PROXY", "https_proxy"]),
            no_proxy: any(["NO_PROXY", "no_proxy"]),
            cgi: lookup("REQUEST_METHOD").is_some_and(|v| !v.is_empty()),
        }
    }
}

/// A proxy's scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Plain HTTP to the proxy.
    Http,
    /// TLS to the proxy.
    Https,
    /// SOCKS5 (refused, see the module docs).
    Socks5,
}

/// A parsed proxy URL.
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyUrl {
    /// Its scheme.
    pub scheme: Scheme,
    /// Host name or IP (no brackets).
    pub host: String,
    /// Its port, or the scheme's (80, 443, 1080).
    pub port: u16,
    /// Percent-decoded user and password from the userinfo.
    credentials: Option<(String, String)>,
}

impl fmt::Debug for ProxyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for ProxyUrl {
    /// `scheme://host:port`, credentials left out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
            Scheme::Socks5 => "socks5",
        };
        write!(f, "{scheme}://{}", host_port(&self.host, self.port))
    }
}

impl ProxyUrl {
    /// A proxy URL with an `http`, `https` or `socks5` scheme (any case) and a
    /// host, or `None`.
    pub fn parse(value: &str) -> Option<Self> {
        let uri: Uri = value.parse().ok()?;
        let scheme = match uri.scheme_str()?.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            "socks5" => Scheme::Socks5,
            _ => return None,
        };
        let authority = uri.authority()?;
        let host = authority.host();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.is_empty() {
            return None;
        }
        let port = authority.port_u16().unwrap_or(match scheme {
            Scheme::Http => 80,
            Scheme::Https => 443,
            Scheme::Socks5 => 1080,
        });
        let credentials = authority.as_str().rsplit_once('@').map(|(userinfo, _)| {
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8_lossy()
                    .into_owned()
            };
            match userinfo.split_once(':') {
                Some((user, password)) => (decode(user), decode(password)),
                None => (decode(userinfo), String::new()),
            }
        });
        Some(Self {
            scheme,
            host: host.to_string(),
            port,
            credentials,
        })
    }

    /// An environment value as `httpproxy`'s `parseProxy` reads it: a URL
    /// with an `http`, `https` or `socks5` scheme, else `http://<value>`;
    /// `None` for an empty or unparseable value.
    pub fn from_env_value(value: &str) -> Option<Self> {
        if value.is_empty() {
            return None;
        }
        let known = go_scheme(value).is_some_and(|s| {
            matches!(s.to_ascii_lowercase().as_str(), "http" | "https" | "socks5")
        });
        let parsed = if known { Self::parse(value) } else { None };
        parsed.or_else(|| Self::parse(&format!("http://{value}")))
    }

    /// `Proxy-Authorization` for the userinfo, as Go sends it.
    pub fn authorization(&self) -> Option<http::HeaderValue> {
        use base64::Engine;
        let (user, password) = self.credentials.as_ref()?;
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        let mut value = http::HeaderValue::from_str(&format!("Basic {token}")).ok()?;
        value.set_sensitive(true);
        Some(value)
    }
}

/// The scheme of a URL as Go's `url.Parse` finds it: letters, digits, `+`,
/// `-`, `.` before the first `:`, starting with a letter.
fn go_scheme(value: &str) -> Option<&str> {
    let (scheme, _) = value.split_once(':')?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(scheme)
}

/// A kubeconfig cluster's `proxy-url` checked as client-go's `parseProxyURL`
/// checks it: `http`, `https` or `socks5` only.
pub fn check_kubeconfig_proxy_url(url: &str, cluster: &str) -> Result<(), Error> {
    let invalid = |reason: String| Error::KubeconfigProxyUrl {
        url: url.to_string(),
        cluster: cluster.to_string(),
        reason,
    };
    let scheme = go_scheme(url).unwrap_or_default().to_ascii_lowercase();
    if !matches!(scheme.as_str(), "http" | "https" | "socks5") {
        return Err(invalid(format!(
            "unsupported scheme {scheme:?}, must be http, https, or socks5"
        )));
    }
    if ProxyUrl::parse(url).is_none() {
        return Err(invalid(format!("could not parse: {url}")));
    }
    Ok(())
}

/// How a client reaches the API server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// Straight to it.
    Direct,
    /// Through this proxy.
    Proxy(ProxyUrl, Origin),
}

/// The route to `cluster_url`: the kubeconfig's `proxy-url` if given (for
/// every host), else the environment's proxy for its scheme unless
/// [`NoProxy`] exempts its host.
pub fn route(
    cluster_url: &Uri,
    kubeconfig_proxy: Option<&Uri>,
    env: &Environment,
) -> Result<Route, Error> {
    let (proxy, origin) = match kubeconfig_proxy {
        Some(uri) => {
            let text = uri.to_string();
            let proxy = ProxyUrl::parse(&text).ok_or_else(|| Error::Unsupported {
                url: redact(&text),
                origin: Origin::Kubeconfig,
                scheme: uri.scheme_str().unwrap_or_default().to_string(),
                hint: "",
            })?;
            (proxy, Origin::Kubeconfig)
        }
        None => {
            let (value, origin) = match cluster_url.scheme_str() {
                Some("https") => (&env.https_proxy, Origin::HttpsProxy),
                Some("http") => (&env.http_proxy, Origin::HttpProxy),
                _ => return Ok(Route::Direct),
            };
            let Some(proxy) = ProxyUrl::from_env_value(value) else {
                return Ok(Route::Direct);
            };
            if origin == Origin::HttpProxy && env.cgi {
                return Err(Error::Cgi);
            }
            let host = uri_host(cluster_url);
            let port = cluster_url.port().map_or_else(
                || {
                    if origin == Origin::HttpsProxy {
                        "443"
                    } else {
                        "80"
                    }
                    .to_string()
                },
                |p| p.as_str().to_string(),
            );
            if !NoProxy::parse(&env.no_proxy).use_proxy(host, &port) {
                return Ok(Route::Direct);
            }
            (proxy, origin)
        }
    };
    if proxy.scheme == Scheme::Socks5 {
        return Err(Error::Unsupported {
            url: proxy.to_string(),
            origin,
            scheme: "socks5".into(),
            hint: if origin == Origin::Kubeconfig {
                ""
            } else {
                ", or exempt the API server with NO_PROXY"
            },
        });
    }
    Ok(Route::Proxy(proxy, origin))
}

/// `url` without the password of its userinfo.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(start), Some(at)) if at > start => format!("{}{}", &url[..start + 3], &url[at + 1..]),
        _ => url.to_string(),
    }
}

/// The URL's host without IPv6 brackets (Go's `url.Hostname`).
fn uri_host(uri: &Uri) -> &str {
    let host = uri.host().unwrap_or_default();
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// `host:port`, IPv6 in brackets (Go's `net.JoinHostPort`).
fn host_port(host: &str, port: impl fmt::Display) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `NO_PROXY`, as `httpproxy` reads and applies it (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NoProxy {
    all: bool,
    ips: Vec<IpRule>,
    domains: Vec<DomainRule>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum IpRule {
    /// A network: its address (masked) and prefix length.
    Cidr(IpAddr, u8),
    /// One address, and a port if the entry had one.
    Addr(IpAddr, String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct DomainRule {
    /// Starts with a dot.
    suffix: String,
    port: String,
    /// The entry had no leading dot: the bare domain matches too.
    match_host: bool,
}

impl NoProxy {
    /// Parses a `NO_PROXY` value (errors are ignored entry by entry, as Go does).
    pub fn parse(value: &str) -> Self {
        let mut rules = Self::default();
        for entry in value.split(',') {
            let entry = entry.trim().to_lowercase();
            if entry.is_empty() {
                continue;
            }
            if entry == "*" {
                return Self {
                    all: true,
                    ..Self::default()
                };
            }
            if let Some((ip, bits)) = parse_cidr(&entry) {
                rules.ips.push(IpRule::Cidr(ip, bits));
                continue;
            }
            let (host, port) = match split_host_port(&entry) {
                Some((host, port)) => {
                    if host.is_empty() {
                        continue;
                    }
                    let host = host
                        .strip_prefix('[')
                        .and_then(|h| h.strip_suffix(']'))
                        .unwrap_or(host);
                    (host, port)
                }
                None => (entry.as_str(), ""),
            };
            if let Some(ip) = parse_ip(host) {
                rules.ips.push(IpRule::Addr(ip, port.to_string()));
                continue;
            }
            if host.is_empty() {
                continue;
            }
            let host = host
                .strip_prefix('*')
                .filter(|h| h.starts_with('.'))
                .unwrap_or(host);
            let (suffix, match_host) = match host.starts_with('.') {
                true => (host.to_string(), false),
                false => (format!(".{host}"), true),
            };
            rules.domains.push(DomainRule {
                suffix,
                port: port.to_string(),
                match_host,
            });
        }
        rules
    }

    /// Whether a request to `host` (no brackets) and `port` goes through the
    /// proxy (`httpproxy`'s `useProxy`).
    pub fn use_proxy(&self, host: &str, port: &str) -> bool {
        if host == "localhost" {
            return false;
        }
        let ip = parse_ip(host);
        if ip.is_some_and(|ip| ip.is_loopback()) {
            return false;
        }
        if self.all {
            return false;
        }
        let host = host.trim().to_lowercase();
        if let Some(ip) = ip {
            let hit = self.ips.iter().any(|rule| match rule {
                IpRule::Cidr(net, bits) => in_network(ip, *net, *bits),
                IpRule::Addr(addr, rule_port) => {
                    *addr == ip && (rule_port.is_empty() || rule_port == port)
                }
            });
            if hit {
                return false;
            }
        }
        !self.domains.iter().any(|rule| {
            (host.ends_with(&rule.suffix) || (rule.match_host && host == rule.suffix[1..]))
                && (rule.port.is_empty() || rule.port == port)
        })
    }
}

/// An IP as Go's `net.ParseIP` reads it, IPv4-mapped IPv6 as IPv4 (Go
/// compares and tests them as IPv4).
fn parse_ip(text: &str) -> Option<IpAddr> {
    text.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// A CIDR as Go's `net.ParseCIDR` reads it: the masked address and the
/// prefix length (an IPv4-mapped network as the IPv4 one).
fn parse_cidr(text: &str) -> Option<(IpAddr, u8)> {
    let (addr, bits) = text.split_once('/')?;
    if bits.is_empty() || !bits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ip: IpAddr = addr.parse().ok()?;
    let bits: u32 = bits.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if bits > max {
        return None;
    }
    let bits = u8::try_from(bits).ok()?;
    let (ip, bits) = match ip {
        IpAddr::V6(v6) if bits >= 96 => match v6.to_ipv4_mapped() {
            Some(v4) => (IpAddr::V4(v4), bits - 96),
            None => (ip, bits),
        },
        _ => (ip, bits),
    };
    Some((mask(ip, bits), bits))
}

fn mask(ip: IpAddr, bits: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let m = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            IpAddr::V4((u32::from(v4) & m).into())
        }
        IpAddr::V6(v6) => {
            let m = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & m).into())
        }
    }
}

fn in_network(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    ip.is_ipv4() == net.is_ipv4() && mask(ip, bits) == net
}

/// Go's `net.SplitHostPort`: `host:port` or `[host]:port`, or `None`.
fn split_host_port(text: &str) -> Option<(&str, &str)> {
    let colon = text.rfind(':')?;
    let (host, rest_from) = if text.starts_with('[') {
        let end = text.find(']')?;
        if end + 1 != colon {
            return None;
        }
        (&text[1..end], end + 1)
    } else {
        let host = &text[..colon];
        if host.contains(':') {
            return None;
        }
        (host, 0)
    };
    let open_from = if text.starts_with('[') { 1 } else { 0 };
    if text[open_from..].contains('[') || text[rest_from..].contains(']') {
        return None;
    }
    Some((host, &text[colon + 1..]))
}

/// Why a connection through the proxy failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The proxy could not be reached.
    #[error("proxyconnect: cannot reach the proxy {proxy}: {source}")]
    Reach {
        /// The proxy.
        proxy: ProxyUrl,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// TLS to an `https` proxy failed.
    #[error("proxyconnect: TLS with the proxy {proxy} failed: {source}")]
    Tls {
        /// The proxy.
        proxy: ProxyUrl,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The proxy answered CONNECT with another status than 200.
    #[error("the proxy {proxy} refused CONNECT to {target}: {status}")]
    Refused {
        /// The proxy.
        proxy: ProxyUrl,
        /// `host:port` asked for.
        target: String,
        /// Its status line's code and reason.
        status: String,
    },
    /// The CONNECT exchange broke off or made no sense.
    #[error("the proxy {proxy} did not open a tunnel to {target}: {reason}")]
    Handshake {
        /// The proxy.
        proxy: ProxyUrl,
        /// `host:port` asked for.
        target: String,
        /// What happened.
        reason: String,
    },
    /// No tunnel within the connect timeout.
    #[error("the proxy {proxy} did not open a tunnel to {target} within {timeout:?}")]
    Timeout {
        /// The proxy.
        proxy: ProxyUrl,
        /// `host:port` asked for.
        target: String,
        /// The connect timeout.
        timeout: Duration,
    },
}

/// The most a CONNECT answer's head may take.
const MAX_CONNECT_RESPONSE: usize = 16 * 1024;

/// Connections to the API server: direct, or through the proxy of a
/// [`Route`] (see the module docs); TCP_NODELAY on every one.
#[derive(Clone)]
pub struct Connector {
    http: HttpConnector,
    via: Option<Arc<Via>>,
}

struct Via {
    proxy: ProxyUrl,
    tls: Option<(
        tokio_rustls::TlsConnector,
        tokio_rustls::rustls::pki_types::ServerName<'static>,
    )>,
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
        let via = match route {
            Route::Direct => None,
            Route::Proxy(proxy, _) => {
                let tls = match proxy.scheme {
                    Scheme::Https => {
                        let mut config = tls()?;
                        // HTTP/1.1 to the proxy: CONNECT, never h2.
                        config.alpn_protocols.clear();
                        let name = tls_server_name.unwrap_or(&proxy.host).to_string();
                        let name = tokio_rustls::rustls::pki_types::ServerName::try_from(name)
                            .map_err(|e| {
                                kube::Error::Service(
                                    format!("proxy {proxy}: invalid TLS server name: {e}").into(),
                                )
                            })?;
                        Some((tokio_rustls::TlsConnector::from(Arc::new(config)), name))
                    }
                    Scheme::Http | Scheme::Socks5 => None,
                };
                Some(Arc::new(Via {
                    proxy: proxy.clone(),
                    tls,
                    timeout,
                }))
            }
        };
        Ok(Self { http, via })
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
                    io: Io::Tcp(tcp.into_inner()),
                    forwarded: false,
                })
            });
        };
        Box::pin(async move {
            let default_port = if dst.scheme_str() == Some("http") {
                80
            } else {
                443
            };
            let target = host_port(uri_host(&dst), dst.port_u16().unwrap_or(default_port));
            let tunnel = dst.scheme_str() != Some("http");
            let connecting = connect_via(&mut http, &via, &target, tunnel);
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
                io,
                forwarded: !tunnel,
            })
        })
    }
}

/// A connection to the proxy, TLS to it if `https`, and the tunnel to
/// `target` if `tunnel`.
async fn connect_via(
    http: &mut HttpConnector,
    via: &Via,
    target: &str,
    tunnel: bool,
) -> Result<Io, ConnectError> {
    let proxy = &via.proxy;
    let proxy_uri = Uri::builder()
        .scheme("http")
        .authority(host_port(&proxy.host, proxy.port))
        .path_and_query("/")
        .build()
        .map_err(|e| ConnectError::Reach {
            proxy: proxy.clone(),
            source: e.into(),
        })?;
    std::future::poll_fn(|cx| http.poll_ready(cx))
        .await
        .map_err(|e| ConnectError::Reach {
            proxy: proxy.clone(),
            source: e.into(),
        })?;
    let tcp = http
        .call(proxy_uri)
        .await
        .map_err(|e| ConnectError::Reach {
            proxy: proxy.clone(),
            source: e.into(),
        })?
        .into_inner();
    let mut io = match &via.tls {
        None => Io::Tcp(tcp),
        Some((connector, name)) => Io::Tls(Box::new(
            connector
                .connect(name.clone(), tcp)
                .await
                .map_err(|source| ConnectError::Tls {
                    proxy: proxy.clone(),
                    source,
                })?,
        )),
    };
    if tunnel {
        connect_tunnel(&mut io, proxy, target).await?;
    }
    Ok(io)
}

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
    io.write_all(request.as_bytes())
        .await
        .map_err(|e| handshake(format!("sending CONNECT: {e}")))?;
    io.flush()
        .await
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
    match response.parse(&head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) | Err(_) => {
            let line =
                String::from_utf8_lossy(head.split(|b| *b == b'\n').next().unwrap_or_default());
            return Err(handshake(format!(
                "not an HTTP answer to CONNECT: {:?}",
                line.trim_end()
            )));
        }
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

/// A connection to the API server or to the proxy.
enum Io {
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Tcp(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// What [`Connector`] hands to hyper (and, for `https`, to rustls first).
pub struct Stream {
    io: Io,
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
        let mut io = TokioIo::new(&mut self.get_mut().io);
        Pin::new(&mut io).poll_read(cx, buf)
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
