//! Publishes owed an Unpublish after their VolumeAttachment went away
//! (which, why and when: `docs/contract.md`, "A Publish in doubt is undone
//! when its VA goes away").
//!
//! [`FencedDriver`](super::fenced::FencedDriver), where every driver answer
//! arrives, records each Publish that may have acted without a success
//! ([`Undos::owe`]) and strikes it off when a call settles it ([`Undos::paid`]:
//! a Publish or an Unpublish of the pair that answered OK); the sync of a key
//! whose VA is gone or replaced first pays what is owed
//! (`FencedDriver::pay`), retried with the key's backoff. No flow keeps these
//! books. In memory only.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tonic::Code;

use crate::controller::model::CachedVa;
use crate::controller::seams::driver::Origin;
use crate::csi::proto::{ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest};

/// What undoes a Publish: its Unpublish (secrets included; never logged).
#[derive(Clone)]
pub struct Published {
    pub request: ControllerUnpublishVolumeRequest,
    pub origin: Origin,
}

impl Published {
    /// The Unpublish that undoes `publish`.
    pub fn of(publish: &ControllerPublishVolumeRequest, origin: Origin) -> Self {
        Self {
            request: ControllerUnpublishVolumeRequest {
                volume_id: publish.volume_id.clone(),
                node_id: publish.node_id.clone(),
                secrets: publish.secrets.clone(),
            },
            origin,
        }
    }
}

/// A Publish owed an Unpublish, and the VA it was made for.
#[derive(Clone)]
pub struct Undo {
    /// The VA as it was (its UID tells a VA re-created under its name apart).
    pub va: CachedVa,
    pub published: Published,
}

/// Whether a Publish that ended with `code` may have acted, or may still be
/// acting, in the driver. The codes the CSI spec gives a Publish that was
/// refused (and the ones no driver acts on) are not.
pub fn may_have_acted(code: Code) -> bool {
    !matches!(
        code,
        Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::FailedPrecondition
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::OutOfRange
            | Code::Unimplemented
            | Code::PermissionDenied
            | Code::Unauthenticated
    )
}

/// The Publishes owed an Unpublish, by VA name (one per name: a later one
/// for the same VA replaces it).
#[derive(Default)]
pub struct Undos {
    owed: Mutex<HashMap<String, Undo>>,
}

impl Undos {
    fn owed(&self) -> std::sync::MutexGuard<'_, HashMap<String, Undo>> {
        self.owed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The Publish `published` for `va` may have acted without a success:
    /// owed, and what pays it.
    pub fn owe(&self, va: &CachedVa, published: &Published) -> Undo {
        let undo = Undo {
            va: va.clone(),
            published: published.clone(),
        };
        self.owed().insert(va.name().to_string(), undo.clone());
        undo
    }

    /// A call for VA `name` settled `volume` on `node_id` (a Publish that
    /// succeeded, an Unpublish that did): nothing is owed there any more.
    pub fn paid(&self, name: &str, volume: &str, node_id: &str) {
        let mut owed = self.owed();
        if owed.get(name).is_some_and(|undo| {
            undo.published.request.volume_id == volume && undo.published.request.node_id == node_id
        }) {
            owed.remove(name);
        }
    }

    /// What the sync of `name` must pay first: an undo whose VA is gone
    /// (`current` is `None`) or replaced (another UID).
    pub fn due(&self, name: &str, current: Option<&CachedVa>) -> Option<Undo> {
        let owed = self.owed();
        let undo = owed.get(name)?;
        match current {
            Some(va) if va.uid() == undo.va.uid() => None,
            _ => Some(undo.clone()),
        }
    }

    /// Whether a Publish for VA `name` is owed an Unpublish.
    pub fn owes(&self, name: &str) -> bool {
        self.owed().contains_key(name)
    }

    /// The names of the VAs owed one.
    pub fn names(&self) -> Vec<String> {
        self.owed().keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn va(uid: &str) -> CachedVa {
        crate::controller::testing::view(&crate::controller::testing::va(
            serde_json::json!({"metadata": {"uid": uid}}),
        ))
    }

    fn published(volume: &str, node_id: &str) -> Published {
        Published {
            request: ControllerUnpublishVolumeRequest {
                volume_id: volume.into(),
                node_id: node_id.into(),
                secrets: Default::default(),
            },
            origin: Origin::Csi,
        }
    }

    #[test]
    fn an_undo_is_due_once_its_va_is_gone_or_replaced_and_struck_off_by_its_own_call() {
        let undos = Undos::default();
        let a = va("uid-a");
        undos.owe(&a, &published("vol-1", "n1"));
        assert!(
            undos.due("va-1", Some(&a)).is_none(),
            "the VA is still there"
        );
        assert!(undos.due("va-1", None).is_some(), "gone");
        assert!(undos.due("va-1", Some(&va("uid-b"))).is_some(), "replaced");
        assert!(undos.due("va-2", None).is_none(), "another name");
        undos.paid("va-1", "vol-1", "n2");
        undos.paid("va-1", "vol-2", "n1");
        assert_eq!(
            undos.names(),
            ["va-1"],
            "a call elsewhere settles nothing here"
        );
        undos.paid("va-1", "vol-1", "n1");
        assert!(undos.names().is_empty() && !undos.owes("va-1"));
    }

    #[test]
    fn only_a_refusal_leaves_nothing_in_doubt() {
        for code in [
            Code::DeadlineExceeded,
            Code::Cancelled,
            Code::Unavailable,
            Code::Internal,
            Code::Unknown,
        ] {
            assert!(may_have_acted(code), "{code:?}");
        }
        for code in [Code::Aborted, Code::NotFound, Code::FailedPrecondition] {
            assert!(!may_have_acted(code), "{code:?}");
        }
    }
}
