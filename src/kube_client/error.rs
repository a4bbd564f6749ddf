//! The error of building an API client, and [`error_chain`], which renders
//! any error with the causes its text leaves out.

use super::proxy;

/// Why no API client could be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot use kubeconfig {path:?}: {source}")]
    Kubeconfig {
        /// The `--kubeconfig` path.
        path: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("cannot load in-cluster configuration (set --kubeconfig outside a cluster): {0}")]
    InCluster(#[source] kube::config::InClusterError),
    #[error("cannot build the Kubernetes client: {0}")]
    Build(#[source] kube::Error),
    #[error("cannot use the proxy settings: {0}")]
    Proxy(#[from] proxy::Error),
}

/// `err` and the sources its text does not already show, joined by `: `.
///
/// kube's errors name their cause's top line only ("ServiceError: client
/// error (Connect)"); why the connection failed (a refused CONNECT, a TLS
/// error) is further down the chain.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(source) = next {
        let part = source.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        next = source.source();
    }
    text
}
