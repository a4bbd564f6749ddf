//! Why one attach, detach or PV-finalizer attempt did not finish.
//! Contract: `docs/contract.md#error-texts`.
//!
//! Display texts are upstream's where upstream writes them into
//! `attachError`/`detachError` (as upstream external-attacher v4.12).

use crate::controller::flows::capability::CapabilityError;
use crate::csi::RpcStatus;

/// A Kubernetes API error, shown like Go's `err.Error()`: the Status message.
#[derive(Debug, thiserror::Error)]
#[error("{}", go_text(.0))]
pub struct ApiError(#[source] pub kube::Error);

fn go_text(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        other => other.to_string(),
    }
}

impl ApiError {
    /// Whether the server refused the object as invalid (422): retrying the same write cannot help.
    pub fn is_invalid(&self) -> bool {
        matches!(&self.0, kube::Error::Api(s) if s.code == 422)
    }

    /// Whether the server said 404.
    pub fn is_not_found(&self) -> bool {
        matches!(&self.0, kube::Error::Api(s) if s.code == 404)
    }

    /// Whether the server refused a VA patch because the object of that name
    /// has another UID (deleted and re-created): 422 on `metadata.uid`.
    pub fn is_replaced(&self) -> bool {
        matches!(&self.0, kube::Error::Api(s) if s.code == 422 && s.message.contains("metadata.uid"))
    }
}

/// Why a Secret's data could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The GET failed.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// A value is not UTF-8: CSI secrets are strings. The value is never shown.
    #[error("the value of key {0:?} is not valid UTF-8 (CSI secrets are strings)")]
    NotUtf8(String),
}

/// One failed step of a flow; the variant names the step.
#[derive(Debug, thiserror::Error)]
pub enum FlowError {
    /// The VA names both a PV and an inline spec.
    #[error("both InlineCSIVolumeSource and PersistentVolumeName specified in VA source")]
    BothSources,
    /// The VA names neither.
    #[error("neither InlineCSIVolumeSource nor PersistentVolumeName specified in VA source")]
    NoSource,
    /// The inline spec has no CSI source.
    #[error("inline volume spec contains nil CSI source")]
    InlineWithoutCsi,
    /// The PV is not in the cache (yet).
    #[error("persistentvolume {0:?} not found")]
    PvNotFound(String),
    /// Reading a PV the cache does not hold failed.
    #[error("could not get PersistentVolume {name:?}: {source}")]
    GetPv {
        name: String,
        #[source]
        source: ApiError,
    },
    /// Attaching a PV that is being deleted is refused.
    #[error("PersistentVolume {0:?} is marked for deletion")]
    PvDeleting(String),
    /// Adding our finalizer to the PV failed.
    #[error("could not add PersistentVolume finalizer: {0}")]
    AddPvFinalizer(#[source] ApiError),
    /// An in-tree PV whose source does not translate to CSI.
    #[error("failed to translate in tree pv to CSI: {0}")]
    Translate(#[source] crate::migration::TranslateError),
    /// The PV has no CSI source.
    #[error("pv spec contained non-csi source that was not migrated")]
    NotCsi,
    /// Access modes that no CSI capability expresses.
    #[error(transparent)]
    Capability(#[from] CapabilityError),
    /// The controller-publish secret could not be read.
    #[error("failed to load secret \"{namespace}/{name}\": {source}")]
    Secret {
        namespace: String,
        name: String,
        /// The API error, or a value that cannot be sent.
        #[source]
        source: SecretError,
    },
    /// No CSINode object for the node.
    #[error("csinode.storage.k8s.io {0:?} not found")]
    CsiNodeNotFound(String),
    /// The CSINode has no entry for our driver.
    #[error("CSINode {node} does not contain driver {driver}")]
    DriverNotOnNode { node: String, driver: String },
    /// Adding our finalizer / node-id annotation to the VA failed.
    #[error("could not save VolumeAttachment: {0}")]
    SaveVolumeAttachment(#[source] ApiError),
    /// Before a forced re-publish, asking the API server whether the VA still
    /// exists failed (not saved on the VA: the check is what failed).
    #[error("could not save VolumeAttachment: {0}")]
    ConfirmVolumeAttachment(#[source] ApiError),
    /// The driver failed; the text is kept verbatim.
    #[error(transparent)]
    Driver(#[from] RpcStatus),
    /// Writing `attached=true` failed (logged, not saved on the VA unless
    /// the API server refused it as invalid).
    #[error("could not mark as attached: {0}")]
    MarkAttached(#[source] ApiError),
    /// Undoing a Publish for a VA that went away meanwhile failed (nothing
    /// to save it on); the text is the driver's.
    #[error(transparent)]
    UndoPublish(RpcStatus),
    /// Removing our finalizer or writing `attached=false` failed.
    #[error("could not mark as detached: {0}")]
    MarkDetached(#[source] ApiError),
    /// Asking whether the VA's Node still exists failed (after Unpublish
    /// answered NotFound, with `--unpublish-not-found-node-gone`).
    #[error("could not get Node: {0}")]
    NodeLookup(#[source] ApiError),
    /// Removing our finalizer from a PV failed.
    #[error("could not remove PersistentVolume finalizer: {0}")]
    RemovePvFinalizer(#[source] ApiError),
    /// The leadership window closed: the driver call was not started, or was
    /// abandoned. Retriable, and never written on the VA.
    #[error(transparent)]
    NotLeading(#[from] crate::leader::NotLeading),
    /// The attempt panicked: a bug, kept to this one object and retried.
    #[error("internal error (please report it): {0}")]
    Panicked(String),
}

/// The API server refuses a `VolumeError.message` longer than this many bytes,
/// and the error would not be saved at all. (Its refusal says "may not be more
/// than 262144 bytes", the attachmentMetadata limit, but it checks 1024: measured.)
pub const MAX_STATUS_MESSAGE: usize = 1024;

impl FlowError {
    /// Whether a failed attempt writes this error on its VA (`attachError` or
    /// `detachError`, by lane). The one rule, applied where every VA sync
    /// ends (`sync::sync_va`); the flows only return their errors.
    pub fn saved_on_va(&self) -> bool {
        match self {
            // Not an error of the VA: whoever leads next does it.
            Self::NotLeading(_) => false,
            // Logged and retried, as upstream; unless the API server refused
            // the status for good (422, e.g. a publish context over its
            // 256 KiB attachmentMetadata limit): say so on the VA, or it
            // would show nothing while Publish is retried forever.
            Self::MarkAttached(err) => err.is_invalid() && !err.is_replaced(),
            // The VA is gone, or the check whether it is failed.
            Self::ConfirmVolumeAttachment(_) | Self::UndoPublish(_) => false,
            _ => true,
        }
    }

    /// The text for `attachError` / `detachError`: the Display text, cut to
    /// [`MAX_STATUS_MESSAGE`] bytes (on a character boundary) with a note of how
    /// much was cut. Shorter texts are kept exactly.
    pub fn status_message(&self) -> String {
        cap_message(self.to_string(), MAX_STATUS_MESSAGE)
    }

    /// The numeric gRPC code for `attachError.errorCode`: driver errors only.
    pub fn grpc_code(&self) -> Option<i32> {
        match self {
            Self::Driver(status) => Some(status.code_number()),
            _ => None,
        }
    }
}

/// `text`, or its first bytes and `... [N bytes truncated]` so that the whole is at most `max` bytes.
fn cap_message(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    // The note is at most 40 bytes; keep what fits before it.
    let mut keep = max.saturating_sub(40);
    while !text.is_char_boundary(keep) {
        keep -= 1;
    }
    format!(
        "{}... [{} bytes truncated]",
        &text[..keep],
        text.len() - keep
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::testing::{api_error, replaced};
    use crate::csi::RpcStatus;

    #[test]
    fn the_one_rule_for_what_is_saved_on_the_va() {
        let rpc = || RpcStatus::new(tonic::Code::Internal, "boom");
        let saved = [
            FlowError::Driver(rpc()),
            FlowError::SaveVolumeAttachment(api_error(500, "etcd")),
            FlowError::MarkDetached(api_error(500, "etcd")),
            FlowError::MarkAttached(api_error(422, "too large")),
            FlowError::NoSource,
            FlowError::Panicked("bug".into()),
        ];
        for err in &saved {
            assert!(err.saved_on_va(), "{err:?}");
        }
        let not_saved = [
            FlowError::NotLeading(crate::leader::NotLeading),
            FlowError::MarkAttached(api_error(500, "etcd")),
            FlowError::MarkAttached(replaced()),
            FlowError::ConfirmVolumeAttachment(api_error(500, "etcd")),
            FlowError::UndoPublish(rpc()),
        ];
        for err in &not_saved {
            assert!(!err.saved_on_va(), "{err:?}");
        }
    }

    #[test]
    fn status_messages_are_kept_up_to_the_api_limit_and_cut_on_a_char_boundary() {
        let short = FlowError::Driver(RpcStatus::new(tonic::Code::Internal, "boom"));
        assert_eq!(
            short.status_message(),
            "rpc error: code = Internal desc = boom"
        );
        let exact = "x".repeat(MAX_STATUS_MESSAGE);
        assert_eq!(cap_message(exact.clone(), MAX_STATUS_MESSAGE), exact);
        for filler in ["e", "é", "🔑"] {
            let long = FlowError::Driver(RpcStatus::new(
                tonic::Code::Internal,
                filler.repeat(MAX_STATUS_MESSAGE),
            ));
            let text = long.status_message();
            assert!(text.len() <= MAX_STATUS_MESSAGE, "{filler}: {}", text.len());
            assert!(
                text.starts_with("rpc error: code = Internal desc = "),
                "{filler}"
            );
            assert!(text.ends_with("bytes truncated]"), "{filler}: {text}");
        }
    }
}
