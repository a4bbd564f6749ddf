//! Lease reads and writes: the [`LeaseApi`] the elector drives, and
//! [`KubeLeases`], its implementation on the API server.

use std::future::Future;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use kube::runtime::{watcher, WatchStreamExt};

/// The Lease API the elector needs; a trait so the state machine can be tested.
pub trait LeaseApi: Send + Sync {
    /// GET the lease (`None` if it does not exist).
    fn get(&self) -> impl Future<Output = Result<Option<Lease>, kube::Error>> + Send;
    fn create(&self, lease: &Lease) -> impl Future<Output = Result<Lease, kube::Error>> + Send;
    /// REPLACE the lease (with its resourceVersion: 409 when stale).
    fn replace(&self, lease: &Lease) -> impl Future<Output = Result<Lease, kube::Error>> + Send;
}

/// [`LeaseApi`] on the API server.
pub struct KubeLeases {
    api: Api<Lease>,
    name: String,
}

impl KubeLeases {
    /// Leases called `name` in `namespace`, through `client` (not throttled by --kube-api-qps).
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
        }
    }

    /// Resolves on every change of the Lease (for a standby waiting to take over).
    pub fn changes(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        // With backoff: without it a failing watch (API outage, no RBAC)
        // retries in a hot loop, a request per millisecond.
        watcher::watcher(self.api.clone(), config)
            .default_backoff()
            .filter_map(|event| async move {
                match event {
                    Ok(watcher::Event::Init | watcher::Event::InitDone) => None,
                    // InitApply too: a Lease created between our GET and the watch start counts.
                    Ok(_) => Some(()),
                    Err(err) => {
                        tracing::debug!(error = %err, "Lease watch failed; retrying");
                        None
                    }
                }
            })
    }
}

impl LeaseApi for KubeLeases {
    async fn get(&self) -> Result<Option<Lease>, kube::Error> {
        self.api.get_opt(&self.name).await
    }

    async fn create(&self, lease: &Lease) -> Result<Lease, kube::Error> {
        self.api.create(&PostParams::default(), lease).await
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, kube::Error> {
        self.api
            .replace(&self.name, &PostParams::default(), lease)
            .await
    }
}
