//! Proxy URLs as Go reads them ([`ProxyUrl`]: scheme, host, port and
//! credentials), and the host/port helpers the rest of [`proxy`](super) shares.

use std::fmt;

use http::Uri;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Plain HTTP to the proxy.
    Http,
    /// TLS to the proxy.
    Https,
    /// SOCKS5, the proxy resolving the API server's name.
    Socks5,
    /// The same, as `socks5h` (Go treats them alike).
    Socks5h,
}

#[derive(Clone, PartialEq, Eq)]
pub struct ProxyUrl {
    pub scheme: Scheme,
    /// Host name or IP (no brackets).
    pub host: String,
    /// Its port, or the scheme's (80, 443, 1080).
    pub port: u16,
    /// Percent-decoded user and password from the userinfo (the password
    /// empty if not given).
    pub(super) credentials: Option<(String, String)>,
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
            Scheme::Socks5h => "socks5h",
        };
        write!(f, "{scheme}://{}", host_port(&self.host, self.port))
    }
}

impl ProxyUrl {
    /// A proxy URL with an `http`, `https`, `socks5` or `socks5h` scheme (any
    /// case) and a host, or `None`.
    pub fn parse(value: &str) -> Option<Self> {
        let uri: Uri = value.parse().ok()?;
        let scheme = match uri.scheme_str()?.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            "socks5" => Scheme::Socks5,
            "socks5h" => Scheme::Socks5h,
            _ => return None,
        };
        let authority = uri.authority()?;
        let host = uri_host(&uri);
        if host.is_empty() {
            return None;
        }
        let port = authority.port_u16().unwrap_or(match scheme {
            Scheme::Http => 80,
            Scheme::Https => 443,
            Scheme::Socks5 | Scheme::Socks5h => 1080,
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
    /// with an `http`, `https`, `socks5` or `socks5h` scheme, else
    /// `http://<value>`; `None` for an empty or unparseable value.
    pub fn from_env_value(value: &str) -> Option<Self> {
        // `parse` takes only those schemes: whatever it refuses gets `http://`.
        Self::parse(value).or_else(|| Self::parse(&format!("http://{value}")))
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
pub(super) fn go_scheme(value: &str) -> Option<&str> {
    let (scheme, _) = value.split_once(':')?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(scheme)
}

/// The URL's host without IPv6 brackets (Go's `url.Hostname`).
pub(super) fn uri_host(uri: &Uri) -> &str {
    let host = uri.host().unwrap_or_default();
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// `host:port`, IPv6 in brackets (Go's `net.JoinHostPort`).
pub(super) fn host_port(host: &str, port: impl fmt::Display) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}
