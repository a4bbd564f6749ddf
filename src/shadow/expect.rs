//! What we would do with one VolumeAttachment, and where the active
//! attacher's result (as the objects show it) differs from that.
//!
//! [`predict`] runs our own decision ([`decide`]) and plans the Publish (or
//! Unpublish) request from the caches ([`request::plan`], [`NodeIds`]); the
//! secret is named, never read. [`compare`] is pure: the VA as it is now,
//! what we predicted before the active attacher acted, and whether the PV
//! carries our finalizer, in; the findings out.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::controller::error::FlowError;
use crate::controller::flows::node_id::{Lookup, NodeIds};
use crate::controller::flows::request::{self, SecretName};
use crate::controller::flows::source::{self, Source};
use crate::controller::model::names::NODE_ID_ANNOTATION;
use crate::controller::model::store::Stores;
use crate::controller::model::CachedVa;
use crate::controller::seams::cluster::KubeApi;
use crate::controller::sync::decide::{decide, Step, Trigger};
use crate::csi::proto::volume_capability::AccessType;
use crate::csi::Capabilities;

/// The contract's anchors of the deliberate differences shadow mode knows.
pub const ERROR_CODE_ANCHOR: &str = "docs/contract.md#smaller-differences";
/// Unpublish from the recorded node ID as well.
pub const UNPUBLISH_ANCHOR: &str = "docs/contract.md#unpublish-at-the-right-node";

/// The highest gRPC code; ours records any other number as `Unknown` (2).
const MAX_GRPC_CODE: i32 = 16;

/// A kind of divergence (the `kind` label of the metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// One side attached (or reached the driver) where the other failed before it.
    Outcome,
    /// Both failed before the driver, with different texts.
    ErrorText,
    /// The `errorCode` (and code name) we would record differ.
    ErrorCode,
    /// Our finalizer on the VA: missing where we would add it, or present
    /// where we would add none.
    Finalizer,
    /// Our finalizer missing on the attached VA's PV.
    PvFinalizer,
    /// The node ID recorded on the VA is not the one we would publish to.
    NodeId,
    /// `attachmentMetadata` is not the publish context recorded at attach:
    /// changed while attached, or left on a VA that is not attached.
    Metadata,
    /// `attached` and the driver's published nodes disagree.
    Published,
    /// A detached volume is still published on a node ID we would have
    /// unpublished it from.
    StillPublished,
}

impl Kind {
    /// Every kind, for the metric's zero samples.
    pub const ALL: &'static [Kind] = &[
        Kind::Outcome,
        Kind::ErrorText,
        Kind::ErrorCode,
        Kind::Finalizer,
        Kind::PvFinalizer,
        Kind::NodeId,
        Kind::Metadata,
        Kind::Published,
        Kind::StillPublished,
    ];

    /// The metric label and JSON name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Outcome => "outcome",
            Kind::ErrorText => "error_text",
            Kind::ErrorCode => "error_code",
            Kind::Finalizer => "finalizer",
            Kind::PvFinalizer => "pv_finalizer",
            Kind::NodeId => "node_id",
            Kind::Metadata => "metadata",
            Kind::Published => "published",
            Kind::StillPublished => "still_published",
        }
    }
}

/// One difference between what we would do and what the objects show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Its kind.
    pub kind: Kind,
    /// What we would have done or written.
    pub expected: String,
    /// What the active attacher did, as seen.
    pub observed: String,
    /// The contract's anchor when we differ there on purpose.
    pub deliberate: Option<&'static str>,
}

/// The Publish request we would send (the secret by name only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedPublish {
    /// `volume_id`.
    pub volume_id: String,
    /// `node_id`: the CSINode's.
    pub node_id: String,
    /// `volume_capability.access_mode`, as CSI names it.
    pub access_mode: String,
    /// `block`, or `mount` with its fsType.
    pub access_type: String,
    /// Mount flags (mount volumes).
    pub mount_flags: Vec<String>,
    /// `readonly`.
    pub readonly: bool,
    /// `volume_context`.
    pub volume_context: BTreeMap<String, String>,
    /// The publish secret, when the volume names one.
    pub secret: Option<SecretName>,
    /// A node ID recorded on the VA that differs from the CSINode's: we
    /// would unpublish there first.
    pub unpublish_first: Option<String>,
}

/// The Unpublish calls we would make.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedUnpublish {
    /// `volume_id`.
    pub volume_id: String,
    /// Every node ID we would unpublish from, the recorded one first.
    pub node_ids: Vec<String>,
    /// The node ID the VA recorded at Publish.
    pub recorded: Option<String>,
}

/// What we would do with a VA now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Prediction {
    /// Our decision (`Nothing`, `MarkAttached`, `Attach`, `Detach`, `Fail`).
    pub step: String,
    /// For a live VA of a driver with ControllerPublish: the request, or
    /// the error we would record before calling the driver.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub publish: Option<Result<PlannedPublish, String>>,
    /// For a VA being deleted: the Unpublish calls, or the error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unpublish: Option<Result<PlannedUnpublish, String>>,
}

/// What shadow mode reads to predict.
pub struct Inputs<'a> {
    /// The caches.
    pub stores: &'a Stores,
    /// GETs on a cache miss (a PV of another driver, a CSINode not cached
    /// yet); `None`: the caches only.
    pub api: Option<&'a KubeApi>,
    /// Driver name.
    pub driver: &'a str,
    /// Our finalizer.
    pub finalizer: &'a str,
    /// The driver's capabilities.
    pub capabilities: &'a Capabilities,
    /// `--default-fstype`.
    pub default_fs_type: &'a str,
}

/// Our decision for `va` and the request it would lead to.
pub async fn predict(va: &CachedVa, inputs: &Inputs<'_>) -> Prediction {
    let step = decide(
        Some(va),
        inputs.finalizer,
        inputs.capabilities,
        Trigger::Event,
    );
    let step_name = match &step {
        Step::Nothing => "Nothing",
        Step::MarkAttached => "MarkAttached",
        Step::Attach => "Attach",
        Step::Republish => "Republish",
        Step::Detach => "Detach",
        Step::Fail(..) => "Fail",
    };
    let mut prediction = Prediction {
        step: step_name.to_string(),
        publish: None,
        unpublish: None,
    };
    if !inputs.capabilities.attach_required() {
        return prediction;
    }
    if let Step::Fail(_, err) = &step {
        let failed = err.status_message();
        if va.is_deleting() {
            prediction.unpublish = Some(Err(failed));
        } else {
            prediction.publish = Some(Err(failed));
        }
        return prediction;
    }
    if va.is_deleting() {
        prediction.unpublish = Some(plan_unpublish(va, inputs).await);
    } else {
        prediction.publish = Some(plan_publish(va, inputs).await);
    }
    prediction
}

/// [`source::resolve_or_get`] with the shadow's read-only client.
async fn resolve<'a>(va: &'a CachedVa, inputs: &Inputs<'_>) -> Result<Source<'a>, FlowError> {
    let resolved = source::resolve(va, inputs.stores);
    let Some(api) = inputs.api else {
        return resolved;
    };
    match resolved {
        Err(FlowError::PvNotFound(name)) => match api.pv(&name).await {
            Ok(Some(pv)) => Ok(Source::Pv(std::sync::Arc::new(pv))),
            Ok(None) => Err(FlowError::PvNotFound(name)),
            Err(source) => Err(FlowError::GetPv { name, source }),
        },
        other => other,
    }
}

/// The attach flow's checks and request, in its order, without its writes.
async fn plan_publish(va: &CachedVa, inputs: &Inputs<'_>) -> Result<PlannedPublish, String> {
    let fail = |err: FlowError| err.status_message();
    let source = resolve(va, inputs).await.map_err(fail)?;
    if let Source::Pv(pv) = &source {
        if pv.is_deleting() {
            return Err(fail(FlowError::PvDeleting(pv.name().to_string())));
        }
    }
    let plan = request::plan(&source, inputs.default_fs_type, inputs.capabilities).map_err(fail)?;
    let node_ids = match inputs.api {
        Some(api) => {
            NodeIds::look_up(
                va,
                &inputs.stores.csinodes,
                api,
                inputs.driver,
                Lookup::CacheThenApi,
            )
            .await
        }
        None => NodeIds::cached(va, &inputs.stores.csinodes, inputs.driver),
    };
    let (node_id, stale) = node_ids.to_publish().map_err(fail)?;
    let request = plan.request(node_id, BTreeMap::new());
    let capability = request.volume_capability.clone().unwrap_or_default();
    let access_mode = capability
        .access_mode
        .map(|m| m.mode().as_str_name().to_string())
        .unwrap_or_default();
    let (access_type, mount_flags) = match capability.access_type {
        Some(AccessType::Block(_)) => ("block".to_string(), Vec::new()),
        Some(AccessType::Mount(mount)) => (format!("mount:{}", mount.fs_type), mount.mount_flags),
        None => (String::new(), Vec::new()),
    };
    Ok(PlannedPublish {
        volume_id: request.volume_id,
        node_id: request.node_id,
        access_mode,
        access_type,
        mount_flags,
        readonly: request.readonly,
        volume_context: request.volume_context.into_iter().collect(),
        secret: plan.secret(),
        unpublish_first: stale,
    })
}

/// The detach flow's checks and node IDs, without its calls.
async fn plan_unpublish(va: &CachedVa, inputs: &Inputs<'_>) -> Result<PlannedUnpublish, String> {
    let fail = |err: FlowError| err.status_message();
    let source = resolve(va, inputs).await.map_err(fail)?;
    let volume = source.csi_volume().map_err(fail)?;
    let ids = NodeIds::cached(va, &inputs.stores.csinodes, inputs.driver);
    let recorded = ids.recorded.clone().filter(|id| !id.is_empty());
    let node_ids = ids.to_unpublish().map_err(fail)?;
    Ok(PlannedUnpublish {
        volume_id: volume.csi.volume_handle.to_string(),
        node_ids,
        recorded,
    })
}

/// Whether an error text is the driver's answer (`rpc error: code = …`):
/// shadow mode does not call the driver, so it cannot know that answer.
pub fn is_driver_error(message: &str) -> bool {
    message.starts_with("rpc error: code = ")
}

/// The error code we would record for a driver error the active attacher
/// recorded with `code` (and `message`), when it differs: gRPC codes above
/// 16 are `Unknown` (2) for us, gRPC-Go keeps the number.
fn our_error_code(code: Option<i32>, message: &str) -> Option<Finding> {
    let foreign = code.is_some_and(|c| !(0..=MAX_GRPC_CODE).contains(&c));
    let named = message.contains("code = Code(");
    if !foreign && !named {
        return None;
    }
    let ours = message
        .split_once("code = Code(")
        .and_then(|(head, rest)| {
            rest.split_once(')')
                .map(|(_, tail)| format!("{head}code = Unknown{tail}"))
        })
        .unwrap_or_else(|| message.to_string());
    Some(Finding {
        kind: Kind::ErrorCode,
        expected: format!("errorCode 2 (Unknown), message {ours:?}"),
        observed: format!(
            "errorCode {}, message {message:?}",
            code.map_or("none".to_string(), |c| c.to_string())
        ),
        deliberate: Some(ERROR_CODE_ANCHOR),
    })
}

/// What the objects show against what we predicted.
pub struct Observed<'a> {
    /// The VA now.
    pub va: &'a CachedVa,
    /// Our finalizer.
    pub finalizer: &'a str,
    /// Whether the driver has ControllerPublish.
    pub attach_required: bool,
    /// Our prediction from before the active attacher attached the VA (the
    /// latest made while it was not attached), else the current one.
    pub before_attach: Option<&'a Prediction>,
    /// Our prediction now.
    pub now: &'a Prediction,
    /// Whether the VA's PV carries our finalizer (`None`: no PV, or not cached).
    pub pv_has_finalizer: Option<bool>,
    /// `attachmentMetadata` as first seen with `attached=true` (empty: none);
    /// `None` before that.
    pub attached_metadata: Option<&'a [(String, String)]>,
}

/// A finding where we differ by accident (no contract anchor).
fn finding(kind: Kind, expected: impl Into<String>, observed: impl Into<String>) -> Finding {
    Finding {
        kind,
        expected: expected.into(),
        observed: observed.into(),
        deliberate: None,
    }
}

/// The findings for one VA as it is now.
pub fn compare(observed: &Observed<'_>) -> Vec<Finding> {
    let va = observed.va;
    let ours = va.has_finalizer(observed.finalizer);
    if !observed.attach_required {
        return if ours {
            vec![finding(
                Kind::Finalizer,
                "no finalizer (the driver has no ControllerPublish)",
                format!("finalizer {}", observed.finalizer),
            )]
        } else {
            Vec::new()
        };
    }
    if va.is_deleting() {
        return compare_deleting(observed, ours).into_iter().collect();
    }
    let plan = observed
        .before_attach
        .unwrap_or(observed.now)
        .publish
        .as_ref();
    match plan {
        None => Vec::new(),
        Some(plan) if va.attached() => compare_attached(observed, ours, plan),
        Some(plan) => compare_not_attached(observed, ours, plan),
    }
}

/// A VA being deleted: its detach error, when it is not the driver's.
fn compare_deleting(observed: &Observed<'_>, ours: bool) -> Option<Finding> {
    let error = observed.va.status().and_then(|s| s.detach_error())?;
    let Some(Ok(plan)) = &observed.now.unpublish else {
        return None;
    };
    let message = error.message.clone().unwrap_or_default();
    (ours && !is_driver_error(&message) && !message.starts_with("failed to load secret")).then(
        || {
            finding(
                Kind::Outcome,
                format!("Unpublish {} from {:?}", plan.volume_id, plan.node_ids),
                format!("detachError {message:?}"),
            )
        },
    )
}

/// The metadata the VA's status holds.
fn metadata<'a>(observed: &Observed<'a>) -> &'a [(String, String)] {
    observed
        .va
        .status()
        .and_then(|s| s.attachment_metadata())
        .unwrap_or_default()
}

/// An attached VA: what had to come before Publish, and the metadata.
fn compare_attached(
    observed: &Observed<'_>,
    ours: bool,
    plan: &Result<PlannedPublish, String>,
) -> Vec<Finding> {
    let fin = observed.finalizer;
    let mut out = Vec::new();
    match plan {
        Err(err) => out.push(finding(
            Kind::Outcome,
            format!("no Publish: {err}"),
            "attached=true",
        )),
        Ok(publish) => {
            if !ours {
                out.push(finding(
                    Kind::Finalizer,
                    format!("finalizer {fin} on the VA before Publish"),
                    "attached=true without it",
                ));
            }
            if observed.pv_has_finalizer == Some(false) {
                out.push(finding(
                    Kind::PvFinalizer,
                    format!("finalizer {fin} on the PV before Publish"),
                    "attached=true, the PV without it",
                ));
            }
            let recorded = observed.va.annotation(NODE_ID_ANNOTATION);
            if recorded != Some(publish.node_id.as_str()) {
                out.push(node_id_finding(publish, recorded));
            }
        }
    }
    // We write the driver's publish context as it is; the driver gives a
    // publication the same one every time.
    let metadata = metadata(observed);
    if let Some(first) = observed
        .attached_metadata
        .filter(|first| *first != metadata)
    {
        out.push(finding(
            Kind::Metadata,
            format!(
                "attachmentMetadata {:?} (the publish context recorded at attach)",
                Pairs(first)
            ),
            format!("attachmentMetadata {:?}", Pairs(metadata)),
        ));
    }
    out
}

/// A VA not attached (yet): no metadata, our node ID, the attach error.
fn compare_not_attached(
    observed: &Observed<'_>,
    ours: bool,
    plan: &Result<PlannedPublish, String>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let metadata = metadata(observed);
    if !metadata.is_empty() {
        out.push(finding(
            Kind::Metadata,
            "no attachmentMetadata on a VA that is not attached",
            format!("attachmentMetadata {:?}", Pairs(metadata)),
        ));
    }
    if let (Ok(publish), Some(recorded)) = (plan, observed.va.annotation(NODE_ID_ANNOTATION)) {
        if ours && recorded != publish.node_id {
            out.push(node_id_finding(publish, Some(recorded)));
        }
    }
    let Some(error) = observed.va.status().and_then(|s| s.attach_error()) else {
        return out;
    };
    let message = error.message.clone().unwrap_or_default();
    out.extend(our_error_code(error.error_code, &message));
    match plan {
        Err(err) if is_driver_error(&message) => out.push(finding(
            Kind::Outcome,
            format!("no Publish: {err}"),
            format!("the driver called: {message:?}"),
        )),
        Err(err) if *err != message => out.push(finding(
            Kind::ErrorText,
            format!("attachError {err:?}"),
            format!("attachError {message:?}"),
        )),
        Err(_) => {}
        Ok(_) if is_driver_error(&message) => {}
        // Shadow mode names the secret, it does not read it.
        Ok(publish) if publish.secret.is_some() && message.starts_with("failed to load secret") => {
        }
        Ok(publish) => out.push(finding(
            Kind::Outcome,
            format!("Publish {} to node {}", publish.volume_id, publish.node_id),
            format!("attachError {message:?}"),
        )),
    }
    out
}

/// Pairs shown as a map: `{"k": "v"}`.
struct Pairs<'a>(&'a [(String, String)]);

impl std::fmt::Debug for Pairs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| (k, v)))
            .finish()
    }
}

fn node_id_finding(publish: &PlannedPublish, recorded: Option<&str>) -> Finding {
    Finding {
        kind: Kind::NodeId,
        expected: format!("node ID {} (the CSINode's)", publish.node_id),
        observed: match recorded {
            Some(id) => format!("node ID {id} recorded on the VA"),
            None => "no node ID recorded on the VA".into(),
        },
        deliberate: None,
    }
}

/// A detached volume still published on one of the node IDs we would have
/// unpublished it from (`csinode`: the CSINode's ID when the VA was seen last).
pub fn still_published(plan: &PlannedUnpublish, node_id: &str) -> Finding {
    let deliberate = (plan.recorded.as_deref() == Some(node_id) && plan.node_ids.len() > 1)
        .then_some(UNPUBLISH_ANCHOR);
    Finding {
        kind: Kind::StillPublished,
        expected: format!("Unpublish {} from {:?}", plan.volume_id, plan.node_ids),
        observed: format!(
            "the driver lists {} on node {node_id} after the detach",
            plan.volume_id
        ),
        deliberate,
    }
}

#[cfg(test)]
mod tests;
