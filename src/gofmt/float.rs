//! Go's float formatting: `strconv.FormatFloat` in its `'g'` and `'e'` forms
//! (Prometheus' text exposition) and `encoding/json`'s floats (klog values).

/// Go's `strconv.FormatFloat(f, 'g', -1, 64)`: the shortest digits that read
/// back as `f`, in exponent form when the exponent is below -4 or from 6 on
/// (`1e-08`, `0.0001`, `120`, `1.234567e+06`); `NaN`, `+Inf`, `-Inf`.
pub fn go_float_g(f: f64) -> String {
    if !f.is_finite() {
        return non_finite(f).to_string();
    }
    let (_, exp) = shortest_digits(f);
    if !(-4..6).contains(&exp) {
        go_float_e(f)
    } else {
        // Rust's Display is the same shortest digits, never in exponent form.
        f.to_string()
    }
}

/// Go's `strconv.FormatFloat(f, 'e', -1, 64)`: shortest digits, exponent with
/// a sign and at least two digits (`1e-08`, `2.5e+07`).
pub fn go_float_e(f: f64) -> String {
    if !f.is_finite() {
        return non_finite(f).to_string();
    }
    let (mantissa, exp) = shortest_digits(f);
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exp.unsigned_abs())
}

fn non_finite(f: f64) -> &'static str {
    if f.is_nan() {
        "NaN"
    } else if f > 0.0 {
        "+Inf"
    } else {
        "-Inf"
    }
}

/// Rust's shortest round-trip digits of a finite `f` as `d.ddd` and the decimal exponent.
fn shortest_digits(f: f64) -> (String, i32) {
    let text = format!("{f:e}");
    match text.split_once('e') {
        Some((mantissa, exp)) => (mantissa.to_string(), exp.parse().unwrap_or(0)),
        None => (text, 0),
    }
}

/// A float as Go's encoding/json writes it (klog's text values): plain
/// decimals, exponent form below 1e-6 and from 1e21 on (`1e-7`, `1e+21`).
pub fn go_json_float(f: f64) -> String {
    if !f.is_finite() {
        // encoding/json refuses these; klog prints its internal error instead.
        let shown = non_finite(f);
        return format!("\"<internal error: json: unsupported value: {shown}>\"");
    }
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        let e = go_float_e(f);
        // encoding/json's clean-up of "e-07" to "e-7".
        match e.split_once("e-0") {
            Some((mantissa, digit)) if digit.len() == 1 => format!("{mantissa}e-{digit}"),
            _ => e,
        }
    } else {
        f.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_formatted_like_go_strconv_g() {
        // Left: input; right: Go's strconv.FormatFloat(v, 'g', -1, 64) of it.
        for (value, go) in [
            (1e-8, "1e-08"),
            (1e-7, "1e-07"),
            (1e-5, "1e-05"),
            (1e-4, "0.0001"),
            (0.001, "0.001"),
            (0.1, "0.1"),
            (2.5, "2.5"),
            (10.0, "10"),
            (120.0, "120"),
            (600.0, "600"),
            (1800.0, "1800"),
            (100_000.0, "100000"),
            (999_999.0, "999999"),
            (1e6, "1e+06"),
            (1_234_567.0, "1.234567e+06"),
            (1e21, "1e+21"),
            (1e20, "1e+20"),
            (1.7326e9, "1.7326e+09"),
            (123_456.5, "123456.5"),
            (0.00012345, "0.00012345"),
            (3.0e-5, "3e-05"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
            (-2.5e7, "-2.5e+07"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(go_float_g(value), go, "{value:e}");
        }
    }
}
