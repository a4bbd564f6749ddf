//! API server writes, counted from its own `/metrics`.

/// The verbs of `apiserver_request_total` that write.
const WRITE_VERBS: [&str; 5] = ["POST", "PUT", "PATCH", "DELETE", "APPLY"];

/// The write requests (POST, PUT, PATCH, DELETE, APPLY) counted in `metrics`,
/// the API server's Prometheus text, except the harness's own VolumeAttachment
/// creates and deletes.
pub fn count(metrics: &str) -> f64 {
    let mut total = 0.0;
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let verb = label("verb");
        if !WRITE_VERBS.contains(&verb.as_str()) {
            continue;
        }
        if label("resource") == "volumeattachments"
            && (verb == "POST" || verb == "DELETE")
            && label("subresource").is_empty()
        {
            continue;
        }
        total += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    total
}

/// The requests of `verb` on `resource` counted in `metrics` (the API
/// server's Prometheus text), every code and scope summed.
pub fn requests(metrics: &str, verb: &str, resource: &str) -> f64 {
    let verb = format!("verb=\"{verb}\"");
    let resource = format!("resource=\"{resource}\"");
    metrics
        .lines()
        .filter_map(|line| line.strip_prefix("apiserver_request_total{"))
        .filter_map(|rest| rest.rsplit_once("} "))
        .filter(|(labels, _)| {
            let labels: Vec<&str> = labels.split(',').collect();
            labels.contains(&verb.as_str()) && labels.contains(&resource.as_str())
        })
        .filter_map(|(_, value)| value.trim().parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_writes_but_not_the_harness_va_creates_and_deletes() {
        let text = r#"# HELP apiserver_request_total Counter
apiserver_request_total{code="200",resource="volumeattachments",subresource="status",verb="PATCH"} 30
apiserver_request_total{code="201",resource="volumeattachments",subresource="",verb="POST"} 1000
apiserver_request_total{code="200",resource="volumeattachments",subresource="",verb="DELETE"} 1000
apiserver_request_total{code="200",resource="volumeattachments",subresource="",verb="PATCH"} 5
apiserver_request_total{code="200",resource="persistentvolumes",subresource="",verb="PUT"} 7
apiserver_request_total{code="200",resource="leases",subresource="",verb="APPLY"} 2
apiserver_request_total{code="200",resource="pods",subresource="",verb="GET"} 999
apiserver_request_total{code="200",resource="pods",subresource="",verb="WATCH"} 3
"#;
        assert_eq!(count(text), 30.0 + 5.0 + 7.0 + 2.0);
        assert_eq!(count(""), 0.0);
    }

    #[test]
    fn requests_sum_every_code_of_a_verb_and_resource() {
        let text = r#"apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="persistentvolumes",scope="cluster",subresource="",verb="LIST",version="v1"} 200
apiserver_request_total{code="410",component="apiserver",dry_run="",group="",resource="persistentvolumes",scope="cluster",subresource="",verb="LIST",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="persistentvolumes",scope="cluster",subresource="",verb="WATCH",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="storage.k8s.io",resource="volumeattachments",scope="cluster",subresource="",verb="LIST",version="v1"} 9
"#;
        assert_eq!(requests(text, "LIST", "persistentvolumes"), 201.0);
        assert_eq!(requests(text, "WATCH", "persistentvolumes"), 3.0);
        assert_eq!(requests(text, "LIST", "csinodes"), 0.0);
    }
}
