use super::*;

/// httpproxy's `useProxy` table (golang.org/x/net/http/httpproxy's tests),
/// every host on port 80.
#[test]
fn no_proxy_matches_hosts_domains_ips_cidrs_and_ports_as_go_does() {
    let no_proxy = NoProxy::parse(
        "foobar.com, .barbaz.net, *.wildcard.io, 192.168.1.1, 192.168.1.2:81, 192.168.1.3:80, \
         10.0.0.0/30, 2001:db8::52:0:1, [2001:db8::52:0:2]:443, [2001:db8::52:0:3]:80, \
         2002:db8:a::45/64",
    );
    let table = [
        // Never proxied: localhost and loopback IPs.
        ("localhost", false),
        ("127.0.0.1", false),
        ("127.0.0.2", false),
        ("::1", false),
        ("::ffff:127.0.0.1", false),
        ("::2", true),
        ("192.168.1.1", false), // the exact IPv4
        ("192.168.1.2", true),  // the port differs
        ("192.168.1.3", false), // IPv4:port
        ("192.168.1.4", true),
        ("10.0.0.2", false), // in the CIDR
        ("10.0.0.4", true),  // just past it
        ("::ffff:10.0.0.1", false),
        ("2001:db8::52:0:1", false), // the exact IPv6
        ("2001:db8::52:0:2", true),  // [v6]:443, not 80
        ("2001:db8::52:0:3", false), // [v6]:80
        ("2002:db8:a::123", false),  // in the v6 CIDR
        ("fe80::424b:c8be:1643:a1b6", true),
        ("barbaz.net", true),      // .barbaz.net: subdomains only
        ("www.barbaz.net", false), // a subdomain
        ("foobar.com", false),     // the domain itself
        ("www.foobar.com", false), // and its subdomains
        ("WWW.FOOBAR.COM", false), // case folded
        ("foofoobar.com", true),   // not a label boundary
        ("baz.com", true),
        ("localhost.net", true),
        ("local.localhost", true),
        ("barbarbaz.net", true),
        ("wildcard.io", true),         // *.wildcard.io: subdomains only
        ("nested.wildcard.io", false), // a subdomain
        ("awildcard.io", true),
    ];
    let wrong: Vec<_> = table
        .iter()
        .filter(|(host, proxied)| no_proxy.use_proxy(host, "80") != *proxied)
        .collect();
    assert!(wrong.is_empty(), "useProxy differs from Go for {wrong:?}");
}

#[test]
fn star_exempts_everything_and_broken_entries_are_skipped() {
    let all = NoProxy::parse("example.com, *");
    for host in ["apiserver.corp", "10.1.2.3", "2001:db8::1"] {
        assert!(!all.use_proxy(host, "443"), "{host}");
    }
    // Go: ":1" has no host and is ignored, without a panic.
    assert!(NoProxy::parse(":1").use_proxy("example.com", "80"));
    assert!(NoProxy::parse(", ,:80,[],1.2.3.4/33").use_proxy("example.com", "80"));
    // An invalid CIDR is a domain entry, matching nothing real.
    assert!(NoProxy::parse("1.2.3.4/33").use_proxy("1.2.3.4", "80"));
    // Only "localhost" exactly is never proxied (Go compares before folding case).
    assert!(NoProxy::parse("").use_proxy("LOCALHOST", "80"));
    // Ports compare as written; a domain with a port.
    let ported = NoProxy::parse("apiserver.corp:6443");
    assert!(!ported.use_proxy("apiserver.corp", "6443"));
    assert!(ported.use_proxy("apiserver.corp", "443"));
}

#[test]
fn split_host_port_is_gos() {
    assert_eq!(split_host_port("a:80"), Some(("a", "80")));
    assert_eq!(split_host_port("[::1]:80"), Some(("::1", "80")));
    assert_eq!(split_host_port("a:"), Some(("a", "")));
    assert_eq!(split_host_port("::1"), None); // too many colons
    assert_eq!(split_host_port("a"), None); // missing port
    assert_eq!(split_host_port("[::1]"), None);
    assert_eq!(split_host_port("[::1]x:80"), None);
    assert_eq!(split_host_port("a]:80"), None);
}
