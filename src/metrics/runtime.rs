//! `csi_attacher_runtime_alive_tasks`: the tasks alive on the runtime that
//! runs the controller, read at each scrape. A leak of tasks (a watch, a
//! timer or a call that is never dropped) shows as a line that keeps
//! rising; `hack/soak.sh` asserts it plateaus.

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntGauge, Registry};
use tokio::runtime::Handle;

/// Reads the alive tasks of `handle`'s runtime when gathered.
struct AliveTasks {
    handle: Handle,
    gauge: IntGauge,
}

impl Collector for AliveTasks {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let alive = self.handle.metrics().num_alive_tasks();
        self.gauge.set(i64::try_from(alive).unwrap_or(i64::MAX));
        self.gauge.collect()
    }
}

/// Registers the gauge for the runtime this is called on; outside a runtime
/// there is none to read, and nothing is registered.
pub(super) fn register_alive_tasks(registry: &Registry) -> prometheus::Result<()> {
    let Ok(handle) = Handle::try_current() else {
        return Ok(());
    };
    let gauge = IntGauge::new(
        "csi_attacher_runtime_alive_tasks",
        "Tasks alive on the runtime that runs the controller (watches, workers, timers, calls in flight).",
    )?;
    // A name clash is impossible with the fixed name here; a missing family is
    // better than a sidecar that does not start.
    let _ = registry.register(Box::new(AliveTasks { handle, gauge }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_gauge_counts_the_runtimes_tasks_at_each_scrape() {
        let registry = Registry::new();
        register_alive_tasks(&registry).expect("registered");
        let read = |registry: &Registry| {
            let families = registry.gather();
            families
                .iter()
                .find(|f| f.name() == "csi_attacher_runtime_alive_tasks")
                .map(|f| f.get_metric()[0].get_gauge().get_value())
        };
        let before = read(&registry).expect("registered inside a runtime");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let tasks: Vec<_> = (0..5)
            .map(|_| tokio::spawn(async {}))
            .chain([tokio::spawn(async move {
                let _ = stopped.await;
            })])
            .collect();
        let during = read(&registry).expect("gauge");
        assert!(during >= before + 1.0, "{before} -> {during}");
        let _ = stop.send(());
        for task in tasks {
            let _ = task.await;
        }
        assert_eq!(read(&registry), Some(before));
    }

    #[test]
    fn outside_a_runtime_nothing_is_registered() {
        let registry = Registry::new();
        register_alive_tasks(&registry).expect("registered");
        assert!(registry.gather().is_empty());
    }
}
