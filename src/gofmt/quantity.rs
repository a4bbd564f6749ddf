//! Kubernetes' `resource.ParseQuantity`, syntax and zero-ness only, as
//! apimachinery v0.36 words its errors (the flags that take a size).

/// Kubernetes' quantity syntax error (`resource.ErrFormatWrong`).
pub const QUANTITY_FORMAT: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
/// Kubernetes' unknown-suffix error (`resource.ErrSuffix`).
pub const QUANTITY_SUFFIX: &str = "unable to parse quantity's suffix";
/// Kubernetes' numeric error (`resource.ErrNumeric`).
pub const QUANTITY_NUMERIC: &str = "unable to parse numeric part of quantity";

/// A quantity suffix as (binary?, power of 2 or of 10).
fn quantity_suffix(suffix: &str) -> Result<(bool, i32), &'static str> {
    Ok(match suffix {
        "Ki" => (true, 10),
        "Mi" => (true, 20),
        "Gi" => (true, 30),
        "Ti" => (true, 40),
        "Pi" => (true, 50),
        "Ei" => (true, 60),
        "n" => (false, -9),
        "u" => (false, -6),
        "m" => (false, -3),
        "" => (false, 0),
        "k" => (false, 3),
        "M" => (false, 6),
        "G" => (false, 9),
        "T" => (false, 12),
        "P" => (false, 15),
        "E" => (false, 18),
        _ if suffix.len() > 1 && matches!(suffix.as_bytes()[0], b'e' | b'E') => {
            // Go's `strconv.ParseInt(s, 10, 64)`, which Rust's parser matches; Go keeps
            // the exponent as an int32.
            match suffix[1..].parse::<i64>() {
                Ok(e) => (false, e as i32),
                Err(_) => return Err(QUANTITY_SUFFIX),
            }
        }
        _ => return Err(QUANTITY_SUFFIX),
    })
}

/// `resource.ParseQuantity`, reduced to what the logging buffer flags need: whether
/// the text is a quantity, and whether it is zero (non-zero amounts never round to 0).
pub fn quantity_is_zero(s: &str) -> Result<bool, &'static str> {
    let b = s.as_bytes();
    if b.is_empty() {
        return Err(QUANTITY_FORMAT);
    }
    let mut pos = 0;
    if matches!(b[0], b'+' | b'-') {
        pos += 1;
    }
    // Go returns early ("0") when the text is only a sign and zeros.
    while pos < b.len() && b[pos] == b'0' {
        pos += 1;
    }
    if pos == b.len() {
        return Ok(true);
    }
    let digits = |from: usize| from + b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let num_end = digits(pos);
    let mut zero = b[pos..num_end].iter().all(|c| *c == b'0');
    // Any digit at all, leading zeros included (`+.` and `.` have none).
    let mut has_digit = b[..num_end].iter().any(u8::is_ascii_digit);
    pos = num_end;
    if pos == b.len() {
        return Ok(zero);
    }
    if b[pos] == b'.' {
        let denom_end = digits(pos + 1);
        zero &= b[pos + 1..denom_end].iter().all(|c| *c == b'0');
        has_digit |= denom_end > pos + 1;
        pos = denom_end;
        if pos == b.len() {
            return Ok(zero);
        }
    }
    let suffix_start = pos;
    while pos < b.len() && b"eEinumkKMGTP".contains(&b[pos]) {
        pos += 1;
    }
    if pos < b.len() && matches!(b[pos], b'-' | b'+') {
        pos += 1;
    }
    if digits(pos) != b.len() {
        return Err(QUANTITY_FORMAT);
    }
    let (binary, exponent) = quantity_suffix(&s[suffix_start..])?;
    // Without digits, Go's fast path still yields 0, but its slow path (a
    // binary exponent past 2^43, or a decimal scale below nano) parses the
    // empty number and fails.
    let slow_path = if binary {
        exponent * 3 / 10 > 13
    } else {
        exponent < -9
    };
    if !has_digit && slow_path {
        return Err(QUANTITY_NUMERIC);
    }
    Ok(zero)
}
