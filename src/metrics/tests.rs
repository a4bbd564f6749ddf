use super::*;
use crate::csi::Origin;
use prometheus::{IntGaugeVec, Opts};

#[test]
fn samples_before_the_name_is_known_are_recorded_as_unknown_driver() {
    let metrics = Metrics::new();
    metrics
        .csi
        .observe("/csi.v1.Identity/Probe", "OK", Origin::Csi, 0.01);
    metrics.csi.set_driver_name("csi.example.com");
    metrics.csi.observe(
        "/csi.v1.Controller/ControllerPublishVolume",
        "ResourceExhausted",
        Origin::Csi,
        0.2,
    );
    let text = metrics.render();
    assert!(text.contains(
        r#"csi_sidecar_operations_seconds_count{driver_name="unknown-driver",grpc_status_code="OK",method_name="/csi.v1.Identity/Probe"} 1"#
    ), "{text}");
    assert!(text.contains(
        r#"csi_sidecar_operations_seconds_count{driver_name="csi.example.com",grpc_status_code="ResourceExhausted",method_name="/csi.v1.Controller/ControllerPublishVolume"} 1"#
    ), "{text}");
    assert!(text.contains(r#"le="600""#), "{text}");
    assert!(!text.contains("migrated"), "{text}");
}

#[test]
fn histogram_buckets_and_values_are_rendered_as_go_does() {
    let metrics = Metrics::new();
    let queue = metrics.queues.for_queue("csi-attacher-va", &["attach"]);
    queue.queue_duration.observe(0.05);
    queue.adds.inc_by(1_234_567);
    let text = metrics.render();
    let bounds: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("workqueue_queue_duration_seconds_bucket"))
        .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(
        bounds,
        // As upstream v4.12.0 serves them.
        [
            "1e-08",
            "1e-07",
            "1e-06",
            "9.999999999999999e-06",
            "9.999999999999999e-05",
            "0.001",
            "0.01",
            "0.1",
            "1",
            "10",
            "+Inf"
        ],
        "{text}"
    );
    for line in [
        r#"workqueue_queue_duration_seconds_bucket{name="csi-attacher-va",le="0.01"} 0"#,
        r#"workqueue_queue_duration_seconds_bucket{name="csi-attacher-va",le="0.1"} 1"#,
        r#"workqueue_queue_duration_seconds_sum{name="csi-attacher-va"} 0.05"#,
        r#"workqueue_queue_duration_seconds_count{name="csi-attacher-va"} 1"#,
        r#"workqueue_adds_total{name="csi-attacher-va"} 1.234567e+06"#,
        "# HELP workqueue_depth [ALPHA] Current depth of workqueue",
        "# TYPE workqueue_queue_duration_seconds histogram",
        r#"csi_attacher_lane_depth{lane="attach"} 0"#,
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
    }
}

#[test]
fn label_values_and_help_are_escaped_like_expfmt() {
    let registry = Registry::new();
    let gauge = IntGaugeVec::new(Opts::new("g", "help with \\ and\nnewline"), &["l"]).unwrap();
    registry.register(Box::new(gauge.clone())).unwrap();
    gauge.with_label_values(&["a\"b\\c\nd"]).set(-1);
    assert_eq!(
        encode_text(&registry.gather()),
        "# HELP g help with \\\\ and\\nnewline\n# TYPE g gauge\ng{l=\"a\\\"b\\\\c\\nd\"} -1\n"
    );
}

#[test]
fn build_info_is_one_series_with_the_build_identity() {
    let text = Metrics::new().render();
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("csi_attacher_build_info{"))
        .collect();
    assert_eq!(
        series,
        [format!(
            r#"csi_attacher_build_info{{build_date="{}",commit="{}",rustc_version="{}",version="{}"}} 1"#,
            build::BUILD_DATE,
            build::GIT_COMMIT,
            build::RUSTC_VERSION,
            env!("CARGO_PKG_VERSION"),
        )],
        "{text}"
    );
    assert!(
        text.contains("# TYPE csi_attacher_build_info gauge"),
        "{text}"
    );
    // This test runs in a checkout: build.rs found the commit and the compiler.
    assert_eq!(build::GIT_COMMIT.len(), 40, "{}", build::GIT_COMMIT);
    assert!(
        build::RUSTC_VERSION.starts_with("rustc "),
        "{}",
        build::RUSTC_VERSION
    );
    assert!(build::BUILD_DATE.ends_with('Z'), "{}", build::BUILD_DATE);
}

#[test]
fn samples_before_the_driver_is_named_are_bounded() {
    let metrics = Metrics::new();
    let max = crate::csi::metrics::MAX_UNNAMED_SAMPLES;
    for _ in 0..max + 500 {
        metrics
            .csi
            .observe("/csi.v1.Identity/Probe", "Unavailable", Origin::Csi, 0.01);
    }
    metrics.csi.set_driver_name("csi.example.com");
    let text = metrics.render();
    let want = format!(
        r#"csi_sidecar_operations_seconds_count{{driver_name="unknown-driver",grpc_status_code="Unavailable",method_name="/csi.v1.Identity/Probe"}} {max}"#
    );
    assert!(text.lines().any(|l| l == want), "{text}");
}

#[test]
fn migration_drivers_get_the_migrated_label() {
    let metrics = Metrics::new();
    metrics.csi.set_driver_name("pd.csi.storage.gke.io");
    metrics.csi.observe(
        "/csi.v1.Controller/ControllerPublishVolume",
        "OK",
        Origin::Migrated,
        0.2,
    );
    let text = metrics.render();
    assert!(text.contains(
        r#"csi_sidecar_operations_seconds_count{driver_name="pd.csi.storage.gke.io",grpc_status_code="OK",method_name="/csi.v1.Controller/ControllerPublishVolume",migrated="true"} 1"#
    ), "{text}");
}
