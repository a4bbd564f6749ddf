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
//! without `proxy-url` get the environment. [`route()`] is that choice, made
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
//! without an `http`, `https`, `socks5` or `socks5h` scheme is read as
//! `http://<value>` (`proxy.corp:3128`); a value that does not parse is
//! ignored, as Go ignores it.
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
//! A `socks5` proxy (a kubeconfig's `proxy-url`, or from the environment
//! `socks5` and `socks5h` alike, as Go's transport takes them; client-go's
//! kubeconfig check refuses `socks5h`) tunnels every request, `http` API
//! servers too, with RFC 1928 CONNECT as Go's `socksDialer` asks it: the
//! API server's host as the URL names it (the proxy resolves it; an IP goes
//! as an IP), no authentication offered, and username/password (RFC 1929,
//! from the userinfo) too if the URL has userinfo. Hand-written too:
//! hyper-util's `SocksV5` (feature `client-proxy`, which would add `ipnet`
//! to the build) offers only username/password when given credentials, so a
//! proxy that wants none would refuse what Go's offer gets through; and its
//! error type is not exported, so a failure reads "SOCKS error: …" without
//! the proxy or the target, and an unreachable proxy or a broken exchange
//! without its cause.

mod connect;
mod no_proxy;
mod route;
mod url;

pub use self::connect::{ConnectError, Connector, Stream};
pub use self::no_proxy::NoProxy;
pub use self::route::{check_kubeconfig_proxy_url, route, Environment, Error, Origin, Route};
pub use self::url::{ProxyUrl, Scheme};
