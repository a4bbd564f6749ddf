//! The production surface: HTTP endpoint (metrics, health, readiness) after
//! real attaches, as Prometheus and the kubelet see it.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;

use support::controlplane::free_port;
use support::env::Env;
use support::objects::pv;
use support::{http_get, unique};

async fn wait_http(addr: SocketAddr, path: &str, status: u16) -> String {
    support::eventually(
        &format!("{path} to answer {status}"),
        Duration::from_secs(20),
        || async {
            http_get(addr, path)
                .await
                .filter(|(s, _)| *s == status)
                .map(|(_, body)| body)
        },
    )
    .await
}

#[tokio::test]
async fn metrics_and_health_after_an_attach_and_a_failed_attach() {
    let port = free_port().expect("port");
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let http = format!("--http-endpoint=127.0.0.1:{port}");
    let env = Env::start(
        &[],
        &[
            &http,
            "--leader-election",
            "--leader-election-namespace=default",
        ],
    )
    .await;

    assert_eq!(wait_http(addr, "/healthz", 200).await, "ok");
    assert_eq!(wait_http(addr, "/readyz", 200).await, "ok");
    assert_eq!(wait_http(addr, "/healthz/leader-election", 200).await, "ok");

    env.mock
        .set_fault(
            "ControllerPublishVolume",
            json!({"code": "ResourceExhausted", "message": "mock rpc error", "times": 1}),
        )
        .await;
    let va_name = env
        .create_attachment(pv(&unique("pv"), &env.driver))
        .await
        .va;
    env.wait_attached(&va_name).await;

    // The latency is observed right after the status write the test waited for.
    let text = support::eventually(
        "attach latency recorded",
        Duration::from_secs(10),
        || async {
            http_get(addr, "/metrics")
                .await
                .map(|(_, body)| body)
                .filter(|body| body.contains("csi_attacher_attach_latency_seconds_count 1"))
        },
    )
    .await;
    let driver = &env.driver;
    for expected in [
        format!(r#"csi_sidecar_operations_seconds_count{{driver_name="{driver}",grpc_status_code="ResourceExhausted",method_name="/csi.v1.Controller/ControllerPublishVolume"}} 1"#),
        format!(r#"csi_sidecar_operations_seconds_count{{driver_name="{driver}",grpc_status_code="OK",method_name="/csi.v1.Controller/ControllerPublishVolume"}} 1"#),
        r#"csi_sidecar_operations_seconds_count{driver_name="unknown-driver",grpc_status_code="OK",method_name="/csi.v1.Identity/Probe"} 1"#.to_string(),
        r#"csi_sidecar_operations_seconds_bucket{driver_name="unknown-driver",grpc_status_code="OK",method_name="/csi.v1.Identity/Probe",le="0.1"} 1"#.to_string(),
        r#"workqueue_retries_total{name="csi-attacher-va"} 1"#.to_string(),
        // Upstream's label value: csi-lib-utils never names its LeaderElectionConfig.
        r#"leader_election_master_status{name=""} 1"#.to_string(),
        r#"csi_attacher_attach_latency_seconds_count 1"#.to_string(),
        r#"csi_attacher_sync_panics_total{lane="attach"} 0"#.to_string(),
    ] {
        assert!(text.contains(&expected), "missing {expected}\n{text}");
    }
    for family in [
        "workqueue_depth{name=\"csi-attacher-va\"}",
        "workqueue_depth{name=\"csi-attacher-pv\"}",
        "workqueue_adds_total{name=\"csi-attacher-va\"}",
        "workqueue_queue_duration_seconds_bucket{name=\"csi-attacher-va\",le=\"1e-08\"}",
        "workqueue_work_duration_seconds_count{name=\"csi-attacher-va\"}",
        "workqueue_unfinished_work_seconds{name=\"csi-attacher-va\"}",
        "workqueue_longest_running_processor_seconds{name=\"csi-attacher-va\"}",
        "leader_election_slowpath_total{name=\"\"}",
        "csi_attacher_lane_depth{lane=\"attach\"}",
        "csi_attacher_lane_oldest_waiting_seconds{lane=\"detach\"}",
        "csi_attacher_detach_latency_seconds_count",
        "process_start_time_seconds",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
    ] {
        assert!(text.contains(family), "missing {family}\n{text}");
    }
    let (status, _) = http_get(addr, "/nope").await.expect("answer");
    assert_eq!(status, 404);
}

#[tokio::test]
async fn without_leader_election_the_leader_check_is_not_registered_and_metrics_address_works() {
    let port = free_port().expect("port");
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let metrics_address = format!("--metrics-address=127.0.0.1:{port}");
    let _env = Env::start(&[], &[&metrics_address, "--metrics-path=/custom"]).await;
    wait_http(addr, "/readyz", 200).await;
    assert!(wait_http(addr, "/custom", 200)
        .await
        .contains("workqueue_depth"));
    assert_eq!(http_get(addr, "/metrics").await.map(|(s, _)| s), Some(404));
    assert_eq!(
        http_get(addr, "/healthz/leader-election")
            .await
            .map(|(s, _)| s),
        Some(404)
    );
}
