//! AWS EBS (`kubernetes.io/aws-ebs` → `ebs.csi.aws.com`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolume};

use super::{go_quote, spec_mut, topology, TranslateError};
use crate::logging::go_quote_bytes;

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
/// URL, rejecting what Go's `net/url.Parse` rejects for such URLs: control
/// characters, malformed `%` escapes, bad ports and invalid host characters.
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
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    check_host(host).map_err(|e| parse_error(before_fragment, e))?;
    let path = unescape(path).map_err(|e| parse_error(before_fragment, e))?;
    unescape(fragment).map_err(|e| parse_error(raw, e))?;
    Ok(path)
}

fn check_escapes(s: &str, host: bool) -> Result<(), String> {
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
            // In a host, %-escapes are for non-ASCII bytes (and %25). A valid
            // escape is ASCII, so these 3 bytes are characters.
            if host && b[i + 1] < b'8' && &b[i..i + 3] != b"%25" {
                return Err(format!(
                    "invalid URL escape {}",
                    go_quote_bytes(&b[i..i + 3])
                ));
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    Ok(())
}

fn unescape(s: &str) -> Result<String, String> {
    check_escapes(s, false)?;
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("00");
            out.push(u8::from_str_radix(hex, 16).unwrap_or(0));
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn check_host(host: &str) -> Result<(), String> {
    let port = if let Some(open) = host.rfind('[') {
        if open > 0 {
            return Err("invalid IP-literal".to_owned());
        }
        let close = host.rfind(']').ok_or("missing ']' in host")?;
        let literal = &host[1..close];
        let address = literal.split("%25").next().unwrap_or(literal);
        if address.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!(
                "invalid host: ParseAddr({}): unable to parse IP",
                go_quote(literal)
            ));
        }
        &host[close + 1..]
    } else {
        host.rfind(':').map_or("", |i| &host[i..])
    };
    let valid_port =
        port.is_empty() || (port.starts_with(':') && port[1..].bytes().all(|c| c.is_ascii_digit()));
    if !valid_port {
        return Err(format!("invalid port {} after host", go_quote(port)));
    }
    check_escapes(host, true)?;
    if let Some(c) = host.chars().find(|c| c.is_ascii() && !host_char(*c)) {
        if c != '%' {
            return Err(format!(
                "invalid character {} in host name",
                go_quote(&c.to_string())
            ));
        }
    }
    Ok(())
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
