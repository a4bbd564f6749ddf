//! deploy/monitoring/: the alert rules pass `promtool check rules` and their
//! unit tests (`promtool test rules`), the PrometheusRule and PodMonitor agree
//! with the rule file and the deployment, and every metric the dashboard and
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

/// Alert names of the plain rule file, in order.
fn alert_names() -> Vec<String> {
    let rules = yaml(RULES);
    let mut names = Vec::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            names.push(
                rule["alert"]
                    .as_str()
                    .expect("alerting rules only")
                    .to_string(),
            );
        }
    }
    names
}

/// Every PromQL expression of the rules and of the dashboard's panels.
fn expressions() -> Vec<(String, String)> {
    let mut exprs = Vec::new();
    for group in yaml(RULES)["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().unwrap_or("?");
            exprs.push((
                format!("rule {name}"),
                rule["expr"].as_str().expect("expr").to_string(),
            ));
        }
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
    let alerts = alert_names().len();
    assert!(
        out.contains(&format!("SUCCESS: {alerts} rules found")),
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
    // endpoint of the pod shares, and the rules select it.
    assert!(
        monitor["spec"]["jobLabel"].is_null(),
        "{POD_MONITOR}: jobLabel names a pod label, shared by every endpoint of the pod"
    );
    let job_matcher =
        regex::Regex::new(&format!("^(?:{})$", rules_job_regex())).expect("job regex");
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
        assert!(
            job_matcher.is_match(job),
            "job {job:?} is not selected by the rules' job=~{:?}",
            rules_job_regex()
        );
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
    assert_eq!(
        literal_matchers(r#"x{a="1", b!="2", c=~"3", d="$d"}"#)
            .into_iter()
            .collect::<Vec<_>>(),
        [("a".to_string(), "1".to_string())]
    );
}

/// The job regex every selector of the rules carries.
const JOB_MATCHER: &str = r#"job=~"csi-attacher.*""#;

fn rules_job_regex() -> &'static str {
    "csi-attacher.*"
}

#[test]
fn every_selector_of_the_rules_selects_the_attachers_job() {
    assert_eq!(JOB_MATCHER, format!(r#"job=~"{}""#, rules_job_regex()));
    let mut bare = Vec::new();
    for (source, expr) in expressions()
        .into_iter()
        .filter(|(s, _)| s.starts_with("rule "))
    {
        for name in metric_names(&expr) {
            // Every occurrence of the name is a selector with the matcher.
            let selector =
                regex::Regex::new(&format!(r"\b{name}\b(\{{[^}}]*\}})?")).expect("selector regex");
            for found in selector.captures_iter(&expr) {
                if !found
                    .get(1)
                    .is_some_and(|m| m.as_str().contains(JOB_MATCHER))
                {
                    bare.push(format!("{source}: {}", &found[0]));
                }
            }
        }
    }
    assert!(
        bare.is_empty(),
        "selectors without {JOB_MATCHER} (they would match the driver's or other sidecars' series):\n  {}",
        bare.join("\n  ")
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

#[test]
fn every_alert_has_a_runbook_section_in_operations_md() {
    let operations = read("docs/operations.md");
    let anchors: BTreeSet<String> = operations
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .map(github_anchor)
        .collect();
    let rules = yaml(RULES);
    let mut problems = Vec::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("alert");
            let want = format!("docs/operations.md#{}", name.to_lowercase());
            match rule["annotations"]["runbook_url"].as_str() {
                Some(url) if url == want => {}
                other => problems.push(format!("{name}: runbook_url {other:?}, want {want:?}")),
            }
            if !anchors.contains(&name.to_lowercase()) {
                problems.push(format!(
                    "{name}: no `### {name}` section in docs/operations.md"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
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

    let mut missing = Vec::new();
    let mut checked = BTreeSet::new();
    for (source, expr) in expressions() {
        for name in metric_names(&expr) {
            let found = if name.starts_with("apiserver_") {
                apiserver_served.contains(&name)
            } else if name == "up" {
                // Prometheus's own series for each target it scrapes.
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
        "csi_attacher_reconcile_failures_total",
        "csi_attacher_failing_volumeattachments",
        "csi_attacher_sync_panics_total",
        "leader_election_master_status",
        "apiserver_request_total",
    ] {
        assert!(checked.contains(name), "{name} not queried: {checked:?}");
    }
}
