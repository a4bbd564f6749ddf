//! AWS EBS (`kubernetes.io/aws-ebs` → `ebs.csi.aws.com`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolume};

use super::{spec_mut, topology, TranslateError};
use crate::gofmt::{go_quote, go_quote_bytes};

pub const DRIVER: &str = "ebs.csi.aws.com";
const TOPOLOGY_KEY: &str = "topology.ebs.csi.aws.com/zone";

pub fn translate(pv: &mut PersistentVolume) -> Result<(), TranslateError> {
    let spec = spec_mut(pv);
    let Some(source) = spec.aws_elastic_block_store.as_ref() else {
        return Ok(());
    };
    let volume_handle = ebs_volume_id(&source.volume_id).map_err(TranslateError::EbsVolumeId)?;
    let partition = source.partition.unwrap_or(0).to_string();
    let csi = CSIPersistentVolumeSource {
        driver: DRIVER.to_owned(),
        volume_handle,
        read_only: source.read_only,
        fs_type: source.fs_type.clone(),
        volume_attributes: Some(BTreeMap::from([("partition".to_owned(), partition)])),
        ..Default::default()
    };
    spec.aws_elastic_block_store = None;
    spec.csi = Some(csi);
    topology::to_csi(pv, TOPOLOGY_KEY);
    Ok(())
}

/// `vol-…` as is; `aws://<zone>/vol-…` parsed as a URL, the path trimmed of
/// slashes and required to be `vol-` without further slashes.
fn ebs_volume_id(kubernetes_id: &str) -> Result<String, String> {
    if !kubernetes_id.starts_with("aws://") {
        return Ok(kubernetes_id.to_owned());
    }
    let path =
        url_path(kubernetes_id).map_err(|e| format!("Invalid disk name ({kubernetes_id}): {e}"))?;
    let id = path.trim_matches('/');
    if id.starts_with("vol-") && !id.contains('/') {
        Ok(id.to_owned())
    } else {
        Err(format!("Invalid format for AWS volume ({kubernetes_id})"))
    }
}

/// The unescaped path of an absolute `scheme://authority/path?query#fragment`
/// URL, rejecting what Go's `net/url.Parse` rejects for such URLs, in Go's
/// order: control characters, then the host (IP literal, port, escapes and
/// characters, first offender first), then the userinfo, then the path and
/// the fragment escapes.
fn url_path(raw: &str) -> Result<String, String> {
    let (before_fragment, fragment) = raw.split_once('#').unwrap_or((raw, ""));
    let parse_error = |url: &str, e: String| format!("parse {}: {e}", go_quote(url));
    if before_fragment.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err(parse_error(
            before_fragment,
            "net/url: invalid control character in URL".to_owned(),
        ));
    }
    let (_scheme, rest) = before_fragment
        .split_once(':')
        .unwrap_or(("", before_fragment));
    let rest = match rest.strip_suffix('?') {
        Some(r) if !r.contains('?') => r,
        _ => rest.split_once('?').map_or(rest, |(r, _)| r),
    };
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    let (userinfo, host) = authority
        .rsplit_once('@')
        .map_or((None, authority), |(user, host)| (Some(user), host));
    check_host(host).map_err(|e| parse_error(before_fragment, e))?;
    if let Some(userinfo) = userinfo {
        check_userinfo(userinfo).map_err(|e| parse_error(before_fragment, e))?;
    }
    check_escapes(path, Part::Other).map_err(|e| parse_error(before_fragment, e))?;
    check_escapes(fragment, Part::Other).map_err(|e| parse_error(raw, e))?;
    Ok(unescape_checked(path))
}

/// Which part of a URL `check_escapes` reads (Go's `encoding` modes).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Path, fragment, userinfo: only the escapes are checked.
    Other,
    /// Host: escapes only for non-ASCII bytes (and `%25`); ASCII must be a host character.
    Host,
    /// IPv6 zone: escapes only for what could be written as is (or a space).
    Zone,
}

/// One pass, as Go's `unescape` does: the first offending byte decides the error.
fn check_escapes(s: &str, part: Part) -> Result<(), String> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let valid =
                i + 2 < b.len() && b[i + 1].is_ascii_hexdigit() && b[i + 2].is_ascii_hexdigit();
            if !valid {
                // Go cuts the escape at 3 bytes, even inside a multibyte character.
                let end = (i + 3).min(b.len());
                return Err(format!("invalid URL escape {}", go_quote_bytes(&b[i..end])));
            }
            // A valid escape is ASCII, so these 3 bytes are characters.
            let escape = &b[i..i + 3];
            let value = u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap_or_default();
            let refused = match part {
                Part::Other => false,
                Part::Host => b[i + 1] < b'8' && escape != b"%25",
                Part::Zone => {
                    escape != b"%25"
                        && value != b' '
                        && !(value.is_ascii() && host_char(char::from(value)))
                }
            };
            if refused {
                return Err(format!("invalid URL escape {}", go_quote_bytes(escape)));
            }
            i += 3;
        } else {
            if part != Part::Other && b[i].is_ascii() && !host_char(char::from(b[i])) {
                return Err(format!(
                    "invalid character {} in host name",
                    go_quote(&char::from(b[i]).to_string())
                ));
            }
            i += 1;
        }
    }
    Ok(())
}

/// `s` with its (already checked) escapes decoded.
fn unescape_checked(s: &str) -> String {
    let out: Vec<u8> = percent_encoding::percent_decode_str(s).collect();
    // Go keeps the bytes; what it hands on (JSON) shows each byte that is not
    // UTF-8 as one U+FFFD. Rust's lossy decoding would merge a broken
    // sequence into one.
    let mut text = String::with_capacity(out.len());
    for chunk in out.utf8_chunks() {
        text.push_str(chunk.valid());
        text.extend(chunk.invalid().iter().map(|_| char::REPLACEMENT_CHARACTER));
    }
    text
}

/// Go's `validUserinfo`, then the userinfo's escapes.
fn check_userinfo(userinfo: &str) -> Result<(), String> {
    let valid = userinfo
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-._:~!$&'()*+,;=%@".contains(c));
    if !valid {
        return Err("net/url: invalid userinfo".to_owned());
    }
    for part in userinfo.splitn(2, ':') {
        check_escapes(part, Part::Other)?;
    }
    Ok(())
}

/// Go's `validOptionalPort`.
fn check_port(port: &str) -> Result<(), String> {
    let valid =
        port.is_empty() || (port.starts_with(':') && port[1..].bytes().all(|c| c.is_ascii_digit()));
    if valid {
        Ok(())
    } else {
        Err(format!("invalid port {} after host", go_quote(port)))
    }
}

/// Go's `parseHost` for a non-HTTP scheme.
fn check_host(host: &str) -> Result<(), String> {
    match host.rfind('[') {
        Some(open) if open > 0 => Err("invalid IP-literal".to_owned()),
        Some(_) => {
            let close = host.rfind(']').ok_or("missing ']' in host")?;
            let port = &host[close + 1..];
            check_port(port)?;
            check_escapes(port, Part::Host)?;
            let literal = &host[1..close];
            let zone = literal.find("%25").unwrap_or(literal.len());
            check_escapes(&literal[..zone], Part::Host)?;
            check_escapes(&literal[zone..], Part::Zone)?;
            check_ipv6(&unescape_checked(literal))
        }
        None => {
            if let Some(colon) = host.rfind(':') {
                check_port(&host[colon..])?;
            }
            check_escapes(host, Part::Host)
        }
    }
}

/// What Go's `netip.ParseAddr` makes of an IP literal (its first `.`, `:` or
/// `%` decides the family), then Go's refusal of an IPv4 one in brackets.
fn check_ipv6(s: &str) -> Result<(), String> {
    let error = |msg: &str| format!("invalid host: ParseAddr({}): {msg}", go_quote(s));
    match s.bytes().find(|b| matches!(b, b'.' | b':' | b'%')) {
        Some(b'.') if s.parse::<std::net::Ipv4Addr>().is_ok() => {
            Err("invalid IP-literal".to_owned())
        }
        Some(b':') => {
            let (address, zone) = s.split_once('%').map_or((s, None), |(a, z)| (a, Some(z)));
            if zone == Some("") {
                return Err(error("zone must be a non-empty string"));
            }
            let ip = address.parse::<std::net::Ipv6Addr>();
            ip.map(drop).map_err(|_| error("unable to parse IP"))
        }
        Some(b'%') => Err(error("missing IPv6 address")),
        _ => Err(error("unable to parse IP")),
    }
}

/// ASCII characters Go's URL parser accepts unescaped in a host.
fn host_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-_.~!$&'()*+,;=:[]<>\"".contains(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_url_volume_ids() {
        assert_eq!(ebs_volume_id("vol-1"), Ok("vol-1".into()));
        assert_eq!(ebs_volume_id("anything"), Ok("anything".into()));
        assert_eq!(ebs_volume_id("aws://us-east-1a/vol-1"), Ok("vol-1".into()));
        assert_eq!(ebs_volume_id("aws:///vol-1/"), Ok("vol-1".into()));
        assert_eq!(ebs_volume_id("aws://z/vol-%41"), Ok("vol-A".into()));
        assert_eq!(ebs_volume_id("aws://z/vol-1?x=/y#f"), Ok("vol-1".into()));
    }

    #[test]
    fn the_first_offending_byte_of_a_host_decides_the_error() {
        // Found by tests/properties_migration.rs: Go reports the space, which
        // comes first; we reported the bad escape after it.
        assert_eq!(
            ebs_volume_id("aws:// %"),
            Err(r#"Invalid disk name (aws:// %): parse "aws:// %": invalid character " " in host name"#.into())
        );
        assert_eq!(
            ebs_volume_id("aws://%zz /vol-1"),
            Err(r#"Invalid disk name (aws://%zz /vol-1): parse "aws://%zz /vol-1": invalid URL escape "%zz""#.into())
        );
    }

    #[test]
    fn escaped_bytes_that_are_not_utf8_become_one_replacement_each() {
        // Found by tests/properties_migration.rs: "%e2%82" is a cut 3-byte
        // character; Go's JSON shows two U+FFFD, from_utf8_lossy made one.
        assert_eq!(
            ebs_volume_id("aws://z/vol-%e2%82"),
            Ok("vol-\u{fffd}\u{fffd}".into())
        );
        assert_eq!(ebs_volume_id("aws://z/vol-%e2%82%ac"), Ok("vol-€".into()));
        assert_eq!(
            ebs_volume_id("aws://z/vol-%ff%41"),
            Ok("vol-\u{fffd}A".into())
        );
    }

    #[test]
    fn userinfo_and_ip_literals_are_checked_as_go_does() {
        let err = |id: &str| ebs_volume_id(id).unwrap_err();
        assert!(err("aws://a b@z/vol-1").ends_with("net/url: invalid userinfo"));
        assert!(err("aws://a%zz@z/vol-1").ends_with(r#"invalid URL escape "%zz""#));
        assert_eq!(ebs_volume_id("aws://u:p@z/vol-1"), Ok("vol-1".into()));
        assert!(err("aws://[1.2.3.4]/vol-1").ends_with("invalid IP-literal"));
        assert_eq!(
            ebs_volume_id("aws://[::ffff:1.2.3.4]/vol-1"),
            Ok("vol-1".into())
        );
        assert_eq!(
            ebs_volume_id("aws://[fe80::1%25en0]:9/vol-1"),
            Ok("vol-1".into())
        );
        assert!(err("aws://[fe80::1%25%0A]/vol-1").ends_with(r#"invalid URL escape "%0A""#));
        assert!(err("aws://[fe80::1%25]/vol-1").ends_with("zone must be a non-empty string"));
    }

    #[test]
    fn malformed_url_ids_are_rejected() {
        for id in [
            "aws://z/vol-%zz",
            "aws://z/disk-1",
            "aws://z/a/vol-1",
            "aws://z:port/vol-1",
            "aws://z z/vol-1",
            "aws://z/vol-1\u{7}",
            "aws://z?/vol-1",
        ] {
            assert!(ebs_volume_id(id).is_err(), "{id}");
        }
        assert_eq!(
            ebs_volume_id("aws://z/vol-%zz"),
            Err("Invalid disk name (aws://z/vol-%zz): parse \"aws://z/vol-%zz\": invalid URL escape \"%zz\"".into())
        );
    }
}
