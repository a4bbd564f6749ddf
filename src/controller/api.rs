//! The Kubernetes writes (and the one read, Secrets) the flows need.
//!
//! PATCH only, never UPDATE; no resourceVersion preconditions except the
//! JSON-patch `test` ops on PV finalizers (UPSTREAM-BEHAVIOR §4.6).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolume, Secret};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, Patch, PatchParams};
use serde_json::Value;

use super::error::ApiError;

/// API access for the flows; cheap to clone.
#[derive(Clone)]
pub struct KubeApi {
    client: kube::Client,
    vas: Api<VolumeAttachment>,
    pvs: Api<PersistentVolume>,
}

impl KubeApi {
    /// Wraps a (throttled) client.
    pub fn new(client: kube::Client) -> Self {
        Self {
            vas: Api::all(client.clone()),
            pvs: Api::all(client.clone()),
            client,
        }
    }

    /// Merge patch on a VA's main resource; returns the VA as written.
    pub async fn patch_va(&self, name: &str, body: &Value) -> Result<VolumeAttachment, ApiError> {
        self.vas
            .patch(name, &PatchParams::default(), &Patch::Merge(body))
            .await
            .map_err(ApiError)
    }

    /// Merge patch on a VA's `/status`.
    pub async fn patch_va_status(
        &self,
        name: &str,
        body: &Value,
    ) -> Result<VolumeAttachment, ApiError> {
        self.vas
            .patch_status(name, &PatchParams::default(), &Patch::Merge(body))
            .await
            .map_err(ApiError)
    }

    /// JSON Patch on a PV.
    pub async fn patch_pv(
        &self,
        name: &str,
        patch: json_patch::Patch,
    ) -> Result<PersistentVolume, ApiError> {
        self.pvs
            .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await
            .map_err(ApiError)
    }

    /// GETs a Secret and returns its data as strings (never logged).
    pub async fn secret_data(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<BTreeMap<String, String>, ApiError> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let secret = secrets.get(name).await.map_err(ApiError)?;
        Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect())
    }
}
