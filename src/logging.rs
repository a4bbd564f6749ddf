//! Log lines shaped like klog's, the logging of the Go sidecars, so log
//! pipelines and dashboards built for upstream parse ours unchanged.
//!
//! Text (the default) is klog's structured text format:
//!
//! ```text
//! I1126 08:04:35.778303       1 main.rs:40] "Version" version="0.1.0"
//! ```
//!
//! JSON (`--logging-format=json`) is component-base's zap encoding:
//!
//! ```text
//! {"ts":1732608275778.303,"caller":"src/main.rs:40","msg":"Version","v":0,"version":"0.1.0"}
//! ```
//!
//! Span fields (`va`, `lane`, ...) are written as key/value pairs like the
//! values of a Go `logger.WithValues`; a field called `error` becomes klog's `err`.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::Config;
use crate::gofmt::{go_json_float, go_quote_into};

/// Target prefix of this crate's events (library and binary).
const OWN_TARGET: &str = "csi_attacher";

const ERR_KEY: &str = "err";

/// Installs the process-wide subscriber on stderr: `RUST_LOG` when set, else
/// the `--v` mapping of [`directives`].
pub fn init(config: &Config) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(directives(config.v)));
    // `json` selects JSON; anything else (refused right after this) is text.
    let layer = KlogLayer::new(config.logging_format == "json", std::io::stderr);
    // Fails only when a subscriber is already installed; the first one keeps logging.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(layer)
        .try_init();
}

/// The filter for `--v`: this crate logs info at 0-1, debug at 2-4, trace at 5+.
/// Everything else (the Kubernetes client, hyper, h2, tower, tonic, rustls) stays
/// at info below 6, where client-go starts logging requests: debug at 6-7, trace at 8+.
pub fn directives(v: u32) -> String {
    let own = match v {
        0 | 1 => "info",
        2..=4 => "debug",
        _ => "trace",
    };
    let others = match v {
        0..=5 => "info",
        6 | 7 => "debug",
        _ => "trace",
    };
    format!("{others},{OWN_TARGET}={own}")
}

/// The lowest `--v` at which [`directives`] lets an event through: the `v` of
/// a JSON entry. `None` for errors, which zapr writes without `v`.
fn verbosity(level: &Level, target: &str) -> Option<u8> {
    let own = target.starts_with(OWN_TARGET);
    match *level {
        Level::ERROR => None,
        Level::WARN | Level::INFO => Some(0),
        Level::DEBUG => Some(if own { 2 } else { 6 }),
        _ => Some(if own { 5 } else { 8 }),
    }
}

/// A field value, typed as klog and zap encode them: numbers and booleans
/// bare, everything else (Display, Debug, errors) as a string.
#[derive(Clone, Debug, PartialEq)]
enum Value {
    Str(String),
    Int(i128),
    Float(f64),
    Bool(bool),
}

type Fields = Vec<(&'static str, Value)>;

/// The fields of a span, kept in its extensions for the events inside it.
struct SpanFields(Fields);

/// Collects fields; the message and the error are kept apart because both
/// formats put them in fixed places.
#[derive(Default)]
struct Collector {
    message: String,
    err: Option<String>,
    fields: Fields,
    /// Events bridged from the `log` crate carry their metadata as `log.*` fields.
    skip_log_fields: bool,
}

impl Collector {
    fn put(&mut self, field: &Field, value: Value) {
        let name = field.name();
        match name {
            "message" => self.message = text_of(value),
            "error" | ERR_KEY => self.err = Some(text_of(value)),
            _ if self.skip_log_fields && name.starts_with("log.") => {}
            _ => self.fields.push((name, value)),
        }
    }
}

/// A value as a plain string (an error or message recorded as a number).
fn text_of(value: Value) -> String {
    match value {
        Value::Str(s) => s,
        Value::Int(i) => i.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Bool(b) => b.to_string(),
    }
}

impl Visit for Collector {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::Float(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::Int(value.into()));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::Int(value.into()));
    }
    fn record_i128(&mut self, field: &Field, value: i128) {
        self.put(field, Value::Int(value));
    }
    fn record_u128(&mut self, field: &Field, value: u128) {
        let value =
            i128::try_from(value).map_or_else(|_| Value::Str(value.to_string()), Value::Int);
        self.put(field, value);
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::Str(value.to_string()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, Value::Str(format!("{value:?}")));
    }
}

/// Writes every event as one klog-shaped line.
pub struct KlogLayer<W> {
    /// component-base JSON instead of klog text.
    json: bool,
    make_writer: W,
    clock: fn() -> SystemTime,
    pid: u32,
}

impl<W> KlogLayer<W> {
    /// Lines (JSON if `json`) to `make_writer`, stamped with the wall clock and this process's id.
    pub fn new(json: bool, make_writer: W) -> Self {
        Self {
            json,
            make_writer,
            clock: SystemTime::now,
            pid: std::process::id(),
        }
    }
}

#[cfg(test)]
impl<W> KlogLayer<W> {
    /// The same layer with another clock and process id (for reproducible output).
    pub fn with_clock_and_pid(mut self, clock: fn() -> SystemTime, pid: u32) -> Self {
        self.clock = clock;
        self.pid = pid;
        self
    }
}

/// Everything a line needs, whatever the format.
struct Entry<'a> {
    meta: &'a Metadata<'a>,
    /// Since the epoch; klog never logs earlier times.
    now: Duration,
    event: &'a Collector,
    span_fields: &'a [(&'static str, Value)],
}

impl<S, W> Layer<S> for KlogLayer<W>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + 'static,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let fields = span_fields(|c| attrs.record(c));
        span.extensions_mut().insert(SpanFields(fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        let Some(SpanFields(fields)) = extensions.get_mut::<SpanFields>() else {
            return;
        };
        for (key, value) in span_fields(|c| values.record(c)) {
            match fields.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => slot.1 = value,
                None => fields.push((key, value)),
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        let mut collector = Collector {
            skip_log_fields: normalized.is_some(),
            ..Collector::default()
        };
        event.record(&mut collector);
        let mut span_fields = Fields::new();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(SpanFields(fields)) = span.extensions().get::<SpanFields>() {
                    span_fields.extend(fields.iter().cloned());
                }
            }
        }
        let entry = Entry {
            meta,
            now: (self.clock)()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default(),
            event: &collector,
            span_fields: &span_fields,
        };
        let mut line = String::new();
        if self.json {
            write_json(&mut line, &entry);
        } else {
            write_text(&mut line, &entry, self.pid);
        }
        // One write per line, so lines of concurrent writers do not interleave.
        let _ = self
            .make_writer
            .make_writer_for(meta)
            .write_all(line.as_bytes());
    }
}

/// A span's fields as `record` gives them, its error first as `err`.
fn span_fields(record: impl FnOnce(&mut Collector)) -> Fields {
    let mut collector = Collector::default();
    record(&mut collector);
    let err = collector.err.map(|e| (ERR_KEY, Value::Str(e)));
    err.into_iter().chain(collector.fields).collect()
}

/// `Lmmdd hh:mm:ss.uuuuuu threadid file:line] "msg" k=v...` (klog's printS and
/// buffer.FormatHeader). The time is UTC: klog uses local time, and the images
/// both run in have no zone data, which makes Go's local time UTC.
fn write_text(out: &mut String, e: &Entry<'_>, pid: u32) {
    let severity = match *e.meta.level() {
        Level::ERROR => 'E',
        Level::WARN => 'W',
        _ => 'I',
    };
    let secs = i64::try_from(e.now.as_secs()).unwrap_or(i64::MAX);
    let civil = jiff::Timestamp::new(secs, 0)
        .map(|ts| jiff::tz::Offset::UTC.to_datetime(ts))
        .unwrap_or_default();
    // klog's "???:1" when the caller is unknown; only the file name, like runtime.Caller's trimmed path.
    let (file, line) = match e.meta.file() {
        Some(path) => (
            path.rsplit('/').next().unwrap_or(path),
            e.meta.line().unwrap_or(0),
        ),
        None => ("???", 1),
    };
    let _ = write!(
        out,
        "{severity}{:02}{:02} {:02}:{:02}:{:02}.{:06} {:>7} {file}:{line}] ",
        civil.month(),
        civil.day(),
        civil.hour(),
        civil.minute(),
        civil.second(),
        e.now.subsec_micros(),
        // klog writes the low 7 digits, space padded.
        pid % 10_000_000,
    );
    go_quote_into(out, &e.event.message);
    let err = e.event.err.clone().map(|err| (ERR_KEY, Value::Str(err)));
    let all = err
        .iter()
        .chain(e.span_fields)
        .chain(&e.event.fields)
        .map(|(k, v)| (*k, v));
    for (key, value) in dedup_last_wins(all) {
        out.push(' ');
        out.push_str(key);
        write_text_value(out, value);
    }
    out.push('\n');
}

/// klog's FormatKVs: a later pair with the key of an earlier one replaces it
/// (and moves to the later place) unless both are identical, then the first stays.
fn dedup_last_wins<'a>(
    pairs: impl Iterator<Item = (&'static str, &'a Value)>,
) -> Vec<(&'static str, &'a Value)> {
    let mut kept: Vec<(&'static str, &'a Value)> = Vec::new();
    for (key, value) in pairs {
        match kept.iter().position(|(k, _)| *k == key) {
            Some(i) if kept[i].1 == value => {}
            Some(i) => {
                kept.remove(i);
                kept.push((key, value));
            }
            None => kept.push((key, value)),
        }
    }
    kept
}

/// `=value` as klog writes it: strings quoted (multi-line ones as an indented
/// block), numbers and booleans as JSON.
fn write_text_value(out: &mut String, value: &Value) {
    out.push('=');
    match value {
        Value::Str(s) => write_klog_string(out, s),
        Value::Float(f) => out.push_str(&go_json_float(*f)),
        other => out.push_str(&text_of(other.clone())),
    }
}

/// klog's writeStringValue: one line → `"quoted"`; several → `<` newline,
/// each line tab-indented and ended by a newline, then ` >`.
fn write_klog_string(out: &mut String, s: &str) {
    if !s.contains('\n') {
        return go_quote_into(out, s);
    }
    out.push_str("<\n");
    for line in s.split_inclusive('\n') {
        out.push('\t');
        out.push_str(line);
    }
    if !s.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(" >");
}

/// `{"ts":…,"caller":…,"msg":…,<span fields>,"v":…,<fields>,"err":…}` with
/// component-base's zap encoder: `ts` in milliseconds since the epoch, the
/// caller as the last two path elements, no level (errors have no `v`).
fn write_json(out: &mut String, e: &Entry<'_>) {
    // Go computes float64(UnixNano()) / 1e6.
    let unix_nanos = i64::try_from(e.now.as_nanos()).unwrap_or(i64::MAX);
    let _ = write!(out, "{{\"ts\":{}", unix_nanos as f64 / 1e6);
    if let Some(path) = e.meta.file() {
        out.push_str(",\"caller\":\"");
        zap_escape_into(out, trimmed_path(path));
        let _ = write!(out, ":{}\"", e.meta.line().unwrap_or(0));
    }
    out.push_str(",\"msg\":\"");
    zap_escape_into(out, &e.event.message);
    out.push('"');
    for (key, value) in e.span_fields {
        write_json_pair(out, key, value);
    }
    if let Some(v) = verbosity(e.meta.level(), e.meta.target()) {
        let _ = write!(out, ",\"v\":{v}");
    }
    for (key, value) in &e.event.fields {
        // zap would repeat a span's pair that the event logs again; an identical
        // repeat says nothing, and duplicate keys trip strict JSON readers.
        if !e.span_fields.iter().any(|(k, v)| k == key && v == value) {
            write_json_pair(out, key, value);
        }
    }
    if let Some(err) = &e.event.err {
        write_json_pair(out, ERR_KEY, &Value::Str(err.clone()));
    }
    out.push_str("}\n");
}

/// zap's ShortCallerEncoder: everything after the second-to-last `/`.
fn trimmed_path(path: &str) -> &str {
    path.rmatch_indices('/')
        .nth(1)
        .map_or(path, |(before, _)| &path[before + 1..])
}

fn write_json_pair(out: &mut String, key: &str, value: &Value) {
    out.push_str(",\"");
    zap_escape_into(out, key);
    out.push_str("\":");
    match value {
        Value::Str(s) => {
            out.push('"');
            zap_escape_into(out, s);
            out.push('"');
        }
        // zap writes non-finite floats as strings; the rest with strconv's 'f', -1.
        Value::Float(f) if f.is_nan() => out.push_str("\"NaN\""),
        Value::Float(f) if f.is_infinite() => {
            out.push_str(if *f > 0.0 { "\"+Inf\"" } else { "\"-Inf\"" })
        }
        other => out.push_str(&text_of(other.clone())),
    }
}

/// zap's JSON string escaping: `\\`, `\"`, `\n`, `\r`, `\t`, other bytes below
/// 0x20 as `\u00XX`; everything else (also `<`, `>`, `&`, DEL) as it is.
fn zap_escape_into(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c < ' ' => {
                let _ = write!(out, "\\u00{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// Lines written by a layer under test.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    /// 2024-11-26 08:04:35.778303123 UTC.
    fn fixed_clock() -> SystemTime {
        UNIX_EPOCH + Duration::new(1_732_608_275, 778_303_123)
    }

    /// What `log` writes (JSON if `json`), everything enabled unless `filter` says otherwise.
    fn capture(json: bool, filter: Option<&str>, log: impl FnOnce()) -> String {
        let out = Captured::default();
        let layer = KlogLayer::new(json, out.clone()).with_clock_and_pid(fixed_clock, 2790);
        let filter = EnvFilter::new(filter.unwrap_or("trace"));
        let subscriber = tracing_subscriber::registry().with(filter).with(layer);
        tracing::subscriber::with_default(subscriber, log);
        let bytes = out.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    fn text(log: impl FnOnce()) -> String {
        capture(false, None, log)
    }

    fn json(log: impl FnOnce()) -> String {
        capture(true, None, log)
    }

    const HEADER: &str = "1126 08:04:35.778303    2790 logging.rs";
    const TS: &str = r#"{"ts":1732608275778.3032,"caller":"src/logging.rs"#;

    #[test]
    fn text_info_with_string_number_and_bool_fields() {
        let mut line = 0;
        let out = text(|| {
            line = line!() + 1;
            tracing::info!(
                version = "v4.12.0",
                workers = 10,
                delta = -3,
                ratio = 0.5,
                ready = true,
                "Version"
            );
        });
        assert_eq!(
            out,
            format!("I{HEADER}:{line}] \"Version\" version=\"v4.12.0\" workers=10 delta=-3 ratio=0.5 ready=true\n")
        );
    }

    #[test]
    fn text_errors_put_err_first_with_severity_e() {
        let mut line = 0;
        let out = text(|| {
            let span = tracing::info_span!("sync", va = "va-1");
            let _entered = span.enter();
            let err = std::io::Error::other("rpc error: code = \"Internal\"");
            line = line!() + 1;
            tracing::error!(node = "n1", error = %err, "Failed to attach");
        });
        assert_eq!(
            out,
            format!("E{HEADER}:{line}] \"Failed to attach\" err=\"rpc error: code = \\\"Internal\\\"\" va=\"va-1\" node=\"n1\"\n")
        );
    }

    #[test]
    fn text_warnings_have_severity_w_and_debug_and_trace_are_info() {
        let out = text(|| {
            tracing::warn!("w");
            tracing::debug!("d");
            tracing::trace!("t");
        });
        let letters: Vec<char> = out.lines().filter_map(|l| l.chars().next()).collect();
        assert_eq!(letters, ['W', 'I', 'I'], "{out}");
    }

    #[test]
    fn text_quotes_messages_and_values_like_go() {
        let mut line = 0;
        let out = text(|| {
            line = line!() + 1;
            tracing::info!(path = "C:\\dir", "say \"hi\"\n\tcafé\u{a0}😀\u{7f}\u{1}");
        });
        assert_eq!(
            out,
            format!("I{HEADER}:{line}] \"say \\\"hi\\\"\\n\\tcafé\\u00a0😀\\x7f\\x01\" path=\"C:\\\\dir\"\n")
        );
    }

    #[test]
    fn text_multi_line_values_are_indented_blocks() {
        let mut line = 0;
        let out = text(|| {
            line = line!() + 1;
            tracing::info!(
                response = "line 1\nline 2",
                trailing = "only\n",
                "GRPC response"
            );
        });
        assert_eq!(
            out,
            format!("I{HEADER}:{line}] \"GRPC response\" response=<\n\tline 1\n\tline 2\n > trailing=<\n\tonly\n >\n")
        );
    }

    #[test]
    fn text_has_span_fields_from_the_outermost_in_and_later_values_win() {
        let mut line = 0;
        let out = text(|| {
            let outer = tracing::info_span!("reconcile", pass = 3, node = "n0");
            let _outer = outer.enter();
            let inner = tracing::info_span!(
                "sync",
                va = "va-1",
                lane = "attach",
                attempt = tracing::field::Empty
            );
            let _inner = inner.enter();
            inner.record("attempt", 2);
            line = line!() + 1;
            tracing::debug!(node = "n1", pass = 3, "Attaching");
        });
        // klog's de-duplication: `node` differs and moves to the end, the identical `pass` stays first.
        assert_eq!(
            out,
            format!("I{HEADER}:{line}] \"Attaching\" pass=3 va=\"va-1\" lane=\"attach\" attempt=2 node=\"n1\"\n")
        );
    }

    #[test]
    fn text_floats_are_written_as_go_json() {
        let out =
            text(|| tracing::info!(small = 1.5e-7, big = 1e21, mid = 1e20, nan = f64::NAN, "f"));
        assert!(
            out.ends_with("\"f\" small=1.5e-7 big=1e+21 mid=100000000000000000000 nan=\"<internal error: json: unsupported value: NaN>\"\n"),
            "{out}"
        );
    }

    #[test]
    fn json_info_has_ts_caller_msg_v_then_fields() {
        let mut line = 0;
        let out = json(|| {
            line = line!() + 1;
            tracing::info!(
                version = "v4.12.0",
                workers = 10,
                ratio = 0.5,
                ready = true,
                "Version"
            );
        });
        assert_eq!(
            out,
            format!("{TS}:{line}\",\"msg\":\"Version\",\"v\":0,\"version\":\"v4.12.0\",\"workers\":10,\"ratio\":0.5,\"ready\":true}}\n")
        );
    }

    #[test]
    fn json_errors_have_no_v_and_err_last_after_span_fields() {
        let mut line = 0;
        let out = json(|| {
            let span = tracing::info_span!("sync", va = "va-1", lane = "attach");
            let _entered = span.enter();
            let err = std::io::Error::other("boom");
            line = line!() + 1;
            tracing::error!(error = %err, node = "n1", "Failed to attach");
        });
        assert_eq!(
            out,
            format!("{TS}:{line}\",\"msg\":\"Failed to attach\",\"va\":\"va-1\",\"lane\":\"attach\",\"node\":\"n1\",\"err\":\"boom\"}}\n")
        );
    }

    #[test]
    fn json_span_fields_come_before_v() {
        let out = json(|| {
            let span = tracing::info_span!("sync", va = "va-1");
            let _entered = span.enter();
            tracing::debug!(node = "n1", "Attaching");
        });
        assert!(
            out.contains(r#""msg":"Attaching","va":"va-1","v":2,"node":"n1"}"#),
            "{out}"
        );
    }

    #[test]
    fn json_drops_an_event_pair_identical_to_a_span_pair_only() {
        let out = json(|| {
            let span = tracing::info_span!("sync", va = "va-1", lane = "attach");
            let _entered = span.enter();
            tracing::debug!(va = "va-1", lane = "detach", "Attached");
        });
        assert!(
            out.contains(r#""msg":"Attached","va":"va-1","lane":"attach","v":2,"lane":"detach"}"#),
            "{out}"
        );
    }

    #[test]
    fn json_v_is_the_lowest_flag_value_that_shows_the_entry() {
        let out = json(|| {
            tracing::warn!("warn");
            tracing::info!("info");
            tracing::debug!("debug");
            tracing::trace!("trace");
            tracing::debug!(target: "kube_client::client", "client debug");
            tracing::trace!(target: "hyper::proto", "client trace");
            tracing::error!("error");
        });
        let v: Vec<Option<u64>> = out
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["v"].as_u64())
            .collect();
        assert_eq!(
            v,
            [Some(0), Some(0), Some(2), Some(5), Some(6), Some(8), None],
            "{out}"
        );
    }

    #[test]
    fn json_escapes_like_zap() {
        let out = json(|| tracing::info!(value = "<a&b>\u{8}\u{7f}é", "say \"hi\"\n\t\\"));
        assert!(
            out.contains(r#""msg":"say \"hi\"\n\t\\","v":0,"value":"<a&b>\u0008"#),
            "{out}"
        );
        assert!(out.contains("\u{7f}é\"}"), "{out}");
        // Whatever the content, each entry is one line of valid JSON.
        assert!(
            serde_json::from_str::<serde_json::Value>(out.trim_end()).is_ok(),
            "{out}"
        );
    }

    #[test]
    fn json_caller_keeps_the_last_two_path_elements() {
        assert_eq!(
            trimmed_path("src/controller/attach.rs"),
            "controller/attach.rs"
        );
        assert_eq!(trimmed_path("src/main.rs"), "src/main.rs");
        assert_eq!(trimmed_path("main.rs"), "main.rs");
    }

    #[test]
    fn verbosity_maps_to_levels_and_keeps_clients_quiet_below_6() {
        assert_eq!(directives(0), "info,csi_attacher=info");
        assert_eq!(directives(2), "info,csi_attacher=debug");
        assert_eq!(directives(5), "info,csi_attacher=trace");
        assert_eq!(directives(6), "debug,csi_attacher=trace");
        assert_eq!(directives(8), "trace,csi_attacher=trace");
        let log = || {
            tracing::debug!("ours");
            tracing::debug!(target: "kube_client::client", "GET /api");
            tracing::info!(target: "hyper_util::client", "client info");
        };
        let at_2 = capture(false, Some(&directives(2)), log);
        assert!(
            at_2.contains("\"ours\"") && at_2.contains("\"client info\""),
            "{at_2}"
        );
        assert!(!at_2.contains("GET /api"), "{at_2}");
        let at_6 = capture(false, Some(&directives(6)), log);
        assert!(at_6.contains("GET /api"), "{at_6}");
    }
}
