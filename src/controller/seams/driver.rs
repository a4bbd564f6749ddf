//! The CSI calls the flows and the reconciler make: [`Driver`], the seam
//! between them and the gRPC client. [`csi::Client`] is the real one; unit
//! tests use an in-memory fake (`testing::FakeDriver`).

use std::collections::HashMap;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;

use crate::csi::proto::{ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest};
use crate::csi::{self, RpcStatus, VolumePage};

pub use crate::csi::Origin;

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
        csi::Client::publish(self, request, origin).boxed()
    }
    fn unpublish(
        &self,
        request: ControllerUnpublishVolumeRequest,
        origin: Origin,
    ) -> BoxFuture<'_, Result<(), RpcStatus>> {
        csi::Client::unpublish(self, request, origin).boxed()
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
