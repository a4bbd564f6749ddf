//! The Prometheus text exposition as Go's `expfmt` writes it.

use std::fmt::Write as _;

use prometheus::proto::{MetricFamily, MetricType};

use crate::gofmt::go_float_g;

/// The Prometheus text format (0.0.4) as Go's expfmt writes it. The prometheus
/// crate's encoder prints numbers the Rust way (`le="0.00000001"`,
/// `1000000`); Go prints them with `strconv.FormatFloat(v, 'g', -1, 64)`
/// (`le="1e-08"`, `1e+06`), and dashboards and recording rules match on the
/// `le` strings.
pub fn encode_text(families: &[MetricFamily]) -> String {
    let mut out = String::new();
    for family in families {
        let name = family.name();
        if !family.help().is_empty() {
            let _ = write!(out, "# HELP {name} ");
            escape_into(&mut out, family.help(), false);
            out.push('\n');
        }
        let kind = match family.get_field_type() {
            MetricType::COUNTER => "counter",
            MetricType::GAUGE => "gauge",
            MetricType::HISTOGRAM => "histogram",
            MetricType::SUMMARY => "summary",
            MetricType::UNTYPED => "untyped",
        };
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for m in family.get_metric() {
            let mut sample = |suffix: &str, extra: Option<(&str, f64)>, value: f64| {
                write_sample(&mut out, name, suffix, m, extra, value)
            };
            match family.get_field_type() {
                MetricType::COUNTER => sample("", None, m.get_counter().get_value()),
                MetricType::GAUGE => sample("", None, m.get_gauge().get_value()),
                // No collector of this crate makes untyped metrics, and the
                // prometheus crate has no stable accessor for their value.
                MetricType::UNTYPED => {}
                MetricType::HISTOGRAM => {
                    let h = m.get_histogram();
                    let count = h.get_sample_count() as f64;
                    let buckets = h.get_bucket();
                    for b in buckets {
                        let n = b.cumulative_count() as f64;
                        sample("_bucket", Some(("le", b.upper_bound())), n);
                    }
                    if !buckets.iter().any(|b| b.upper_bound() == f64::INFINITY) {
                        sample("_bucket", Some(("le", f64::INFINITY)), count);
                    }
                    sample("_sum", None, h.get_sample_sum());
                    sample("_count", None, count);
                }
                MetricType::SUMMARY => {
                    let s = m.get_summary();
                    for q in s.get_quantile() {
                        sample("", Some(("quantile", q.quantile())), q.value());
                    }
                    sample("_sum", None, s.sample_sum());
                    sample("_count", None, s.sample_count() as f64);
                }
            }
        }
    }
    out
}

/// `name_suffix{labels,extra="v"} value [timestamp]`, numbers as Go's writeFloat.
fn write_sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    m: &prometheus::proto::Metric,
    extra: Option<(&str, f64)>,
    value: f64,
) {
    let _ = write!(out, "{name}{suffix}");
    let labels = m.get_label();
    if !labels.is_empty() || extra.is_some() {
        let mut separator = '{';
        for lp in labels {
            let _ = write!(out, "{separator}{}=\"", lp.name());
            escape_into(out, lp.value(), true);
            out.push('"');
            separator = ',';
        }
        if let Some((label, bound)) = extra {
            let _ = write!(out, "{separator}{label}=\"{}\"", go_sample_float(bound));
        }
        out.push('}');
    }
    let _ = write!(out, " {}", go_sample_float(value));
    if m.timestamp_ms() != 0 {
        let _ = write!(out, " {}", m.timestamp_ms());
    }
    out.push('\n');
}

/// expfmt's escaping: `\\` and newline always, `"` in label values.
fn escape_into(out: &mut String, s: &str, quotes: bool) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quotes => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

/// expfmt's writeFloat: `0` for both zeros, else [`go_float_g`].
fn go_sample_float(f: f64) -> String {
    if f == 0.0 {
        "0".to_string()
    } else {
        go_float_g(f)
    }
}
