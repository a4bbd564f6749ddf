//! deploy/monitoring/: the alert rules pass `promtool check rules` and their
//! unit tests (`promtool test rules`), the PrometheusRule and PodMonitor agree
//! with the rule file and the deployment, the rules select no job and keep
//! every name the attacher shares with other components to its targets (a
//! join with `csi_attacher_build_info`), and every metric the dashboard and
//! the rules query is served by a running attacher after real attaches and
//! detaches (or, for `apiserver_*`, by the real kube-apiserver).
//!
//! promtool is the pinned one of `hack/tools-promtool` (`CSI_ATTACHER_PROMTOOL`,
//! set by hack/test.sh; else built here with hack/build-gotool.sh, cached).

use crate::support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::json;

use support::controlplane::free_port;
use support::env::Env;
use support::objects::pv;
use support::{http_get, unique};

const RULES: &str = "deploy/monitoring/csi-attacher.rules.yaml";
const RULE_TESTS: &str = "deploy/monitoring/tests/csi-attacher.rules.test.yaml";
const PROMETHEUS_RULE: &str = "deploy/monitoring/prometheusrule.yaml";
const POD_MONITOR: &str = "deploy/monitoring/podmonitor.yaml";
const DASHBOARD: &str = "deploy/monitoring/grafana-dashboard.json";
const DEPLOYMENT: &str = "deploy/kubernetes/deployment.yaml";

const BUILD_PROMTOOL: &str =
    "hack/build-gotool.sh tools-promtool promtool github.com/prometheus/prometheus/cmd/promtool";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

fn yaml(path: &str) -> serde_yaml_ng::Value {
    serde_yaml_ng::from_str(&read(path)).unwrap_or_else(|e| panic!("parsing {path}: {e}"))
}

/// The pinned promtool: `CSI_ATTACHER_PROMTOOL`, else built (or found in the
/// cache) by hack/build-gotool.sh. Missing promtool fails the test: the rules
/// are part of what CI proves.
fn promtool() -> &'static Path {
    static PROMTOOL: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let found =
        PROMTOOL.get_or_init(|| support::gotool::find("CSI_ATTACHER_PROMTOOL", BUILD_PROMTOOL));
    match found {
        Ok(path) => path,
        Err(err) => panic!(
            "promtool is needed to test deploy/monitoring/ and is missing: {err}.\n\
             Build it (Go ≥ 1.26, from the Go module proxy, about 10 minutes the first time) with\n  \
             export CSI_ATTACHER_PROMTOOL=$({BUILD_PROMTOOL} | tail -n 1)\n\
             or run the tests through hack/test.sh, which does that."
        ),
    }
}

fn run_promtool(args: &[&str]) -> String {
    let output = Command::new(promtool())
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "promtool {} failed:\n{text}",
        args.join(" ")
    );
    text
}

/// Every rule of the plain rule file (alerting and recording), in order.
fn rules() -> Vec<serde_yaml_ng::Value> {
    let mut rules = Vec::new();
    for group in yaml(RULES)["groups"].as_sequence().expect("groups") {
        rules.extend(group["rules"].as_sequence().expect("rules").iter().cloned());
    }
    rules
}

/// Alert names of the plain rule file, in order.
fn alert_names() -> Vec<String> {
    rules()
        .iter()
        .filter_map(|rule| rule["alert"].as_str().map(str::to_string))
        .collect()
}

/// The series the rule file records (`csi_attacher:*`, from the attacher's
/// own series: no running attacher serves them).
fn recorded_names() -> BTreeSet<String> {
    rules()
        .iter()
        .filter_map(|rule| rule["record"].as_str().map(str::to_string))
        .collect()
}

/// Every PromQL expression of the rules and of the dashboard's panels.
fn expressions() -> Vec<(String, String)> {
    let mut exprs = Vec::new();
    for rule in rules() {
        let name = rule["alert"]
            .as_str()
            .or_else(|| rule["record"].as_str())
            .expect("alert or record");
        exprs.push((
            format!("rule {name}"),
            rule["expr"].as_str().expect("expr").to_string(),
        ));
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&read(DASHBOARD)).expect("dashboard JSON");
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push((
                format!("panel {:?}", panel["title"].as_str().unwrap_or("?")),
                target["expr"].as_str().expect("target expr").to_string(),
            ));
        }
    }
    exprs
}

/// The metric names a PromQL expression selects. Removes string literals,
/// label matchers, ranges and grouping clauses, then keeps the identifiers
/// that are neither functions (followed by `(`) nor keywords.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let strip = |text: &str, pattern: &str| {
        regex::Regex::new(pattern)
            .expect("regex")
            .replace_all(text, " ")
            .into_owned()
    };
    let mut text = strip(expr, r#""(?:[^"\\]|\\.)*""#);
    text = strip(&text, r"\{[^}]*\}");
    text = strip(&text, r"\[[^\]]*\]");
    text = strip(
        &text,
        r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)",
    );
    let keywords = ["and", "or", "unless", "bool", "offset", "by", "without"];
    let ident = regex::Regex::new(r"[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?").expect("regex");
    ident
        .captures_iter(&text)
        .filter(|c| c.get(1).is_none())
        .map(|c| c[0].trim().to_string())
        .filter(|name| !keywords.contains(&name.as_str()))
        .collect()
}

/// `label="value"` matchers with literal values (no regex, no dashboard variable).
fn literal_matchers(expr: &str) -> BTreeSet<(String, String)> {
    let matcher = regex::Regex::new(r#"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"([^"$]*)""#).expect("regex");
    matcher
        .captures_iter(expr)
        .map(|c| (c[1].to_string(), c[2].to_string()))
        .collect()
}

/// Sample names in Prometheus text exposition.
fn sample_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

#[test]
fn promtool_checks_the_alert_rules() {
    let out = run_promtool(&["check", "rules", RULES]);
    let count = rules().len();
    assert!(
        out.contains(&format!("SUCCESS: {count} rules found")),
        "{out}"
    );
}

#[test]
fn every_alert_has_unit_tests_and_they_pass() {
    // Each alert is tested both ways: quiet (exp_alerts empty) and firing.
    let tests = yaml(RULE_TESTS);
    let mut quiet = BTreeSet::new();
    let mut firing = BTreeSet::new();
    for test in tests["tests"].as_sequence().expect("tests") {
        for case in test["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = case["alertname"].as_str().expect("alertname").to_string();
            match case["exp_alerts"].as_sequence() {
                Some(alerts) if !alerts.is_empty() => firing.insert(name),
                _ => quiet.insert(name),
            };
        }
    }
    for alert in alert_names() {
        assert!(
            firing.contains(&alert),
            "{RULE_TESTS}: no case where {alert} fires"
        );
        assert!(
            quiet.contains(&alert),
            "{RULE_TESTS}: no case where {alert} stays quiet"
        );
    }
    let out = run_promtool(&["test", "rules", RULE_TESTS]);
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn the_prometheus_rule_carries_the_rule_file() {
    let plain = yaml(RULES);
    let custom = yaml(PROMETHEUS_RULE);
    assert_eq!(custom["kind"].as_str(), Some("PrometheusRule"));
    assert_eq!(
        custom["spec"]["groups"], plain["groups"],
        "{PROMETHEUS_RULE}'s spec.groups differ from {RULES}"
    );
}

#[test]
fn the_pod_monitor_selects_the_deployments_pods_and_port() {
    let monitor = yaml(POD_MONITOR);
    let deployment = yaml(DEPLOYMENT);
    let template = &deployment["spec"]["template"];
    let pod_labels = template["metadata"]["labels"]
        .as_mapping()
        .expect("pod labels");
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .expect("matchLabels");
    for (key, value) in selector {
        assert_eq!(
            pod_labels.get(key),
            Some(value),
            "selector {key:?}={value:?}"
        );
    }
    // The job is the endpoint's own, not a pod label every container's
    // endpoint of the pod shares (the dashboard's job variable picks it; the
    // rules select no job).
    assert!(
        monitor["spec"]["jobLabel"].is_null(),
        "{POD_MONITOR}: jobLabel names a pod label, shared by every endpoint of the pod"
    );
    let attacher = template["spec"]["containers"]
        .as_sequence()
        .expect("containers")
        .iter()
        .find(|c| c["name"].as_str() == Some("csi-attacher"))
        .expect("csi-attacher container");
    let ports: Vec<&str> = attacher["ports"]
        .as_sequence()
        .expect("ports")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    let port_arg = attacher["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str())
        .find(|a| a.starts_with("--http-endpoint="))
        .expect("--http-endpoint");
    for endpoint in monitor["spec"]["podMetricsEndpoints"]
        .as_sequence()
        .expect("endpoints")
    {
        let port = endpoint["port"].as_str().expect("port");
        assert!(ports.contains(&port), "no container port {port}: {ports:?}");
        let job = endpoint["relabelings"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|r| r["targetLabel"].as_str() == Some("job"))
            .and_then(|r| r["replacement"].as_str())
            .unwrap_or_else(|| panic!("{POD_MONITOR}: endpoint {port} sets no job of its own"));
        assert_eq!(job, "csi-attacher", "{POD_MONITOR}: endpoint {port}");
        assert_eq!(endpoint["path"].as_str(), Some("/metrics"), "{port_arg}");
    }
}

#[test]
fn metric_names_are_found_in_expressions() {
    // The extractor itself, on the shapes the dashboard and rules use.
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (le, method_name) (rate(csi_sidecar_operations_seconds_bucket{namespace="$namespace", grpc_status_code!="OK"}[$__rate_interval]))) > 60
           unless increase(csi_attacher_reconcile_pass_seconds_count[15m]) > 0 and on (pod) up"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        [
            "csi_attacher_reconcile_pass_seconds_count",
            "csi_sidecar_operations_seconds_bucket",
            "up"
        ]
    );
    let names = metric_names(
        r#"group by (namespace, driver_name) (present_over_time(csi_attacher:driver:info[1d]))
           unless on (driver_name) csi_attacher:driver:info
           or sum by (job) (leader_election_master_status * on (job, instance) group_left (driver_name) csi_attacher:driver:info)"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["csi_attacher:driver:info", "leader_election_master_status"]
    );
    assert_eq!(
        literal_matchers(r#"x{a="1", b!="2", c=~"3", d="$d"}"#)
            .into_iter()
            .collect::<Vec<_>>(),
        [("a".to_string(), "1".to_string())]
    );
}

/// The join that keeps a selector to the attacher's targets: `and` (or `*`
/// with `group_left`) `on (job, instance)` with `csi_attacher_build_info`,
/// or with a series the rule file records from it (`csi_attacher:*`).
const JOIN: &str = r"(?:\band|\*)\s+on\s*\(\s*job\s*,\s*instance\s*\)\s*(?:group_left\s*\([^)]*\)\s*)?(csi_attacher_build_info|csi_attacher:[A-Za-z0-9_:]+)\b";

/// PromQL's aggregation operators: their parentheses hold a group of their
/// own (the join must sit inside them, before the labels are aggregated away).
const AGGREGATIONS: &str =
    "sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio";

/// Words before a parenthesis that opens no function call.
const CLAUSES: &str = "by without on ignoring group_left group_right and or unless bool";

/// The expression with each string literal's bytes replaced by `x` (same
/// length, so positions stay): no parenthesis or name inside a label value counts.
fn mask_strings(expr: &str) -> String {
    let mut masked = Vec::with_capacity(expr.len());
    let mut in_string = false;
    let mut escaped = false;
    for byte in expr.bytes() {
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
                masked.push(byte);
                continue;
            }
            masked.push(b'x');
        } else {
            in_string = byte == b'"';
            masked.push(byte);
        }
    }
    String::from_utf8(masked).expect("ASCII")
}

/// Where the part of `expr` (masked) that holds the selector at byte `at`
/// ends: the closing parenthesis of the innermost parenthesised group or
/// aggregation around it (function calls such as `rate(...)` are looked
/// through), or the end of the expression.
fn selector_scope_end(expr: &str, at: usize) -> usize {
    let bytes = expr.as_bytes();
    let ident = regex::Regex::new(r"([A-Za-z_][A-Za-z0-9_]*)\s*$").expect("regex");
    let mut depth = 0usize;
    let mut open = at;
    while open > 0 {
        open -= 1;
        match bytes[open] {
            b')' => depth += 1,
            b'(' if depth > 0 => depth -= 1,
            b'(' => {
                // A function call's parenthesis (a name right before it that
                // is no aggregation and no clause keyword): look further out.
                let before = &expr[..open];
                let call = ident.captures(before).is_some_and(|c| {
                    let name = &c[1];
                    !AGGREGATIONS.split(' ').any(|a| a == name)
                        && !CLAUSES.split(' ').any(|k| k == name)
                });
                if call {
                    continue;
                }
                // Its closing parenthesis.
                let mut inner = 0usize;
                for (i, b) in bytes.iter().copied().enumerate().skip(open + 1) {
                    match b {
                        b'(' => inner += 1,
                        b')' if inner == 0 => return i,
                        b')' => inner -= 1,
                        _ => {}
                    }
                }
                return expr.len();
            }
            _ => {}
        }
    }
    expr.len()
}

/// Selectors of names the attacher shares with the driver and the other
/// sidecars (anything but `csi_attacher_*`, the series the rules record and
/// kube-apiserver's `apiserver_*`) that no join keeps to the attacher's
/// targets, as "<source>: <name> in <scope>".
fn unjoined_shared_selectors(source: &str, expr: &str) -> Vec<String> {
    let recorded = recorded_names();
    let join = regex::Regex::new(JOIN).expect("join regex");
    let masked = mask_strings(expr);
    let mut bare = Vec::new();
    for name in metric_names(expr) {
        if name.starts_with("csi_attacher_")
            || recorded.contains(&name)
            || name.starts_with("apiserver_")
        {
            continue;
        }
        let selector =
            regex::Regex::new(&format!(r"(?:^|[^A-Za-z0-9_:]){name}\b")).expect("selector regex");
        for found in selector.find_iter(&masked) {
            let at = found.end() - name.len();
            let scope = &masked[at..selector_scope_end(&masked, at)];
            let joined = join.captures_iter(scope).any(|c| {
                let with = &c[1];
                with == "csi_attacher_build_info" || recorded.contains(with)
            });
            if !joined {
                bare.push(format!("{source}: {name} in `{}`", scope.trim()));
            }
        }
    }
    bare
}

#[test]
fn a_selector_of_a_name_other_components_share_is_joined_to_the_attachers_targets() {
    // The checker itself.
    let cases = [
        ("sum by (namespace) (leader_election_master_status) == 0", 1),
        ("sum by (namespace) (leader_election_master_status * on (job, instance) group_left (driver_name) csi_attacher:driver:info) == 0", 0),
        ("sum by (le) (rate(csi_sidecar_operations_seconds_bucket{a=\"(\"}[5m]) and on (job, instance) csi_attacher_build_info)", 0),
        // Joined after the aggregation dropped job and instance: not joined.
        ("sum(rate(workqueue_depth[5m])) and on (job, instance) csi_attacher_build_info", 1),
        ("max by (pod) (process_open_fds and on (job, instance) csi_attacher_lane_depth)", 1),
        ("group by (driver_name) (csi_attacher:driver:info) unless on (driver_name) csi_attacher_build_info", 0),
    ];
    for (expr, want) in cases {
        assert_eq!(
            unjoined_shared_selectors("case", expr).len(),
            want,
            "{expr}"
        );
    }
    assert!(recorded_names().contains("csi_attacher:driver:info"));

    let job = regex::Regex::new(r"\bjob\s*(?:=|!=|=~|!~)").expect("regex");
    let mut problems = Vec::new();
    for (source, expr) in expressions() {
        problems.extend(unjoined_shared_selectors(&source, &expr));
        // A job is named by whatever scrapes the attacher (a driver chart's
        // ServiceMonitor, an annotation-based scrape config): the rules
        // select none. The dashboard's $job comes from csi_attacher_build_info.
        if source.starts_with("rule ") && job.is_match(&expr) {
            problems.push(format!("{source} selects a job: {expr}"));
        }
    }
    assert!(
        problems.is_empty(),
        "selectors that would take the driver's or other sidecars' series (join them `and on (job, instance) csi_attacher_build_info`), or select a job:\n  {}",
        problems.join("\n  ")
    );
}

/// GitHub's anchor of a Markdown heading: lower case, punctuation but `-`
/// and `_` dropped, spaces as `-`.
fn github_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The base of every runbook_url in the rule files: a placeholder (the
/// project publishes no docs site) that the rule file's header and
/// docs/operations.md tell how to replace with a sed one-liner.
const RUNBOOK_BASE: &str = "https://csi-attacher-rs.example.com/";

#[test]
fn every_alert_has_a_runbook_section_in_operations_md() {
    let operations = read("docs/operations.md");
    let anchors: BTreeSet<String> = operations
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .map(github_anchor)
        .collect();
    let mut problems = Vec::new();
    for rule in rules().iter().filter(|r| r["alert"].as_str().is_some()) {
        let name = rule["alert"].as_str().expect("alert");
        // <base>docs/operations.md#<anchor>: an absolute URL a receiver can
        // open, on the one base the header's sed replaces.
        let url = rule["annotations"]["runbook_url"].as_str().unwrap_or("");
        match url.split_once("docs/operations.md#") {
            Some((base, anchor)) => {
                if base != RUNBOOK_BASE {
                    problems.push(format!(
                        "{name}: runbook_url {url:?} is not on the base {RUNBOOK_BASE:?}"
                    ));
                }
                if anchor != name.to_lowercase() {
                    problems.push(format!(
                        "{name}: runbook_url {url:?} points at #{anchor}, want #{}",
                        name.to_lowercase()
                    ));
                }
            }
            None => problems.push(format!(
                "{name}: runbook_url {url:?}, want {RUNBOOK_BASE}docs/operations.md#{}",
                name.to_lowercase()
            )),
        }
        if !anchors.contains(&name.to_lowercase()) {
            problems.push(format!(
                "{name}: no `### {name}` section in docs/operations.md"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // Where the base is said to be changed names the base in use.
    for (path, text) in [(RULES, read(RULES)), ("docs/operations.md", operations)] {
        assert!(
            text.contains(&format!("s|{RUNBOOK_BASE}|")),
            "{path} does not show how to replace the runbook base {RUNBOOK_BASE}"
        );
    }
    assert!(RUNBOOK_BASE.starts_with("https://") && RUNBOOK_BASE.ends_with('/'));
    assert_eq!(github_anchor("CSIAttacherNoLeader"), "csiattachernoleader");
    assert_eq!(
        github_anchor("The image and the driver socket"),
        "the-image-and-the-driver-socket"
    );
}

/// Waits until `/metrics` on `addr` satisfies `ready`, and returns it.
async fn scrape_until(addr: SocketAddr, what: &str, ready: impl Fn(&str) -> bool) -> String {
    support::eventually(what, Duration::from_secs(30), || async {
        http_get(addr, "/metrics")
            .await
            .map(|(_, body)| body)
            .filter(|body| ready(body))
    })
    .await
}

#[tokio::test]
async fn dashboard_and_rules_query_only_metrics_a_running_attacher_serves() {
    let port = free_port().expect("port");
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let http = format!("--http-endpoint=127.0.0.1:{port}");
    let env = Env::start(
        &[],
        &[
            &http,
            "--leader-election",
            "--leader-election-namespace=default",
            "--reconcile-sync=300ms",
            "--retry-interval-start=100ms",
        ],
    )
    .await;

    // One failed Publish and one failed Unpublish (error series), then an
    // attach and a detach that succeed.
    for method in ["ControllerPublishVolume", "ControllerUnpublishVolume"] {
        env.mock
            .set_fault(
                method,
                json!({"code": "Internal", "message": "injected", "times": 1}),
            )
            .await;
    }
    let va = env
        .create_attachment(pv(&unique("pv"), &env.driver))
        .await
        .va;
    env.wait_attached(&va).await;
    env.delete_va(&va).await;
    env.wait_gone(&va).await;

    // Every VA succeeded in the end: none counts as failing. The worker clears
    // a VA's failing mark after it observes the latency: wait for both, or a
    // scrape between the two sees the detach still failing.
    let cleared = |t: &str| {
        ["attach", "detach"].iter().all(|lane| {
            let line = format!("csi_attacher_failing_volumeattachments{{lane=\"{lane}\"}} 0");
            t.lines().any(|l| l == line)
        })
    };
    let text = scrape_until(addr, "detach latency, both errors, a reconcile pass, no VA failing", |t| {
        cleared(t)
            && t.contains("csi_attacher_detach_latency_seconds_count 1")
            && t.contains(r#"grpc_status_code="Internal",method_name="/csi.v1.Controller/ControllerUnpublishVolume""#)
            && !t.contains("csi_attacher_reconcile_pass_seconds_count 0")
            && t.contains("csi_attacher_reconcile_mismatches_total")
    })
    .await;
    let served = sample_names(&text);

    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let apiserver = env
        .client
        .request_text(request)
        .await
        .expect("kube-apiserver /metrics");
    let apiserver_served = sample_names(&apiserver);

    let recorded = recorded_names();
    let mut missing = Vec::new();
    let mut checked = BTreeSet::new();
    for (source, expr) in expressions() {
        for name in metric_names(&expr) {
            let found = if name.starts_with("apiserver_") {
                apiserver_served.contains(&name)
            } else if name == "up" {
                // Prometheus's own series for each target it scrapes.
                true
            } else if recorded.contains(&name) {
                // Recorded by the rule file from the names checked here.
                true
            } else {
                served.contains(&name)
            };
            if !found {
                missing.push(format!("{source}: {name}"));
            }
            checked.insert(name);
        }
        // Literal label values (method names, codes) must exist too; the
        // target labels come from Prometheus, not from the attacher.
        for (label, value) in literal_matchers(&expr) {
            if ["namespace", "job", "pod"].contains(&label.as_str()) || value.is_empty() {
                continue;
            }
            if !text.contains(&format!("{label}=\"{value}\"")) {
                missing.push(format!("{source}: {label}=\"{value}\""));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "queried but not served:\n  {}\n\nserved by the attacher:\n{text}",
        missing.join("\n  ")
    );
    // The dashboard's variables read csi_attacher_build_info.
    assert!(served.contains("csi_attacher_build_info"), "{text}");
    // Sanity: the check covered the families of every section.
    for name in [
        "csi_attacher_attach_latency_seconds_bucket",
        "csi_attacher_lane_oldest_waiting_seconds",
        "csi_sidecar_operations_seconds_count",
        "csi_attacher_build_info",
        "csi_attacher_reconcile_failures_total",
        "csi_attacher_failing_volumeattachments",
        "csi_attacher_sync_panics_total",
        "leader_election_master_status",
        "apiserver_request_total",
    ] {
        assert!(checked.contains(name), "{name} not queried: {checked:?}");
    }
}
