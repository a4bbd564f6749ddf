//! The CSI calls the flows and the reconciler make: [`Driver`], the seam
//! between them and the gRPC client. [`csi::Client`] is the real one; unit
//! tests use an in-memory fake (`testing::FakeDriver`).

use std::collections::HashMap;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;

use crate::csi::proto::{ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest};
use crate::csi::{self, RpcStatus, VolumePage};

/// Where a volume's CSI source came from (the `migrated` label of the CSI
/// operation metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A CSI PV or an inline spec (upstream labels inline specs `false` too).
    Csi,
    /// An in-tree PV translated to CSI.
    Migrated,
}

impl Origin {
    /// The metric label's value: whether the volume was translated.
    pub fn is_migrated(self) -> bool {
        self == Origin::Migrated
    }
}

/// The controller RPCs of the driver.
pub trait Driver: Send + Sync {
    /// `ControllerPublishVolume`; returns the publish context.
    fn publish(
        &self,
        request: ControllerPublishVolumeRequest,
        origin: Origin,
    ) -> BoxFuture<'_, Result<HashMap<String, String>, RpcStatus>>;
    /// `ControllerUnpublishVolume`.
    fn unpublish(
        &self,
        request: ControllerUnpublishVolumeRequest,
        origin: Origin,
    ) -> BoxFuture<'_, Result<(), RpcStatus>>;
    /// One `ListVolumes` page.
    fn list_volumes(
        &self,
        max_entries: i32,
        starting_token: String,
    ) -> BoxFuture<'_, Result<VolumePage, RpcStatus>>;
    /// The per-call deadline (`--timeout`).
    fn timeout(&self) -> Duration;
}

impl Driver for csi::Client {
    fn publish(
        &self,
        request: ControllerPublishVolumeRequest,
        origin: Origin,
    ) -> BoxFuture<'_, Result<HashMap<String, String>, RpcStatus>> {
        csi::Client::publish(self, request, origin.is_migrated()).boxed()
    }
    fn unpublish(
        &self,
        request: ControllerUnpublishVolumeRequest,
        origin: Origin,
    ) -> BoxFuture<'_, Result<(), RpcStatus>> {
        csi::Client::unpublish(self, request, origin.is_migrated()).boxed()
    }
    fn list_volumes(
        &self,
        max_entries: i32,
        starting_token: String,
    ) -> BoxFuture<'_, Result<VolumePage, RpcStatus>> {
        csi::Client::list_volumes(self, max_entries, starting_token).boxed()
    }
    fn timeout(&self) -> Duration {
        csi::Client::timeout(self)
    }
}
