//! Waiting on VolumeAttachments: a watch of one run's VAs that notes when each
//! was first seen attached, and gone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};

use crate::k8s::selector;

/// Seconds since the epoch, as the mock driver's call log has them.
pub fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// Watches the VAs of one run: when each was first seen attached, and gone.
pub struct Tracker {
    state: Arc<Mutex<TrackState>>,
    changes: tokio::sync::watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
pub struct TrackState {
    attached: HashMap<String, f64>,
    gone: HashMap<String, f64>,
}

impl Tracker {
    /// Starts the watch and returns once its initial list is in.
    pub async fn start(vas: Api<VolumeAttachment>, run: &str) -> Result<Self> {
        let state = Arc::new(Mutex::new(TrackState::default()));
        let (tx, changes) = tokio::sync::watch::channel(0u64);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let config = watcher::Config::default().labels(&selector(run));
        let task_state = state.clone();
        let task = tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut events = std::pin::pin!(watcher::watcher(vas, config));
            while let Some(event) = events.next().await {
                let now = now_unix();
                let Ok(event) = event else { continue };
                {
                    let mut s = task_state.lock().unwrap_or_else(|e| e.into_inner());
                    match &event {
                        Event::Apply(va) | Event::InitApply(va) => {
                            if va.status.as_ref().is_some_and(|st| st.attached) {
                                let name = va.metadata.name.clone().unwrap_or_default();
                                s.attached.entry(name).or_insert(now);
                            }
                        }
                        Event::Delete(va) => {
                            let name = va.metadata.name.clone().unwrap_or_default();
                            s.gone.entry(name).or_insert(now);
                        }
                        Event::InitDone => {
                            if let Some(r) = ready.take() {
                                let _ = r.send(());
                            }
                        }
                        Event::Init => {}
                    }
                }
                tx.send_modify(|n| *n += 1);
            }
        });
        tokio::time::timeout(Duration::from_secs(30), ready_rx)
            .await
            .context("watch did not start")??;
        Ok(Self {
            state,
            changes,
            task,
        })
    }

    async fn wait(
        &mut self,
        what: &str,
        deadline: Duration,
        done: impl Fn(&TrackState) -> bool,
    ) -> Result<()> {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            if done(&self.state.lock().unwrap_or_else(|e| e.into_inner())) {
                return Ok(());
            }
            if tokio::time::timeout_at(until, self.changes.changed())
                .await
                .is_err()
            {
                bail!("timed out after {deadline:?} waiting for {what}");
            }
        }
    }

    /// Until VA `name` was seen attached.
    pub async fn attached(&mut self, what: &str, deadline: Duration, name: &str) -> Result<()> {
        self.wait(what, deadline, |s| s.attached.contains_key(name))
            .await
    }

    /// Until `count` VAs were seen attached.
    pub async fn attached_count(
        &mut self,
        what: &str,
        deadline: Duration,
        count: usize,
    ) -> Result<()> {
        self.wait(what, deadline, |s| s.attached.len() >= count)
            .await
    }

    /// Until VA `name` is gone.
    pub async fn gone(&mut self, what: &str, deadline: Duration, name: &str) -> Result<()> {
        self.wait(what, deadline, |s| s.gone.contains_key(name))
            .await
    }

    /// Until `count` VAs are gone.
    pub async fn gone_count(&mut self, what: &str, deadline: Duration, count: usize) -> Result<()> {
        self.wait(what, deadline, |s| s.gone.len() >= count).await
    }

    /// When VA `name` was first seen attached (unix seconds).
    pub fn attached_at(&self, name: &str) -> Option<f64> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .attached
            .get(name)
            .copied()
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Polls `check` every 20 ms until it yields or `timeout` passes.
pub async fn poll_until<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
