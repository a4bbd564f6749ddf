//! `NO_PROXY`, parsed and matched as Go's `httpproxy` does ([`NoProxy`]; see
//! the [`proxy`](super) module docs, "The environment").

use std::net::IpAddr;

/// `NO_PROXY`, as `httpproxy` reads and applies it (see the [`proxy`](super)
/// module docs).
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
            // Brackets already gone; an empty host is skipped below (Go checks twice).
            let (host, port) = split_host_port(&entry).unwrap_or((entry.as_str(), ""));
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
        let ip = parse_ip(host);
        if host == "localhost" || ip.is_some_and(|ip| ip.is_loopback()) || self.all {
            return false;
        }
        let ip_hit = ip.is_some_and(|ip| {
            self.ips.iter().any(|rule| match rule {
                IpRule::Cidr(net, bits) => in_network(ip, *net, *bits),
                IpRule::Addr(addr, rule_port) => {
                    *addr == ip && (rule_port.is_empty() || rule_port == port)
                }
            })
        });
        let host = host.trim().to_lowercase();
        !ip_hit
            && !self.domains.iter().any(|rule| {
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
    let bits: u8 = bits.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if bits > max {
        return None;
    }
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

#[cfg(test)]
mod tests;
