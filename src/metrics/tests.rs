use super::*;
use crate::csi::Origin;
use prometheus::{IntGaugeVec, Opts};

#[test]
fn samples_before_the_name_is_known_are_recorded_as_unknown_driver() {
    let metrics = Metrics::new().expect("metrics");
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
    let metrics = Metrics::new().expect("metrics");
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
        encode::encode_text(&registry.gather()),
        "# HELP g help with \\\\ and\\nnewline\n# TYPE g gauge\ng{l=\"a\\\"b\\\\c\\nd\"} -1\n"
    );
}

#[test]
fn build_info_is_one_series_with_the_build_identity() {
    let text = Metrics::new().expect("metrics").render();
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
    let metrics = Metrics::new().expect("metrics");
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
    let metrics = Metrics::new().expect("metrics");
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

/// The one sample of family `name` (a counter or a gauge), as gathered now.
fn process_sample(metrics: &Metrics, name: &str) -> Option<f64> {
    let families = metrics.registry.gather();
    let family = families.iter().find(|f| f.name() == name)?;
    let metric = family.get_metric().first()?;
    Some(match family.get_field_type() {
        prometheus::proto::MetricType::COUNTER => metric.get_counter().get_value(),
        _ => metric.get_gauge().get_value(),
    })
}

/// Seconds on a CPU-time or other clock.
fn clock_seconds(id: rustix::time::ClockId) -> f64 {
    let t = rustix::time::clock_gettime(id);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

#[test]
fn cpu_seconds_rise_with_sub_second_resolution() {
    use rustix::time::ClockId;
    let metrics = Metrics::new().expect("metrics");
    let before = process_sample(&metrics, "process_cpu_seconds_total").expect("cpu family");
    // Burn 0.3 s of this thread's CPU time (not wall time: the machine may be busy).
    let start = clock_seconds(ClockId::ThreadCPUTime);
    let mut spin = 0u64;
    while clock_seconds(ClockId::ThreadCPUTime) - start < 0.3 {
        spin = std::hint::black_box(spin.wrapping_add(1));
    }
    let process_before = clock_seconds(ClockId::ProcessCPUTime);
    let after = process_sample(&metrics, "process_cpu_seconds_total").expect("cpu family");
    let process_after = clock_seconds(ClockId::ProcessCPUTime);
    assert!(after - before >= 0.25, "{before} -> {after}");
    // The kernel's user + system ticks add up to the process CPU clock, truncated to ticks.
    assert!(
        after >= process_before - 0.05 && after <= process_after + 0.05,
        "{after} outside [{process_before}, {process_after}]"
    );
}

/// `(btime from /proc/stat, starttime ticks from /proc/self/stat)`.
fn boot_and_start_ticks() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let btime = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .expect("btime")
        .trim()
        .parse::<f64>()
        .expect("btime number");
    let own = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let after_comm = &own[own.rfind(')').expect("comm") + 1..];
    // Field 22 of proc(5); field 3 (the state) is the first after the command.
    let start = after_comm
        .split_whitespace()
        .nth(22 - 3)
        .expect("starttime")
        .parse::<f64>()
        .expect("starttime number");
    (btime, start)
}

#[test]
fn start_time_has_the_fraction_of_the_kernels_ticks() {
    use rustix::time::ClockId;
    let metrics = Metrics::new().expect("metrics");
    let value = process_sample(&metrics, "process_start_time_seconds").expect("start family");
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let (btime, start_ticks) = boot_and_start_ticks();
    let expected = btime + start_ticks / ticks;
    assert!(
        (value - expected).abs() < 0.02,
        "{value} != {expected} (btime {btime} + {start_ticks} ticks / {ticks})"
    );
    // Now minus how long the process has run (boot clock now minus its start on that clock).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    let uptime = clock_seconds(ClockId::Boottime) - start_ticks / ticks;
    assert!(
        (value - (now - uptime)).abs() < 3.0,
        "{value} vs now {now} - uptime {uptime}"
    );
}

#[test]
fn process_families_have_gos_help_and_type() {
    let metrics = Metrics::new().expect("metrics");
    let text = metrics.render();
    for (name, kind, help) in [
        (
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
        ),
        (
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
        ),
        (
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
        ),
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
        ),
        (
            "process_virtual_memory_max_bytes",
            "gauge",
            "Maximum amount of virtual memory available in bytes.",
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
        ),
        (
            "process_network_receive_bytes_total",
            "counter",
            "Number of bytes received by the process over the network.",
        ),
        (
            "process_network_transmit_bytes_total",
            "counter",
            "Number of bytes sent by the process over the network.",
        ),
    ] {
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.split([' ', '{']).any(|w| w == name))
            .collect();
        assert_eq!(lines.len(), 3, "{name}\n{text}");
        assert_eq!(lines[0], format!("# HELP {name} {help}"));
        assert_eq!(lines[1], format!("# TYPE {name} {kind}"));
        // One sample without labels, a number as Go writes it.
        let value = lines[2]
            .strip_prefix(&format!("{name} "))
            .unwrap_or_else(|| panic!("{}", lines[2]));
        let parsed: f64 = value.parse().unwrap_or_else(|_| panic!("{}", lines[2]));
        assert_eq!(value, crate::gofmt::go_float_g(parsed), "{}", lines[2]);
        assert!(parsed >= 0.0, "{}", lines[2]);
    }
    // client_golang has no such family (Go's thread count is go_threads).
    assert!(!text.contains("process_threads"), "{text}");
}
