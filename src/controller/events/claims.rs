//! Events where users look (external-attacher#363): a failing attach or
//! detach is also posted on the PersistentVolumeClaim bound to the VA's PV
//! (its `claimRef`) and on the pods on the VA's node that use that claim.
//!
//! Opt-in by RBAC ([`RBAC_FILE`]), asked once when the poster starts
//! ([`reach`]: SelfSubjectAccessReviews) and said once in the log and by
//! `csi-attacher check`: `create` on events in every namespace turns the
//! claims' Events on, `list` on pods in every namespace adds the pods'.
//!
//! At most one Event per object and reason per [`INTERVAL`] ([`Limiter`]):
//! longer than kube's Recorder keeps a series (6 minutes), so each one is a
//! new Event with the driver's message of the moment and needs only `create`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod};
use k8s_openapi::Resource as _;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::events::{Event, Recorder};
use kube::Resource as _;

use crate::controller::model::CachedPv;

/// Events on one object for one reason, at most one per this long.
pub const INTERVAL: Duration = Duration::from_secs(10 * 60);

/// The opt-in RBAC.
pub const RBAC_FILE: &str = "deploy/kubernetes/rbac-pvc-events.yaml";

/// What RBAC lets the attacher post beyond the VA's Events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reach {
    pub claims: bool,
    pub pods: bool,
}

/// What RBAC allows, and that in words (for the log and `check`).
pub async fn reach(client: &kube::Client) -> (Reach, String) {
    let asked = async {
        let claims = allowed(client, "events.k8s.io", "events", "create").await?;
        let pods = claims && allowed(client, "", "pods", "list").await?;
        Ok::<_, kube::Error>(Reach { claims, pods })
    };
    match asked.await {
        Ok(reach) => {
            let said = match (reach.claims, reach.pods) {
                (true, true) => "on",
                (true, false) => {
                    "on for PVCs, off for pods: not allowed to list pods in every namespace"
                }
                (false, _) => "off: not allowed to create Events in every namespace",
            };
            (reach, format!("{said} ({RBAC_FILE})"))
        }
        Err(err) => {
            let said = format!("off: could not ask what RBAC allows: {err}");
            (Reach::default(), said)
        }
    }
}

/// Whether RBAC allows `verb` on `group`'s `resource` in every namespace.
async fn allowed(
    client: &kube::Client,
    group: &str,
    resource: &str,
    verb: &str,
) -> Result<bool, kube::Error> {
    let attributes = serde_json::json!({"group": group, "resource": resource, "verb": verb});
    let review = serde_json::json!({"spec": {"resourceAttributes": attributes}});
    let review: SelfSubjectAccessReview =
        serde_json::from_value(review).map_err(kube::Error::SerdeError)?;
    let answer = Api::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|status| status.allowed))
}

/// What an Event on the claim bound to `pv` is about.
pub fn claim_reference(pv: &CachedPv) -> Option<ObjectReference> {
    let claim = pv.spec()?.claim_ref()?;
    Some(ObjectReference {
        api_version: Some(PersistentVolumeClaim::API_VERSION.to_owned()),
        kind: Some(PersistentVolumeClaim::KIND.to_owned()),
        namespace: Some(claim.namespace.clone()?),
        name: Some(claim.name.clone()?),
        uid: claim.uid.clone(),
        ..ObjectReference::default()
    })
}

/// When each object last had an Event for each reason.
#[derive(Debug, Default)]
pub struct Limiter {
    last: HashMap<String, Instant>,
}

impl Limiter {
    /// Whether an Event on `about` for `reason` may go at `now` (and, if so,
    /// that it went). Forgets what is older than [`INTERVAL`].
    pub fn allow(&mut self, about: &ObjectReference, reason: &str, now: Instant) -> bool {
        self.last
            .retain(|_, at| now.saturating_duration_since(*at) < INTERVAL);
        let key = format!(
            "{:?}/{:?}/{:?}/{reason}",
            about.kind, about.namespace, about.name
        );
        if self.last.contains_key(&key) {
            return false;
        }
        self.last.insert(key, now);
        true
    }
}

/// Posts `event` on `claim` and, when RBAC allows, on the pods on `node`
/// using it; each as [`Limiter`] allows.
pub async fn post(
    recorder: &Recorder,
    client: &kube::Client,
    (reach, limiter): (Reach, &mut Limiter),
    event: &Event,
    claim: &ObjectReference,
    node: &str,
) {
    let now = Instant::now();
    if !reach.claims || !limiter.allow(claim, &event.reason, now) {
        return;
    }
    let mut about = vec![claim.clone()];
    if reach.pods && !node.is_empty() {
        match users(client, claim, node).await {
            Ok(pods) => about.extend(pods.filter(|pod| limiter.allow(pod, &event.reason, now))),
            Err(err) => {
                tracing::debug!(error = %err, "Could not list the pods using a PersistentVolumeClaim")
            }
        }
    }
    for reference in &about {
        if let Err(err) = recorder.publish(event, reference).await {
            tracing::debug!(error = %err, "Could not post an Event");
        }
    }
}

/// The pods on `node` that use `claim`: one list, in the claim's namespace
/// and selected by `spec.nodeName`, so that the answer holds only the pods of
/// that namespace on that node (the API server's watch cache indexes pods by
/// node; a list of the namespace alone could carry thousands).
async fn users(
    client: &kube::Client,
    claim: &ObjectReference,
    node: &str,
) -> Result<impl Iterator<Item = ObjectReference>, kube::Error> {
    let namespace = claim.namespace.as_deref().unwrap_or_default();
    let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let list = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&params)
        .await?;
    let name = claim.name.clone().unwrap_or_default();
    let pods = list.items.into_iter().filter(move |pod| uses(pod, &name));
    Ok(pods.map(|pod| pod.object_ref(&())))
}

/// Whether a volume of `pod` is `claim`: by name, or as a generic ephemeral
/// volume (whose claim is `<pod>-<volume>`).
fn uses(pod: &Pod, claim: &str) -> bool {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let mut volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    volumes.any(|volume| {
        let named = volume.persistent_volume_claim.as_ref();
        named.is_some_and(|c| c.claim_name == claim)
            || (volume.ephemeral.is_some() && format!("{pod_name}-{}", volume.name) == claim)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(kind: &str, name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some(kind.into()),
            namespace: Some("ns".into()),
            name: Some(name.into()),
            ..ObjectReference::default()
        }
    }

    #[test]
    fn one_event_per_object_and_reason_per_interval() {
        let mut limiter = Limiter::default();
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let claim = object("PersistentVolumeClaim", "data");
        let pod = object("Pod", "data");
        let allowed = |limiter: &mut Limiter, about, reason, secs| {
            (0..3)
                .filter(|_| limiter.allow(about, reason, at(secs)))
                .count()
        };
        assert_eq!(allowed(&mut limiter, &claim, "AttachFailed", 0), 1);
        // Another reason, another object of the same name: their own.
        assert_eq!(allowed(&mut limiter, &claim, "DetachFailed", 1), 1);
        assert_eq!(allowed(&mut limiter, &pod, "AttachFailed", 1), 1);
        let last = INTERVAL.as_secs() - 1;
        assert_eq!(allowed(&mut limiter, &claim, "AttachFailed", last), 0);
        assert_eq!(allowed(&mut limiter, &claim, "AttachFailed", last + 1), 1);
        // What is older than the interval is forgotten.
        assert_eq!(limiter.last.len(), 3);
        limiter.allow(&claim, "AttachFailed", at(3 * INTERVAL.as_secs()));
        assert_eq!(limiter.last.len(), 1);
    }

    #[test]
    fn a_pod_uses_a_claim_by_name_or_as_its_ephemeral_volume() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "ns"},
            "spec": {"containers": [], "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}},
                {"name": "scratch", "ephemeral": {}},
                {"name": "config", "configMap": {"name": "data"}},
            ]},
        }))
        .expect("pod");
        assert!(uses(&pod, "data-web-0"));
        assert!(uses(&pod, "web-0-scratch"));
        assert!(!uses(&pod, "data"));
        assert!(!uses(&pod, "web-0-config"));
        assert!(!uses(&Pod::default(), ""));
    }

    #[test]
    fn the_claim_is_the_bound_one_with_its_uid() {
        let pv = |claim: serde_json::Value| -> CachedPv {
            serde_json::from_value(json!({"metadata": {"name": "pv"}, "spec": {"claimRef": claim}}))
                .expect("pv")
        };
        let bound = pv(
            json!({"kind": "PersistentVolumeClaim", "namespace": "ns", "name": "data", "uid": "u"}),
        );
        let expected = ObjectReference {
            api_version: Some("v1".into()),
            uid: Some("u".into()),
            ..object("PersistentVolumeClaim", "data")
        };
        assert_eq!(claim_reference(&bound), Some(expected));
        assert_eq!(claim_reference(&pv(json!({"name": "data"}))), None);
        assert_eq!(claim_reference(&CachedPv::default()), None);
    }
}
