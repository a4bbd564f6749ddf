//! API economy: the attacher's writes per attach and per detach, counted by the
//! API server itself (`apiserver_request_total`), never more than upstream's
//! (as upstream external-attacher v4.12). Alone in its binary so no other test's traffic
//! shares the counters.

// Tests may unwrap, expect and panic: Cargo.toml's deny is for the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeMap;

use futures::{stream, StreamExt};
use serde_json::json;

use support::env::Env;
use support::objects::{pv, va};
use support::unique;

/// `apiserver_request_total` summed by (verb, resource, subresource).
async fn request_counts(client: &kube::Client) -> BTreeMap<(String, String, String), f64> {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let text = client.request_text(req).await.expect("apiserver metrics");
    let mut counts = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let (labels, value) = line.rsplit_once(' ').expect("metric line");
        let label = |name: &str| {
            labels
                .split(&format!("{name}=\"")[..])
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or_default()
                .to_string()
        };
        *counts
            .entry((label("verb"), label("resource"), label("subresource")))
            .or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    counts
}

fn delta(
    before: &BTreeMap<(String, String, String), f64>,
    after: &BTreeMap<(String, String, String), f64>,
    verb: &str,
    resource: &str,
    subresource: &str,
) -> f64 {
    let key = (
        verb.to_string(),
        resource.to_string(),
        subresource.to_string(),
    );
    after.get(&key).copied().unwrap_or(0.0) - before.get(&key).copied().unwrap_or(0.0)
}

#[tokio::test]
async fn writes_per_attach_and_detach_do_not_exceed_upstream() {
    const N: usize = 20;
    let env = Env::start(&[], &[]).await;
    let secret_name = unique("secret");
    env.create_secret(&secret_name, json!({"k": "dg=="})).await;
    let node = unique("node");
    env.create_node(&node).await;
    let names: Vec<(String, String)> = (0..N).map(|_| (unique("pv"), unique("va"))).collect();
    for (pv_name, _) in &names {
        env.create_pv(
            pv(pv_name, &env.driver)
                .publish_secret("default", &secret_name)
                .build(),
        )
        .await;
    }
    // A warm-up attach of a PV created after all others: once it is attached,
    // the attacher's PV cache has every PV (watch events arrive in order).
    let warm_pv = unique("pv");
    let warm_va = unique("va");
    env.create_pv(pv(&warm_pv, &env.driver).build()).await;
    env.create_va(va(&warm_va, &env.driver, &node).pv(&warm_pv).build())
        .await;
    env.wait_attached(&warm_va).await;

    let before = request_counts(&env.client).await;
    stream::iter(&names)
        .for_each_concurrent(8, |(pv_name, va_name)| {
            let env = &env;
            let node = &node;
            async move {
                env.create_va(va(va_name, &env.driver, node).pv(pv_name).build())
                    .await;
            }
        })
        .await;
    for (_, va_name) in &names {
        env.wait_attached(va_name).await;
    }
    let attached = request_counts(&env.client).await;
    let per_attach =
        |verb, resource, sub| delta(&before, &attached, verb, resource, sub) / N as f64;
    let pv_patch = per_attach("PATCH", "persistentvolumes", "");
    let va_patch = per_attach("PATCH", "volumeattachments", "");
    let status_patch = per_attach("PATCH", "volumeattachments", "status");
    let secret_get = per_attach("GET", "secrets", "");
    println!("per attach: PV patch {pv_patch}, VA patch {va_patch}, VA status patch {status_patch}, secret GET {secret_get}");
    assert!(pv_patch <= 1.0, "PV patches per attach: {pv_patch}");
    assert!(va_patch <= 1.0, "VA patches per attach: {va_patch}");
    assert!(
        status_patch <= 1.0,
        "status patches per attach: {status_patch}"
    );
    assert!(secret_get <= 1.0, "secret GETs per attach: {secret_get}");
    assert_eq!(
        per_attach("PUT", "volumeattachments", ""),
        0.0,
        "never UPDATE"
    );
    assert_eq!(
        per_attach("PUT", "volumeattachments", "status"),
        0.0,
        "never UPDATE"
    );

    stream::iter(&names)
        .for_each_concurrent(8, |(_, va_name)| env.delete_va(va_name))
        .await;
    for (_, va_name) in &names {
        env.wait_gone(va_name).await;
    }
    let detached = request_counts(&env.client).await;
    let per_detach =
        |verb, resource, sub| delta(&attached, &detached, verb, resource, sub) / N as f64;
    let va_patch = per_detach("PATCH", "volumeattachments", "");
    let status_patch = per_detach("PATCH", "volumeattachments", "status");
    let secret_get = per_detach("GET", "secrets", "");
    let pv_patch = per_detach("PATCH", "persistentvolumes", "");
    println!("per detach: VA patch {va_patch}, VA status patch {status_patch}, secret GET {secret_get}, PV patch {pv_patch}");
    assert!(va_patch <= 1.0, "VA patches per detach: {va_patch}");
    // Upstream sends a status patch that 404s; we skip it.
    assert_eq!(status_patch, 0.0, "status patches per detach");
    assert!(secret_get <= 1.0);
    assert_eq!(pv_patch, 0.0, "live PVs keep the finalizer");
}
