//! Go's value syntax, for flags that must read exactly as upstream's do.
//! (The quantity syntax is in [`super::quantity`].)
//!
//! Ports of `strconv.ParseInt`/`ParseUint` (base 0: `0x10`, `010`, `0b1`,
//! `0o7`, `1_000`), `strconv.ParseFloat`, `strconv.ParseBool`,
//! `time.ParseDuration` (signed) and Kubernetes' `resource.ParseQuantity`
//! (syntax and zero-ness only). Each follows Go's algorithm step by step, so
//! the odd corners agree too: which error wins, where overflow is noticed,
//! what underscores are allowed. Go 1.26 and apimachinery v0.36 are the
//! references.

/// A number that does not parse, worded as Go's `flag` package words it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NumError {
    /// `strconv.ErrSyntax`.
    #[error("parse error")]
    Syntax,
    /// `strconv.ErrRange`.
    #[error("value out of range")]
    Range,
}

/// `strconv.ParseInt(s, 0, 64)`, as Go's `flag.Int` calls it.
pub fn parse_int(s: &str) -> Result<i64, NumError> {
    let (negative, digits) = match s.as_bytes().first() {
        Some(b'+') => (false, &s[1..]),
        Some(b'-') => (true, &s[1..]),
        _ => (false, s), // empty: a syntax error below
    };
    // A syntax error wins over a range error; a range error is decided by the sign below.
    let magnitude = match parse_uint_base(digits, 0, 64) {
        Ok(n) => n,
        Err(NumError::Range) => u64::MAX,
        Err(NumError::Syntax) => return Err(NumError::Syntax),
    };
    let cutoff = 1u64 << 63;
    match (negative, magnitude) {
        (false, n) if n >= cutoff => Err(NumError::Range),
        (true, n) if n > cutoff => Err(NumError::Range),
        (true, n) => Ok((n as i64).wrapping_neg()),
        (false, n) => Ok(n as i64),
    }
}

/// `strconv.ParseUint(s, 0, 64)`, as Go's `flag.Uint` calls it (no sign allowed).
pub fn parse_uint(s: &str) -> Result<u64, NumError> {
    parse_uint_base(s, 0, 64)
}

/// klog's verbosity syntax: `strconv.ParseUint(s, 10, 31)`, with strconv's own error text
/// (the `--v` and `--vmodule` flags print it unchanged).
pub fn parse_level(s: &str) -> Result<u32, String> {
    parse_uint_base(s, 10, 31)
        .map(|n| n as u32) // at most 2^31-1
        .map_err(|err| {
            let why = match err {
                NumError::Syntax => "invalid syntax",
                NumError::Range => "value out of range",
            };
            format!("strconv.ParseUint: parsing {}: {why}", quote(s))
        })
}

/// `strconv.ParseUint(s, base, bits)` for base 0 (Go literal prefixes) or 10.
fn parse_uint_base(s: &str, base: u32, bits: u32) -> Result<u64, NumError> {
    let bytes = s.as_bytes();
    if bytes.is_empty() {
        return Err(NumError::Syntax);
    }
    let base0 = base == 0;
    let (base, digits) = if base0 {
        match bytes {
            [b'0', p, _, ..] if p.eq_ignore_ascii_case(&b'b') => (2, &bytes[2..]),
            [b'0', p, _, ..] if p.eq_ignore_ascii_case(&b'o') => (8, &bytes[2..]),
            [b'0', p, _, ..] if p.eq_ignore_ascii_case(&b'x') => (16, &bytes[2..]),
            [b'0', ..] => (8, &bytes[1..]),
            _ => (10, bytes),
        }
    } else {
        (base, bytes)
    };
    let max = u64::MAX >> (64 - bits);
    let cutoff = u64::MAX / u64::from(base) + 1;
    let mut underscores = false;
    let mut n: u64 = 0;
    for &c in digits {
        let d = match c {
            b'_' if base0 => {
                underscores = true;
                continue;
            }
            b'0'..=b'9' => u32::from(c - b'0'),
            c if c.is_ascii_alphabetic() => u32::from(c.to_ascii_lowercase() - b'a') + 10,
            _ => return Err(NumError::Syntax),
        };
        if d >= base {
            return Err(NumError::Syntax);
        }
        if n >= cutoff {
            return Err(NumError::Range);
        }
        n *= u64::from(base);
        match n.checked_add(u64::from(d)) {
            Some(next) if next <= max => n = next,
            _ => return Err(NumError::Range),
        }
    }
    if underscores && !underscore_ok(s) {
        return Err(NumError::Syntax);
    }
    Ok(n)
}

/// Go's `underscoreOK`: underscores only between digits, or after a base prefix.
fn underscore_ok(s: &str) -> bool {
    let mut s = s.as_bytes();
    if let [b'+' | b'-', rest @ ..] = s {
        s = rest;
    }
    // What came last: b'^' start, b'0' digit or prefix, b'_' underscore, b'!' anything else.
    let mut saw = b'^';
    let mut hex = false;
    let mut i = 0;
    if s.len() >= 2 && s[0] == b'0' && matches!(s[1].to_ascii_lowercase(), b'b' | b'o' | b'x') {
        i = 2;
        saw = b'0';
        hex = s[1].eq_ignore_ascii_case(&b'x');
    }
    for &c in &s[i..] {
        if c.is_ascii_digit() || (hex && c.is_ascii_hexdigit()) {
            saw = b'0';
        } else if c == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
        } else {
            if saw == b'_' {
                return false;
            }
            saw = b'!';
        }
    }
    saw != b'_'
}

/// `strconv.ParseFloat(s, 64)`, as Go's `flag.Float64` calls it: `1e-3`, `.5`, `1_000.5`,
/// hex floats (`0x1p-2`), `inf`/`infinity`/`nan` in any case. Overflow is a range error;
/// underflow is 0.
pub fn parse_float(s: &str) -> Result<f64, NumError> {
    if let Some(special) = parse_special_float(s) {
        return Ok(special);
    }
    let form = read_float(s).ok_or(NumError::Syntax)?;
    let value = if form.hex {
        hex_float(&form)
    } else {
        // The syntax is Go's and already checked; Rust's parser rounds the same (correctly).
        let clean: String = s.chars().filter(|&c| c != '_').collect();
        clean.parse::<f64>().map_err(|_| NumError::Syntax)?
    };
    if value.is_infinite() {
        return Err(NumError::Range);
    }
    Ok(value)
}

/// Go's `special`: `[+-]inf`, `[+-]infinity`, `nan` (no sign), any case, and nothing else.
fn parse_special_float(s: &str) -> Option<f64> {
    if s.eq_ignore_ascii_case("nan") {
        return Some(f64::NAN);
    }
    let (sign, rest) = match s.as_bytes().first() {
        Some(b'+') => (1.0, &s[1..]),
        Some(b'-') => (-1.0, &s[1..]),
        _ => (1.0, s),
    };
    (rest.eq_ignore_ascii_case("inf") || rest.eq_ignore_ascii_case("infinity"))
        .then_some(sign * f64::INFINITY)
}

/// What Go's `readFloat` found in a well-formed float.
struct FloatForm {
    hex: bool,
    negative: bool,
    /// Hex only: the significant hex digits, at most 16 of them.
    mantissa: u64,
    /// Hex only: the binary exponent to apply to `mantissa`.
    exponent: i64,
    /// Hex only: non-zero digits were dropped from `mantissa`.
    truncated: bool,
}

/// The sign and `0x` prefix of a float: (index after them, negative, hex).
fn float_prefix(b: &[u8]) -> (usize, bool, bool) {
    let (mut i, negative) = match b.first() {
        Some(b'+') => (1, false),
        Some(b'-') => (1, true),
        _ => (0, false),
    };
    let hex = i + 2 < b.len() && b[i] == b'0' && b[i + 1].eq_ignore_ascii_case(&b'x');
    if hex {
        i += 2;
    }
    (i, negative, hex)
}

/// Go's `readFloat`, requiring the whole string to be consumed; None is a syntax error.
fn read_float(s: &str) -> Option<FloatForm> {
    let b = s.as_bytes();
    let mut underscores = false;
    let (mut i, negative, hex) = float_prefix(b);
    let (base, max_digits): (u64, usize) = if hex { (16, 16) } else { (10, 19) };
    let (mut saw_dot, mut saw_digits) = (false, false);
    let (mut nd, mut nd_mant, mut dp): (i64, i64, i64) = (0, 0, 0);
    let mut mantissa: u64 = 0;
    let mut truncated = false;
    while i < b.len() {
        let c = b[i];
        let digit = match c {
            b'_' => {
                underscores = true;
                i += 1;
                continue;
            }
            b'.' if saw_dot => break,
            b'.' => {
                saw_dot = true;
                dp = nd;
                i += 1;
                continue;
            }
            b'0'..=b'9' => u64::from(c - b'0'),
            c if hex && c.is_ascii_hexdigit() => u64::from(c.to_ascii_lowercase() - b'a') + 10,
            _ => break,
        };
        saw_digits = true;
        i += 1;
        if digit == 0 && nd == 0 {
            dp -= 1; // leading zero
            continue;
        }
        nd += 1;
        if (nd_mant as usize) < max_digits {
            mantissa = mantissa * base + digit;
            nd_mant += 1;
        } else if digit != 0 {
            truncated = true;
        }
    }
    if !saw_digits {
        return None;
    }
    if !saw_dot {
        dp = nd;
    }
    if hex {
        dp *= 4;
        nd_mant *= 4;
    }
    let exp_char = if hex { b'p' } else { b'e' };
    if i < b.len() && b[i].eq_ignore_ascii_case(&exp_char) {
        let (e, end) = read_exponent(b, i + 1, &mut underscores)?;
        dp += e;
        i = end;
    } else if hex {
        return None; // a hex float needs its p exponent
    }
    if underscores && !underscore_ok(&s[..i]) {
        return None;
    }
    if i != b.len() {
        return None;
    }
    Some(FloatForm {
        hex,
        negative,
        mantissa,
        exponent: if mantissa != 0 { dp - nd_mant } else { 0 },
        truncated,
    })
}

/// The signed exponent starting at `b[i]` (after the `e`/`p`) and the index
/// after it; `None` without digits. Magnitudes are capped at 10000, as Go's.
fn read_exponent(b: &[u8], mut i: usize, underscores: &mut bool) -> Option<(i64, usize)> {
    let sign = if b.get(i) == Some(&b'-') { -1 } else { 1 };
    if matches!(b.get(i), Some(b'+' | b'-')) {
        i += 1;
    }
    if !b.get(i).is_some_and(u8::is_ascii_digit) {
        return None;
    }
    let mut e: i64 = 0;
    while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'_') {
        if b[i] == b'_' {
            *underscores = true;
        } else if e < 10000 {
            e = e * 10 + i64::from(b[i] - b'0');
        }
        i += 1;
    }
    Some((e * sign, i))
}

/// The value of a hex float: mantissa × 2^exponent, rounded to nearest.
fn hex_float(form: &FloatForm) -> f64 {
    // A dropped non-zero digit only matters for ties: a sticky bit below the kept ones breaks them.
    let (mantissa, exponent) = if form.truncated {
        ((u128::from(form.mantissa) << 1) | 1, form.exponent - 1)
    } else {
        (u128::from(form.mantissa), form.exponent)
    };
    // Two exact power-of-two steps, each within f64's normal range; beyond ±2000 the result
    // is 0 or infinite anyway.
    let exponent = exponent.clamp(-3000, 3000) as i32;
    let first = exponent.clamp(-1000, 1000);
    // Rounding is symmetric about zero, so the sign may come first (-0 stays -0).
    let sign = if form.negative { -1.0 } else { 1.0 };
    sign * mantissa as f64 * 2f64.powi(first) * 2f64.powi(exponent - first)
}

/// `strconv.ParseBool`.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// `time.ParseDuration`, in signed nanoseconds: `300ms`, `-1.5h`, `1h2m3s`, `0`, `+0`.
///
/// Go's exact arithmetic: integer parts must fit in 2^63 ns, fractions are
/// accumulated to 19 digits and scaled in f64, and a bare number other than 0
/// needs a unit.
pub fn parse_duration(s: &str) -> Result<i64, String> {
    let invalid = || format!("time: invalid duration {}", time_quote(s));
    let negative = s.starts_with('-');
    let mut rest = s.strip_prefix(['-', '+']).unwrap_or(s).as_bytes();
    if rest == b"0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        if !(rest[0] == b'.' || rest[0].is_ascii_digit()) {
            return Err(invalid());
        }
        let (whole, tail) = leading_int(rest).ok_or_else(invalid)?;
        let before_dot = tail.len() < rest.len();
        let (fraction, scale, after_dot, tail) = match tail {
            [b'.', tail @ ..] => leading_fraction(tail),
            _ => (0, 1.0, false, tail),
        };
        if !before_dot && !after_dot {
            return Err(invalid());
        }
        let unit_len = tail
            .iter()
            .position(|c| *c == b'.' || c.is_ascii_digit())
            .unwrap_or(tail.len());
        if unit_len == 0 {
            return Err(format!("time: missing unit in duration {}", time_quote(s)));
        }
        let unit = duration_unit(&tail[..unit_len], s)?;
        rest = &tail[unit_len..];
        if whole > DURATION_LIMIT / unit {
            return Err(invalid());
        }
        let mut value = whole * unit;
        if fraction > 0 {
            value += (fraction as f64 * (unit as f64 / scale)) as u64;
            if value > DURATION_LIMIT {
                return Err(invalid());
            }
        }
        // Go adds in uint64 and checks afterwards; 2^63 + 2^63 wraps there, and here.
        total = total.wrapping_add(value);
        if total > DURATION_LIMIT {
            return Err(invalid());
        }
    }
    if negative {
        return Ok((total as i64).wrapping_neg());
    }
    i64::try_from(total).map_err(|_| invalid())
}

/// The largest magnitude of a duration, in nanoseconds.
const DURATION_LIMIT: u64 = 1 << 63;

/// Go's `leadingInt`: the digits at the start of `s` and what follows them;
/// `None` when the number passes 2^63.
fn leading_int(s: &[u8]) -> Option<(u64, &[u8])> {
    let digits = s.iter().take_while(|c| c.is_ascii_digit()).count();
    let mut whole: u64 = 0;
    for &c in &s[..digits] {
        if whole > DURATION_LIMIT / 10 {
            return None;
        }
        whole = whole * 10 + u64::from(c - b'0');
        if whole > DURATION_LIMIT {
            return None;
        }
    }
    Some((whole, &s[digits..]))
}

/// Go's `leadingFraction`: the digits after a dot as (value, 10^digits kept,
/// any digit seen, rest). Digits past what fits are ignored, not an error.
fn leading_fraction(s: &[u8]) -> (u64, f64, bool, &[u8]) {
    let digits = s.iter().take_while(|c| c.is_ascii_digit()).count();
    let (mut fraction, mut scale) = (0u64, 1f64);
    for &c in &s[..digits] {
        // Go sets its overflow flag here and skips the remaining digits.
        if fraction > (DURATION_LIMIT - 1) / 10 {
            break;
        }
        let next = fraction * 10 + u64::from(c - b'0');
        if next > DURATION_LIMIT {
            break;
        }
        fraction = next;
        scale *= 10.0;
    }
    (fraction, scale, digits > 0, &s[digits..])
}

/// Nanoseconds per `unit`; `input` (the whole duration) names the error.
fn duration_unit(unit: &[u8], input: &str) -> Result<u64, String> {
    Ok(match unit {
        b"ns" => 1,
        b"us" => 1_000,
        // U+00B5 (micro sign) and U+03BC (Greek mu), as UTF-8.
        [0xc2, 0xb5, b's'] | [0xce, 0xbc, b's'] => 1_000,
        b"ms" => 1_000_000,
        b"s" => 1_000_000_000,
        b"m" => 60_000_000_000,
        b"h" => 3_600_000_000_000,
        other => {
            return Err(format!(
                "time: unknown unit {} in duration {}",
                time_quote(&String::from_utf8_lossy(other)),
                time_quote(input)
            ))
        }
    })
}

/// The `time` package's own quoting (it cannot use strconv): `"` and `\\`
/// escaped, every byte of a control or non-ASCII character as `\xNN`, the rest
/// (DEL too) as is.
fn time_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c < ' ' || !c.is_ascii() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("\\x{b:02x}"));
            }
        } else {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
    }
    out.push('"');
    out
}

/// Go's `strconv.Quote`.
pub use super::go_quote as quote;

pub use super::quantity::{quantity_is_zero, QUANTITY_FORMAT, QUANTITY_NUMERIC, QUANTITY_SUFFIX};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_take_go_literal_syntax() {
        let ok: &[(&str, i64)] = &[
            ("0", 0),
            ("10", 10),
            ("0x10", 16),
            ("0X1F", 31),
            ("010", 8),
            ("0b1", 1),
            ("0o7", 7),
            ("0O17", 15),
            ("1_000", 1000),
            ("0_7", 7),
            ("0x_1f", 31),
            ("-0x10", -16),
            ("+5", 5),
            ("-1", -1),
            ("9223372036854775807", i64::MAX),
            ("-9223372036854775808", i64::MIN),
        ];
        for (text, want) in ok {
            assert_eq!(parse_int(text), Ok(*want), "{text}");
        }
        let bad: &[(&str, NumError)] = &[
            ("", NumError::Syntax),
            ("0x", NumError::Syntax),
            ("0b", NumError::Syntax),
            ("08", NumError::Syntax),
            ("1__0", NumError::Syntax),
            ("_1", NumError::Syntax),
            ("1_", NumError::Syntax),
            ("+-5", NumError::Syntax),
            ("-", NumError::Syntax),
            ("1.0", NumError::Syntax),
            (" 1", NumError::Syntax),
            ("9223372036854775808", NumError::Range),
            ("-9223372036854775809", NumError::Range),
            // Go notices the overflow before the bad character.
            ("99999999999999999999x", NumError::Range),
        ];
        for (text, want) in bad {
            assert_eq!(parse_int(text), Err(*want), "{text}");
        }
    }

    #[test]
    fn uints_refuse_any_sign() {
        assert_eq!(parse_uint("0x10"), Ok(16));
        assert_eq!(parse_uint("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_uint("18446744073709551616"), Err(NumError::Range));
        assert_eq!(parse_uint("-1"), Err(NumError::Syntax));
        assert_eq!(parse_uint("+1"), Err(NumError::Syntax));
    }

    #[test]
    fn levels_are_decimal_and_fit_int32() {
        assert_eq!(parse_level("010"), Ok(10));
        assert_eq!(parse_level("2147483647"), Ok(i32::MAX as u32));
        assert_eq!(
            parse_level("2147483648").unwrap_err(),
            "strconv.ParseUint: parsing \"2147483648\": value out of range"
        );
        for bad in ["0x10", "-1", "+1", "1_0", ""] {
            assert_eq!(
                parse_level(bad).unwrap_err(),
                format!("strconv.ParseUint: parsing {bad:?}: invalid syntax")
            );
        }
    }

    #[test]
    fn floats_take_go_syntax() {
        let ok: &[(&str, f64)] = &[
            ("5", 5.0),
            ("1e-20", 1e-20),
            (".5", 0.5),
            ("5.", 5.0),
            ("+1.5", 1.5),
            ("-2", -2.0),
            ("1_000.5", 1000.5),
            ("1e1_0", 1e10),
            ("0x1p-2", 0.25),
            ("0x1.8p1", 3.0),
            ("-0X10P0", -16.0),
            ("1e-400", 0.0),
            ("inf", f64::INFINITY),
            ("+Inf", f64::INFINITY),
            ("-Infinity", f64::NEG_INFINITY),
        ];
        for (text, want) in ok {
            assert_eq!(parse_float(text), Ok(*want), "{text}");
        }
        assert!(parse_float("NaN").is_ok_and(f64::is_nan));
        assert!(parse_float("nan").is_ok_and(f64::is_nan));
        for bad in [
            "", "1e", "e5", ".", "0x10", "0x", "_1", "1_", "1_.5", "+nan", "infin", "1.2.3", "1f",
            " 1", "0x1g",
        ] {
            assert_eq!(parse_float(bad), Err(NumError::Syntax), "{bad}");
        }
        assert_eq!(parse_float("1e400"), Err(NumError::Range));
        assert_eq!(parse_float("-1e400"), Err(NumError::Range));
        assert_eq!(parse_float("0x1p2000"), Err(NumError::Range));
    }

    #[test]
    fn durations_are_go_durations_and_may_be_negative() {
        const S: i64 = 1_000_000_000;
        let ok: &[(&str, i64)] = &[
            ("0", 0),
            ("-0", 0),
            ("+0", 0),
            ("15s", 15 * S),
            ("-1s", -S),
            ("+1s", S),
            ("1m30s", 90 * S),
            ("300ms", 300_000_000),
            ("1.5h", 5400 * S),
            ("-1.5h", -5400 * S),
            ("2h45m", 9900 * S),
            ("10us", 10_000),
            ("10µs", 10_000),
            ("10μs", 10_000),
            ("7ns", 7),
            (".5s", S / 2),
            ("1.s", S),
            ("1.0000000001s", S),
            ("0.0000000005s", 0),
            ("1h1h", 7200 * S),
            ("2562047h47m16.854775807s", i64::MAX),
            ("-2562047h47m16.854775808s", i64::MIN),
        ];
        for (text, want) in ok {
            assert_eq!(parse_duration(text), Ok(*want), "{text}");
        }
        for bad in [
            "",
            "-",
            "+",
            "15",
            "1x",
            "s",
            ".",
            ".s",
            "1.2.3s",
            "1 s",
            "1min",
            "1e3s",
            "- 1s",
            "2562047h47m16.854775808s",
            "9223372036854775808ns",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad} should be rejected");
        }
        assert_eq!(
            parse_duration("15").unwrap_err(),
            "time: missing unit in duration \"15\""
        );
    }

    #[test]
    fn quantities_follow_resource_parse_quantity() {
        for zero in [
            "0", "0Mi", "0.000", "-0", "+0", "000", "0e3", "0.0Gi", ".", "-",
        ] {
            assert_eq!(quantity_is_zero(zero), Ok(true), "{zero}");
        }
        for nonzero in [
            "1", "1Mi", "1m", "0.001", "1e3", "1E-3", "-1", "1.G", "5n", "2Ei",
        ] {
            assert_eq!(quantity_is_zero(nonzero), Ok(false), "{nonzero}");
        }
        for bad in ["", "abc", "1Gb", "1 Mi", "1.2.3"] {
            assert_eq!(quantity_is_zero(bad), Err(QUANTITY_FORMAT), "{bad}");
        }
        for bad in ["1k5", "1e", "1KiB", "1mi", "1e+"] {
            assert!(quantity_is_zero(bad).is_err(), "{bad}");
        }
        assert_eq!(quantity_is_zero("1k5"), Err(QUANTITY_SUFFIX));
    }

    #[test]
    fn a_quantity_without_digits_fails_where_go_takes_its_slow_path() {
        // Found by tests/properties_go.rs ("Pi" was taken as zero; Go refuses it).
        for bad in [
            "Pi",
            "Ei",
            "+.Pi",
            "-Ei",
            "e-10",
            ".e-10",
            "-E-10",
            "e4294967286",
        ] {
            assert_eq!(quantity_is_zero(bad), Err(QUANTITY_NUMERIC), "{bad}");
        }
        for zero in ["Ti", "n", "+.Ki", "0Pi", ".0Ei", "e-9", "E5"] {
            assert_eq!(quantity_is_zero(zero), Ok(true), "{zero}");
        }
    }

    #[test]
    fn duration_errors_quote_as_the_time_package_does() {
        // Found by tests/properties_go.rs: `time` escapes each byte of a
        // non-ASCII character, where strconv.Quote would print it.
        assert_eq!(
            parse_duration("¡").unwrap_err(),
            r#"time: invalid duration "\xc2\xa1""#
        );
        assert_eq!(
            parse_duration("1é").unwrap_err(),
            r#"time: unknown unit "\xc3\xa9" in duration "1\xc3\xa9""#
        );
        assert_eq!(
            parse_duration("\"\u{7f}\t").unwrap_err(),
            "time: invalid duration \"\\\"\u{7f}\\x09\""
        );
    }

    #[test]
    fn no_parser_panics_on_multibyte_text_anywhere() {
        let pieces: Vec<&str> = std::iter::once("")
            .chain(
                "0 1 - + . _ x e p 0x 0b 0o 1.5 h m s ms µs μs ns € é \u{10FFFF} ℹ Ki inf NaN"
                    .split(' '),
            )
            .collect();
        for a in &pieces {
            for b in &pieces {
                for c in &pieces {
                    let text = format!("{a}{b}{c}");
                    let _ = parse_int(&text);
                    let _ = parse_uint(&text);
                    let _ = parse_level(&text);
                    let _ = parse_float(&text);
                    let _ = parse_bool(&text);
                    let _ = parse_duration(&text);
                    let _ = quantity_is_zero(&text);
                    let _ = quote(&text);
                }
            }
        }
    }
}
