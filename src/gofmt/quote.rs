//! Go's `strconv.Quote` and `unicode.IsPrint`, byte for byte: klog's quoted
//! values, Go error texts that quote their input.

use std::fmt::Write as _;

/// Go's `strconv.Quote`: printable characters stay as they are (also non-ASCII),
/// the rest become `\a`-style, `\xNN`, `\uNNNN` or `\UNNNNNNNN` escapes.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    go_quote_into(&mut out, s);
    out
}

/// Go's `strconv.Quote` of a byte string: as [`go_quote`], with every byte
/// that is not part of valid UTF-8 as `\xNN` (Go quotes `string(bytes)` so).
pub fn go_quote_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() + 2);
    out.push('"');
    for chunk in bytes.utf8_chunks() {
        quote_chars(&mut out, chunk.valid());
        for byte in chunk.invalid() {
            let _ = write!(out, "\\x{byte:02x}");
        }
    }
    out.push('"');
    out
}

/// [`go_quote`] appended to `out`.
pub fn go_quote_into(out: &mut String, s: &str) {
    out.push('"');
    quote_chars(out, s);
    out.push('"');
}

/// The inside of a Go quoted string.
fn quote_chars(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            ' '..='~' => out.push(c),
            c if c < ' ' || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if is_go_printable(c) => out.push(c),
            c if (c as u32) < 0x10000 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08x}", c as u32);
            }
        }
    }
}

/// Go's `unicode.IsPrint` for non-ASCII: letters, marks, numbers, punctuation
/// and symbols. Rust's debug escaping leaves exactly those unescaped (it
/// escapes the other categories, C* and Z*), except that it also escapes
/// combining marks at the start of a string, hence the leading letter.
/// Rust's tables are of a newer Unicode than Go's (17.0 and 15.0): what was
/// assigned since is unassigned, so escaped, for Go.
fn is_go_printable(c: char) -> bool {
    let cp = c as u32;
    let i = NEWER_THAN_GO_UNICODE.partition_point(|&(_, hi)| hi < cp);
    if NEWER_THAN_GO_UNICODE
        .get(i)
        .is_some_and(|&(lo, _)| lo <= cp)
    {
        return false;
    }
    let probe = format!("a{c}");
    probe.escape_debug().count() == 2
}

/// Printable code points (inclusive ranges, sorted) that Rust's Unicode 17.0
/// tables know and Go 1.26's Unicode 15.0 tables do not: letters, marks and
/// symbols of Unicode 15.1, 16.0 and 17.0. `strconv.Quote` escapes them.
/// `tests/properties_go.rs` checks every code point against Go, so a
/// toolchain with other tables fails there.
#[rustfmt::skip]
const NEWER_THAN_GO_UNICODE: &[(u32, u32)] = &[
    (0x088F, 0x088F), (0x0897, 0x0897), (0x0C5C, 0x0C5C), (0x0CDC, 0x0CDC), (0x1ACF, 0x1ADD),
    (0x1AE0, 0x1AEB), (0x1B4E, 0x1B4F), (0x1B7F, 0x1B7F), (0x1C89, 0x1C8A), (0x20C1, 0x20C1),
    (0x2427, 0x2429), (0x2B96, 0x2B96), (0x2FFC, 0x2FFF), (0x31E4, 0x31E5), (0x31EF, 0x31EF),
    (0xA7CB, 0xA7CF), (0xA7D2, 0xA7D2), (0xA7D4, 0xA7D4), (0xA7DA, 0xA7DC), (0xA7F1, 0xA7F1),
    (0xFBC3, 0xFBD2), (0xFD90, 0xFD91), (0xFDC8, 0xFDCE), (0x105C0, 0x105F3), (0x10940, 0x10959),
    (0x10D40, 0x10D65), (0x10D69, 0x10D85), (0x10D8E, 0x10D8F), (0x10EC2, 0x10EC7),
    (0x10ED0, 0x10ED8), (0x10EFA, 0x10EFC), (0x11380, 0x11389), (0x1138B, 0x1138B),
    (0x1138E, 0x1138E), (0x11390, 0x113B5), (0x113B7, 0x113C0), (0x113C2, 0x113C2),
    (0x113C5, 0x113C5), (0x113C7, 0x113CA), (0x113CC, 0x113D5), (0x113D7, 0x113D8),
    (0x113E1, 0x113E2), (0x116D0, 0x116E3), (0x11B60, 0x11B67), (0x11BC0, 0x11BE1),
    (0x11BF0, 0x11BF9), (0x11DB0, 0x11DDB), (0x11DE0, 0x11DE9), (0x11F5A, 0x11F5A),
    (0x13460, 0x143FA), (0x16100, 0x16139), (0x16D40, 0x16D79), (0x16EA0, 0x16EB8),
    (0x16EBB, 0x16ED3), (0x16FF2, 0x16FF6), (0x187F8, 0x187FF), (0x18CFF, 0x18CFF),
    (0x18D09, 0x18D1E), (0x18D80, 0x18DF2), (0x1CC00, 0x1CCFC), (0x1CD00, 0x1CEB3),
    (0x1CEBA, 0x1CED0), (0x1CEE0, 0x1CEF0), (0x1E5D0, 0x1E5FA), (0x1E5FF, 0x1E5FF),
    (0x1E6C0, 0x1E6DE), (0x1E6E0, 0x1E6F5), (0x1E6FE, 0x1E6FF), (0x1F6D8, 0x1F6D8),
    (0x1F777, 0x1F77A), (0x1F8B2, 0x1F8BB), (0x1F8C0, 0x1F8C1), (0x1F8D0, 0x1F8D8),
    (0x1FA54, 0x1FA57), (0x1FA89, 0x1FA8A), (0x1FA8E, 0x1FA8F), (0x1FABE, 0x1FABE),
    (0x1FAC6, 0x1FAC6), (0x1FAC8, 0x1FAC8), (0x1FACD, 0x1FACD), (0x1FADC, 0x1FADC),
    (0x1FADF, 0x1FADF), (0x1FAE9, 0x1FAEA), (0x1FAEF, 0x1FAEF), (0x1FBCB, 0x1FBEF),
    (0x1FBFA, 0x1FBFA), (0x2B73A, 0x2B73F), (0x2CEA2, 0x2CEAD), (0x2EBF0, 0x2EE5D),
    (0x323B0, 0x33479),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_quote_matches_strconv_quote() {
        // Expected output printed by Go's strconv.Quote for the same input.
        let input = "\u{7}\u{8}\u{b}\u{c}\r\u{1b} a\"b\\c\nd\te\x01\x7f é \u{a0} \u{200b} \u{1F600} \u{301}x \u{2028} \u{feff} \u{e000} \u{10ffff} \u{378} \u{ad}";
        assert_eq!(
            go_quote(input),
            r#""\a\b\v\f\r\x1b a\"b\\c\nd\te\x01\x7f é \u00a0 \u200b 😀 ́x \u2028 \ufeff \ue000 \U0010ffff \u0378 \u00ad""#
        );
    }

    #[test]
    fn go_quote_escapes_what_go_unicode_tables_do_not_have() {
        // Found by tests/properties_go.rs: Garay (Unicode 16), Egyptian
        // hieroglyphs extended-A (16), CJK extension J (17); Go printed them so.
        assert_eq!(
            go_quote("\u{10d40}\u{13460}\u{323b0}\u{88f}"),
            r#""\U00010d40\U00013460\U000323b0\u088f""#
        );
        // Unicode 15.0 itself is printed as is.
        assert_eq!(go_quote("\u{11f00}\u{31350}"), "\"\u{11f00}\u{31350}\"");
    }

    #[test]
    fn go_quote_bytes_escapes_what_is_not_utf8() {
        // Go: strconv.Quote(string([]byte("%\xe2\x82"))) and a valid prefix.
        assert_eq!(go_quote_bytes(&"%€".as_bytes()[..3]), r#""%\xe2\x82""#);
        assert_eq!(go_quote_bytes("é\n".as_bytes()), r#""é\n""#);
        assert_eq!(go_quote_bytes(b"a\xffb"), r#""a\xffb""#);
    }
}
