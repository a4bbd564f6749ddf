//! Which proxy, if any, a client goes through: the kubeconfig's `proxy-url`,
//! else the environment ([`Environment`]) for the API server's scheme unless
//! `NO_PROXY` exempts it ([`route`]; see the [`proxy`](super) module docs).

use std::fmt;

use http::Uri;

use super::no_proxy::NoProxy;
use super::url::{go_scheme, uri_host, ProxyUrl};

/// Why no proxy route could be chosen.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A kubeconfig `proxy-url` client-go would refuse (its text).
    #[error(
        "invalid configuration: invalid 'proxy-url' {url:?} for cluster {cluster:?}: {reason}"
    )]
    KubeconfigProxyUrl {
        url: String,
        cluster: String,
        reason: String,
    },
    /// A kubeconfig `proxy-url` that [`check_kubeconfig_proxy_url`] let through
    /// and [`ProxyUrl`] cannot read.
    #[error("proxy {url} (from the kubeconfig's proxy-url): could not parse it")]
    Unparseable {
        /// The proxy, credentials hidden.
        url: String,
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
    Direct,
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
    if let Some(uri) = kubeconfig_proxy {
        let text = uri.to_string();
        let proxy =
            ProxyUrl::parse(&text).ok_or_else(|| Error::Unparseable { url: redact(&text) })?;
        return Ok(Route::Proxy(proxy, Origin::Kubeconfig));
    }
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
    let port = match cluster_url.port() {
        Some(port) => port.as_str().to_string(),
        None if origin == Origin::HttpsProxy => "443".to_string(),
        None => "80".to_string(),
    };
    if !NoProxy::parse(&env.no_proxy).use_proxy(host, &port) {
        return Ok(Route::Direct);
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

#[cfg(test)]
mod tests;
