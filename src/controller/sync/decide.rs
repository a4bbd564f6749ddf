//! What one sync of a VolumeAttachment does next: a pure function of the VA,
//! the driver's capabilities and whether the reconciler forced the sync.
//!
//! The flows ([`crate::controller::flows::attach`], [`crate::controller::flows::detach`], [`crate::controller::flows::trivial`])
//! execute the step; nothing here does I/O.

use crate::controller::error::FlowError;
use crate::controller::model::{CachedVa, Lane};
pub use crate::controller::queue::Trigger;
use crate::csi::Capabilities;

/// The next step for one VA.
#[derive(Debug)]
pub enum Step {
    /// Nothing to do.
    Nothing,
    /// Write `attached=true` without a driver call (driver without
    /// ControllerPublish).
    MarkAttached,
    /// Run the attach flow.
    Attach,
    /// Run the attach flow again for a VA that says attached, after checking
    /// with the API server that it still exists.
    Republish,
    /// Run the detach flow.
    Detach,
    /// Fail with this error (saved on the VA for its lane's flow).
    Fail(FlowError),
}

/// The step for `va`, a VA in the cache.
pub fn decide(
    va: &CachedVa,
    finalizer: &str,
    capabilities: &Capabilities,
    trigger: Trigger,
) -> Step {
    let forced = trigger == Trigger::Reconciler;
    let attached = va.attached();
    let ours = va.has_finalizer(finalizer);
    let lane = Lane::of_va(va);
    let source_error = match (va.pv_name(), va.inline_spec()) {
        (Some(_), Some(_)) => Some(FlowError::BothSources),
        (None, None) => Some(FlowError::NoSource),
        _ => None,
    };
    match (capabilities.attach_required(), lane, source_error) {
        // The driver has no ControllerPublish: a VA is attached by saying so,
        // and a deleted one needs nothing (no finalizer was ever added).
        (false, _, _) if attached => Step::Nothing,
        (false, _, _) => Step::MarkAttached,
        // Attached already, and the driver did not say otherwise.
        (true, Lane::Attach, _) if attached && !forced => Step::Nothing,
        // Attached, but the driver does not list the volume on the node:
        // publish again, if the VA still exists.
        (true, Lane::Attach, _) if attached => Step::Republish,
        // Deleted, and our finalizer is not there: detached already, or never
        // attached by us; unless the driver still lists the volume published.
        (true, Lane::Detach, _) if !ours && !forced => Step::Nothing,
        // The source names both or neither kind of volume: the flow would
        // fail there before any other request; say so on the VA.
        (true, _, Some(err)) => Step::Fail(err),
        (true, Lane::Detach, None) => Step::Detach,
        (true, Lane::Attach, None) => Step::Attach,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FIN: &str = "external-attacher/d";

    fn caps(attach: bool) -> Capabilities {
        Capabilities {
            controller_service: attach,
            publish_unpublish: attach,
            ..Capabilities::default()
        }
    }

    fn va(attached: bool, deleting: bool, ours: bool, source: serde_json::Value) -> CachedVa {
        let mut meta = json!({"name": "va"});
        if deleting {
            meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        if ours {
            meta["finalizers"] = json!([FIN]);
        }
        serde_json::from_value(json!({
            "metadata": meta,
            "spec": {"attacher": "d", "nodeName": "n", "source": source},
            "status": {"attached": attached},
        }))
        .expect("va")
    }

    fn step(va: &CachedVa, attach: bool, trigger: Trigger) -> String {
        format!("{:?}", decide(va, FIN, &caps(attach), trigger))
    }

    fn source(kind: &str) -> serde_json::Value {
        match kind {
            "pv" => json!({"persistentVolumeName": "pv"}),
            "both" => json!({"persistentVolumeName": "pv", "inlineVolumeSpec": {}}),
            _ => json!({}),
        }
    }

    /// (attached, deleting, our finalizer, source kind).
    type VaShape = (bool, bool, bool, &'static str);

    /// A VA's shape with (attach capability, trigger) → step.
    #[test]
    fn one_step_per_case() {
        use Trigger::*;
        #[rustfmt::skip]
        let cases: &[(VaShape, bool, Trigger, &str)] = &[
            // Without ControllerPublish: attached by saying so, whatever else.
            ((false, false, false, "pv"), false, Event, "MarkAttached"),
            ((true, false, false, "pv"), false, Reconciler, "Nothing"),
            ((false, true, false, "pv"), false, Event, "MarkAttached"),
            ((false, false, false, "both"), false, Event, "MarkAttached"),
            // Live VAs.
            ((false, false, false, "pv"), true, Event, "Attach"),
            ((true, false, true, "pv"), true, Event, "Nothing"),
            ((true, false, true, "pv"), true, Reconciler, "Republish"),
            ((false, false, true, "pv"), true, Reconciler, "Attach"),
            ((false, false, false, "both"), true, Event, "Fail(BothSources)"),
            // Deleted VAs.
            ((true, true, true, "pv"), true, Event, "Detach"),
            ((false, true, false, "pv"), true, Event, "Nothing"),
            ((false, true, false, "pv"), true, Reconciler, "Detach"),
            ((false, true, true, "none"), true, Event, "Fail(NoSource)"),
            ((false, true, false, "none"), true, Event, "Nothing"),
        ];
        for (i, ((attached, deleting, ours, kind), attach, trigger, want)) in
            cases.iter().enumerate()
        {
            let va = va(*attached, *deleting, *ours, source(kind));
            assert_eq!(step(&va, *attach, *trigger), *want, "case {i}");
        }
    }
}
