//! Property test: the Go value syntax of `src/gofmt/parse.rs` (durations, ints,
//! uints, klog levels, floats, bools, quantities) and `logging::go_quote` /
//! `go_quote_bytes` against Go itself: hack/tools-goprops answers with
//! `time.ParseDuration`, `strconv.*` and apimachinery's `resource.ParseQuantity`
//! (built by `hack/build-gotool.sh`, cached; `CSI_ATTACHER_GOPROPS_BIN`
//! overrides the binary).
//!
//! Cases: 512 per parser by default, `PROPTEST_CASES` for more
//! (`hack/properties.sh`).

use crate::support;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use base64::Engine as _;
use csi_attacher::gofmt::parse as go;
use csi_attacher::gofmt::{go_quote, go_quote_bytes};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{json, Value};

fn goprops_binary() -> PathBuf {
    support::gotool::find(
        "CSI_ATTACHER_GOPROPS_BIN",
        "hack/build-gotool.sh tools-goprops goprops .",
    )
    .unwrap_or_else(|err| panic!("goprops is missing: {err}"))
}

/// How long one question may take. Go answers every input here in
/// milliseconds except the ParseQuantity tails [`slow_for_apimachinery`]
/// filters out; a question that still takes longer is skipped (goprops is
/// restarted) so that no input can hold a test run for hours.
const ANSWER_DEADLINE: Duration = Duration::from_secs(20);

/// One long-lived goprops process, one JSON line per question; a thread reads
/// its answers so a question can time out.
struct Go {
    child: Child,
    stdin: ChildStdin,
    answers: Receiver<std::io::Result<String>>,
}

impl Go {
    fn start() -> Go {
        static BINARY: OnceLock<PathBuf> = OnceLock::new();
        let binary = BINARY.get_or_init(goprops_binary);
        let mut child = Command::new(binary)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let (tx, answers) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Go {
            child,
            stdin,
            answers,
        }
    }

    /// Go's answer, or `None` when it took longer than [`ANSWER_DEADLINE`].
    fn ask(&mut self, request: &Value) -> Option<Value> {
        let mut line = serde_json::to_vec(request).expect("json");
        line.push(b'\n');
        self.stdin.write_all(&line).expect("write to goprops");
        self.stdin.flush().expect("flush");
        match self.answers.recv_timeout(ANSWER_DEADLINE) {
            Ok(answer) => {
                let answer = answer.expect("read goprops");
                Some(serde_json::from_str(&answer).expect("goprops answer"))
            }
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => panic!("goprops ended"),
        }
    }
}

impl Drop for Go {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Go's answer to one question; a question Go does not answer within
/// [`ANSWER_DEADLINE`] rejects the case (proptest draws another) and restarts
/// goprops.
fn ask(op: &str, s: &str) -> Result<Value, TestCaseError> {
    static GO: Mutex<Option<Go>> = Mutex::new(None);
    let request = if op == "quotebytes" {
        json!({"op": op, "b": s})
    } else {
        json!({"op": op, "s": s})
    };
    let mut go = GO.lock().unwrap_or_else(|e| e.into_inner());
    let answer = go.get_or_insert_with(Go::start).ask(&request);
    answer.ok_or_else(|| {
        *go = None;
        eprintln!("goprops: no answer within {ANSWER_DEADLINE:?} to {request}; case skipped");
        TestCaseError::reject(format!("Go took longer than {ANSWER_DEADLINE:?}"))
    })
}

/// Go's answer as `Ok(integer)` or `Err((kind, text))`.
fn go_int(answer: &Value) -> Result<i128, (String, String)> {
    match answer.get("int") {
        Some(n) => Ok(n.to_string().parse().expect("integer")),
        None => Err((
            answer["kind"].as_str().unwrap_or_default().to_owned(),
            answer["err"].as_str().unwrap_or_default().to_owned(),
        )),
    }
}

fn num_kind(e: go::NumError) -> String {
    match e {
        go::NumError::Syntax => "syntax".to_owned(),
        go::NumError::Range => "range".to_owned(),
    }
}

// ---- generators: Go-syntax-shaped text, plus anything ----

fn number_text() -> BoxedStrategy<String> {
    let piece = prop_oneof![
        6 => prop::sample::select(vec![
            "0", "1", "7", "9", "10", "123456789", "9223372036854775807", "9223372036854775808",
            "18446744073709551615", "18446744073709551616", "2147483647", "2147483648",
            "99999999999999999999", "_", "__", ".", "..", "e", "E", "e-", "e+", "p", "P", "p-",
            "0x", "0X", "0b", "0B", "0o", "0O", "00", "+", "-", "inf", "Inf", "infinity",
            "INFINITY", "nan", "NaN", "h", "m", "s", "ms", "us", "µs", "μs", "ns", "Ki", "Mi",
            "Gi", "Ti", "Pi", "Ei", "k", "K", "M", "G", "T", "P", "n", "u", "i", "a", "f", "F",
            "t", "T", "true", "TRUE", "True", "tRUE", "false", "FALSE", "False", "1e308", "1e309",
            "4.9e-324", "2.5e-324", "1e-400", "0x1p-1074", "0x1p1024", "0x1.fffffffffffffp1023",
            "00000000000000000000001", " ", "é", "\u{0}",
        ])
        .prop_map(str::to_owned),
        1 => "[0-9a-fA-F]{1,25}",
        1 => any::<char>().prop_map(String::from),
    ];
    prop_oneof![
        8 => prop::collection::vec(piece, 0..7).prop_map(|p| p.concat()),
        1 => ".{0,10}",
        1 => prop::collection::vec("[0-9]", 20..400).prop_map(|d| d.concat()),
    ]
    .boxed()
}

/// Whether apimachinery's ParseQuantity takes too long on `s`: it scales by
/// 10^|exponent| (rounding `1e-N` to nanos, and comparing a long mantissa
/// times `e+N` against its limit), quadratic in N. Measured with goprops:
/// `1e-9999999` and 400 nines `e9999999` take 0.95 s, `0.` + 23 zeros +
/// `1e12345678` 1.4 s, and `1e-123456789` or 23 digits `e123456789` hours
/// (both are draws of [`number_text`]; the first once held a CI run for most
/// of an hour). Inputs with an exponent of 7 or more significant digits are
/// skipped; ours answers them at once.
fn slow_for_apimachinery(s: &str) -> bool {
    s.match_indices(['e', 'E']).any(|(at, _)| {
        let rest = &s[at + 1..];
        let rest = rest.strip_prefix(['-', '+']).unwrap_or(rest);
        let digits = rest.bytes().take_while(u8::is_ascii_digit);
        digits.skip_while(|d| *d == b'0').count() > 6
    })
}

#[test]
fn only_huge_exponents_are_too_slow_for_apimachinery() {
    for slow in [
        "1e-123456789",
        "7KiE-0010000000x",
        "e-12345678a",
        "12345678901234567890123e123456789",
        "1e+1234567",
        "9E2147483647",
    ] {
        assert!(slow_for_apimachinery(slow), "{slow}");
    }
    for fast in [
        "1e-999999",
        "1e-000999999",
        "1e999999",
        "1e+0000999999",
        "1e-",
        "1e+",
        "1.5",
        "Ei",
        "1234567",
    ] {
        assert!(!slow_for_apimachinery(fast), "{fast}");
    }
}

fn quote_text() -> BoxedStrategy<String> {
    prop_oneof![
        4 => any::<String>(),
        2 => prop::collection::vec(
            prop_oneof![
                // Every plane, controls, format characters, private use, unassigned, marks.
                any::<char>(),
                prop::sample::select(vec![
                    '\u{0}', '\u{7}', '\u{1b}', '\u{7f}', '\u{80}', '\u{9f}', '\u{a0}', '\u{ad}',
                    '\u{300}', '\u{301}', '\u{378}', '\u{61c}', '\u{1680}', '\u{180e}', '\u{200b}',
                    '\u{200d}', '\u{2028}', '\u{2029}', '\u{202e}', '\u{2060}', '\u{3000}',
                    '\u{e000}', '\u{fe0f}', '\u{feff}', '\u{fff9}', '\u{fffd}', '\u{ffff}',
                    '\u{1F600}', '\u{1F1E6}', '\u{e0001}', '\u{e0100}', '\u{f0000}', '\u{10ffff}',
                    '"', '\\', '\'', '\n', ' ',
                ]),
                // Recently assigned or changed code points (Unicode 15–16).
                (0x1_0000u32..0x3_2000).prop_filter_map("char", char::from_u32),
            ],
            0..12,
        )
        .prop_map(|c| c.into_iter().collect()),
    ]
    .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(support::proptest_cases(512)))]

    #[test]
    fn parse_duration_is_go_time_parse_duration(s in number_text()) {
        let theirs = go_int(&ask("duration", &s)?).map_err(|(_, text)| text);
        let ours = go::parse_duration(&s).map(i128::from);
        prop_assert_eq!(ours, theirs, "input {:?}", s);
    }

    #[test]
    fn parse_int_is_go_strconv_parse_int(s in number_text()) {
        let theirs = go_int(&ask("int", &s)?).map_err(|(kind, _)| kind);
        let ours = go::parse_int(&s).map(i128::from).map_err(num_kind);
        prop_assert_eq!(ours, theirs, "input {:?}", s);
    }

    #[test]
    fn parse_uint_is_go_strconv_parse_uint(s in number_text()) {
        let theirs = go_int(&ask("uint", &s)?).map_err(|(kind, _)| kind);
        let ours = go::parse_uint(&s).map(i128::from).map_err(num_kind);
        prop_assert_eq!(ours, theirs, "input {:?}", s);
    }

    #[test]
    fn parse_level_is_go_strconv_parse_uint_31_bits(s in number_text()) {
        let theirs = go_int(&ask("level", &s)?).map_err(|(_, text)| text);
        let ours = go::parse_level(&s).map(i128::from);
        prop_assert_eq!(ours, theirs, "input {:?}", s);
    }

    #[test]
    fn parse_float_is_go_strconv_parse_float(s in number_text()) {
        let answer = ask("float", &s)?;
        let theirs = match answer.get("bits") {
            Some(bits) => Ok(f64::from_bits(bits.as_u64().expect("bits"))),
            None => Err(answer["kind"].as_str().unwrap_or_default().to_owned()),
        };
        let ours = go::parse_float(&s).map_err(num_kind);
        match (&ours, &theirs) {
            // Go's NaN has other payload bits than Rust's; NaN is NaN.
            (Ok(a), Ok(b)) if a.is_nan() || b.is_nan() => {
                prop_assert!(a.is_nan() && b.is_nan(), "input {:?}: {:?} vs {:?}", s, a, b)
            }
            (Ok(a), Ok(b)) => prop_assert_eq!(a.to_bits(), b.to_bits(), "input {:?}: {} vs {}", s, a, b),
            _ => prop_assert_eq!(ours, theirs, "input {:?}", s),
        }
    }

    #[test]
    fn parse_bool_is_go_strconv_parse_bool(s in number_text()) {
        let theirs = ask("bool", &s)?.get("bool").and_then(Value::as_bool);
        prop_assert_eq!(go::parse_bool(&s), theirs, "input {:?}", s);
    }

    #[test]
    fn quantity_is_zero_is_apimachinery_parse_quantity(s in number_text()) {
        prop_assume!(!slow_for_apimachinery(&s));
        let answer = ask("quantity", &s)?;
        let theirs = match answer.get("bool") {
            Some(zero) => Ok(zero.as_bool().expect("bool")),
            None => Err(answer["err"].as_str().unwrap_or_default().to_owned()),
        };
        let ours = go::quantity_is_zero(&s).map_err(str::to_owned);
        prop_assert_eq!(ours, theirs, "input {:?}", s);
    }

    #[test]
    fn go_quote_is_strconv_quote(s in quote_text()) {
        let theirs = ask("quote", &s)?["s"].as_str().expect("quoted").to_owned();
        prop_assert_eq!(go_quote(&s), theirs, "input {:?}", s);
    }

    #[test]
    fn go_quote_bytes_is_strconv_quote_of_the_bytes(
        b in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..24),
            quote_text().prop_map(String::into_bytes),
            // Valid UTF-8 cut anywhere.
            (quote_text(), any::<prop::sample::Index>()).prop_map(|(s, i)| {
                let b = s.into_bytes();
                let cut = if b.is_empty() { 0 } else { i.index(b.len()) };
                b[..cut].to_vec()
            }),
        ]
    ) {
        let encoded = base64::engine::general_purpose::STANDARD.encode(&b);
        let theirs = ask("quotebytes", &encoded)?["s"].as_str().expect("quoted").to_owned();
        prop_assert_eq!(go_quote_bytes(&b), theirs, "input {:?}", b);
    }
}

/// Exhaustive: every code point is printed by `go_quote` as it is exactly
/// when Go's `strconv.IsPrint` says so (Rust's and Go's Unicode tables differ
/// in version; `logging.rs` carries the difference).
#[test]
fn go_quote_prints_exactly_the_code_points_go_prints() {
    let answer = ask("printable", "").expect("goprops answers printable");
    let ranges: Vec<(u32, u32)> = serde_json::from_value(answer["ranges"].clone()).expect("ranges");
    let mut go_printable = vec![false; 0x11_0000];
    for (lo, hi) in ranges {
        for cp in lo..=hi {
            go_printable[cp as usize] = true;
        }
    }
    let mut differ = Vec::new();
    for cp in 0..0x11_0000u32 {
        let Some(c) = char::from_u32(cp) else {
            continue;
        };
        if c == '"' || c == '\\' {
            continue;
        }
        let s = c.to_string();
        let printed = go_quote(&s) == format!("\"{s}\"");
        if printed != go_printable[cp as usize] {
            differ.push(format!("U+{cp:04X} (ours {printed})"));
        }
    }
    assert!(
        differ.is_empty(),
        "{} code points differ: {}",
        differ.len(),
        differ
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    );
}
