//! Logs as pipelines built for the Go sidecars read them: klog text headers,
//! component-base JSON entries, and `--v` levels that keep the Kubernetes
//! client quiet below 6, all with `RUST_LOG` unset.

use crate::support;

use regex::Regex;
use serde_json::Value;

use support::env::Env;
use support::objects::pv;
use support::unique;

/// kube-client's debug line for every API request it sends.
const CLIENT_REQUEST: &str = "\"requesting\"";

/// An attacher started without `RUST_LOG` and with `flags`, after one attach: its log.
async fn log_of_one_attach(flags: &[&str]) -> String {
    let mut env = Env::without_attacher(&[]).await;
    env.rust_log = None;
    let kubeconfig = env.cp.kubeconfig.clone();
    let env = env.with_attacher(&kubeconfig, flags);
    let va = env
        .create_attachment(pv(&unique("pv"), &env.driver))
        .await
        .va;
    env.wait_attached(&va).await;
    // The milestone is logged after the status write returns: the watch can see
    // `attached=true` first.
    support::eventually(
        "the Attached milestone in the log",
        std::time::Duration::from_secs(10),
        || async {
            let log = env.logs();
            log.contains("\"Attached\"").then_some(log)
        },
    )
    .await
}

/// klog's header: `Lmmdd hh:mm:ss.uuuuuu <pid, 7 wide> file:line] "message"`.
fn klog_line() -> Regex {
    Regex::new(r#"^[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d{6} [ \d]{6}\d [^ :\]]+:\d+\] ".*"( |$)"#)
        .expect("valid regex")
}

#[tokio::test]
async fn text_lines_have_klog_headers_and_v2_has_no_client_request_lines() {
    let log = log_of_one_attach(&["--v=2"]).await;
    let header = klog_line();
    let pid_column = Regex::new(r"^\S+ \S+ +(\d+) ").expect("valid regex");
    // Lines of a multi-line value start with a tab, its end with " >".
    for line in log
        .lines()
        .filter(|l| !l.starts_with('\t') && !l.starts_with(" >"))
    {
        assert!(header.is_match(line), "not a klog line: {line}\n{log}");
        assert!(pid_column.is_match(line), "{line}");
    }
    // Our V(2) milestones are there, with the span's fields.
    assert!(
        log.lines().any(|l| l.contains("attach.rs:")
            && l.contains("] \"Attached\" va=\"va-")
            && l.contains(" lane=\"attach\"")),
        "{log}"
    );
    assert!(
        !log.contains(CLIENT_REQUEST),
        "client request lines at --v=2:\n{log}"
    );
}

#[tokio::test]
async fn v6_lets_the_client_request_lines_through() {
    let log = log_of_one_attach(&["--v=6"]).await;
    assert!(log.contains(CLIENT_REQUEST), "{log}");
    let header = klog_line();
    let request = log
        .lines()
        .find(|l| l.contains(CLIENT_REQUEST))
        .expect("a request line");
    assert!(header.is_match(request), "{request}");
}

#[tokio::test]
async fn json_entries_have_component_base_keys_in_order() {
    let log = log_of_one_attach(&["--logging-format=json"]).await;
    let mut attached = None;
    for line in log.lines() {
        let entry: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}\n{log}"));
        assert!(
            entry["ts"].as_f64().is_some_and(|ts| ts > 1.5e12),
            "ts in ms: {line}"
        );
        assert!(
            entry["caller"].as_str().is_some_and(|c| c.contains(".rs:")),
            "{line}"
        );
        assert!(entry["msg"].is_string(), "{line}");
        assert!(line.starts_with(r#"{"ts":"#), "{line}");
        if entry["msg"] == "Attached" {
            attached = Some(line.to_string());
        }
    }
    let attached = attached.unwrap_or_else(|| panic!("no Attached entry\n{log}"));
    let shape = Regex::new(
        r#"^\{"ts":\d+(\.\d+)?,"caller":"flows/attach\.rs:\d+","msg":"Attached","va":"va-[^"]+","lane":"attach","v":2\}$"#,
    )
    .expect("valid regex");
    assert!(shape.is_match(&attached), "{attached}");
    assert!(
        !log.contains(CLIENT_REQUEST),
        "client request entries at --v=2:\n{log}"
    );
}
