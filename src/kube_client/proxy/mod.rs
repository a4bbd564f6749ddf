//! Proxies to the API server, chosen as client-go chooses them.
//!
//! # Which proxy
//! A kubeconfig cluster's `proxy-url` is used for every request, whatever
//! the environment says, NO_PROXY and loopback included (client-go's rest
//! config `Proxy`, `http.ProxyURL(u)`). Otherwise (in-cluster too) Go's
//! `http.ProxyFromEnvironment`, wrapped by apimachinery's
//! `NewProxierWithNoProxyCIDR`. [`route()`] makes that choice once per
//! client: a client always talks to one API server URL, and Go reads the
//! environment once per process.
//!
//! # The environment (golang.org/x/net/http/httpproxy)
//! [`Environment::from_env`] is `httpproxy.FromEnvironment`: each of
//! `HTTP_PROXY`, `HTTPS_PROXY`, `NO_PROXY` is the upper-case variable if set
//! and not empty, else the lower-case one; a non-empty `REQUEST_METHOD` means
//! a CGI process; `ALL_PROXY` is not read. An `https` API server uses only
//! `HTTPS_PROXY`, an `http` one only `HTTP_PROXY`, which a CGI process refuses
//! (here at start-up, with Go's text; Go fails every request). A value
//! without an `http`, `https`, `socks5` or `socks5h` scheme is read as
//! `http://<value>`; one that does not parse is ignored, as Go ignores it.
//!
//! [`NoProxy`] is `useProxy`: `localhost` (exactly, before case folding) and
//! loopback IPs (127.0.0.0/8, ::1, IPv4-mapped 127.x) are never proxied.
//! `NO_PROXY` is split at commas, entries trimmed and lower-cased, empty ones
//! skipped; `*` turns proxying off; a CIDR matches IPs within it; `ip` or
//! `ip:port` (`[v6]:port`) that IP (and port); anything else is a domain with
//! an optional port: `foo.com` matches it and its subdomains, `.foo.com` and
//! `*.foo.com` only the subdomains. The API server's port is its URL's, or
//! 443/80 by scheme; ports compare as strings, as in Go.
//!
//! Hand-written because hyper-util's matcher follows curl instead (reads
//! `ALL_PROXY`, lets `.foo.com` match `foo.com`, no ports, no loopback rule):
//! a Go-tuned `NO_PROXY` would mean something else. Not ported: Go's punycode
//! conversion of internationalised `NO_PROXY` entries (such an entry matches
//! no API server URL, which are ASCII).
//!
//! # How
//! As Go's transport: to an `https` API server through an `http` proxy,
//! `CONNECT host:port` (the host as the URL names it, resolved by the proxy)
//! and TLS to the API server inside; through an `https` proxy the same inside
//! TLS to the proxy, with the transport's TLS settings (`tls-server-name` if
//! set, else the proxy's host name); userinfo becomes `Proxy-Authorization:
//! Basic`. A plain `http` API server is not tunnelled: requests carry their
//! absolute URL. A `socks5` proxy (`socks5h` from the environment alike;
//! client-go's kubeconfig check refuses `socks5h`) tunnels every request with
//! RFC 1928 CONNECT as Go's `socksDialer` asks it: the host as named (an IP
//! as an IP), no authentication offered, plus username/password (RFC 1929)
//! when the URL has userinfo. [`Connector`] does this on TCP_NODELAY
//! connections, the handshake bounded by the connect timeout.
//!
//! Both handshakes are ours, not hyper-util's `Tunnel` and `SocksV5`: a
//! refusal must say which proxy refused which target with which status
//! (`tests/proxy.rs`), where `Tunnel` says only "unsuccessful" and `SocksV5`'s
//! error type is not exported; and `SocksV5` offers only username/password
//! when given credentials, so a proxy that wants none would refuse what Go's
//! offer gets through.

mod connect;
mod no_proxy;
mod route;
mod url;

pub use self::connect::{ConnectError, Connector, Stream};
pub use self::no_proxy::NoProxy;
pub use self::route::{check_kubeconfig_proxy_url, route, Environment, Error, Origin, Route};
pub use self::url::{ProxyUrl, Scheme};
