//! The driver as the controller reaches it: [`FencedDriver`].
//!
//! Every `ControllerPublishVolume`, `ControllerUnpublishVolume` and
//! `ListVolumes` of the controller goes through it, with the leadership window
//! inside: a call starts only while the window is open and is abandoned when
//! it closes (`Leadership::call`). The raw [`Driver`] is a private field, so
//! no flow can call the driver around the fence; fencing no longer rests on
//! each call site remembering to wrap its call.
//!
//! Every Publish and Unpublish answer is also reported to a [`Listener`]
//! (the queue's pacer, which paces nodes and polls operations in doubt by
//! it), and settles the books of Publishes owed an Unpublish ([`Undos`];
//! which, why and when: `docs/contract.md`, "A Publish in doubt is undone
//! when its VA goes away"): [`Undos::owe`] records a Publish that may have
//! acted without an OK, [`Undos::paid`] strikes it off on an OK for the
//! pair; the sync of a key whose VA is gone or replaced first pays what is
//! owed ([`FencedDriver::pay`]), retried with the key's backoff. The flows
//! keep no such books; in memory only.
//!
//! (`csi-attacher check` lists volumes on its own client: it takes no Lease
//! and writes nothing, so it has no window to keep.)

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tonic::Code;

use crate::controller::error::FlowError;
use crate::controller::model::{CachedVa, Lane};
use crate::controller::queue::pace::Listener;
use crate::controller::seams::driver::{Driver, Origin};
use crate::csi::proto::{ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest};
use crate::csi::RpcStatus;
use crate::leader::{Leadership, NotLeading};

/// The driver behind the leadership window.
#[derive(Clone)]
pub struct FencedDriver {
    driver: Arc<dyn Driver>,
    leadership: Leadership,
    listener: Option<Arc<dyn Listener>>,
    undos: Arc<Undos>,
}

impl FencedDriver {
    /// `driver`, called only inside `leadership`'s window.
    pub fn new(driver: Arc<dyn Driver>, leadership: Leadership) -> Self {
        Self {
            driver,
            leadership,
            listener: None,
            undos: Arc::default(),
        }
    }

    /// Keeps the Publishes owed an Unpublish in `undos` (shared with the VA
    /// watch, which queues a VA gone while owed one).
    pub fn with_undos(mut self, undos: Arc<Undos>) -> Self {
        self.undos = undos;
        self
    }

    /// The Publishes owed an Unpublish.
    pub fn undos(&self) -> &Undos {
        &self.undos
    }

    /// Unpublishes what `undo` owes; struck off once the driver answers OK.
    pub async fn pay(&self, undo: &Undo) -> Result<(), FlowError> {
        let request = &undo.published.request;
        tracing::info!(va = %undo.va.name(), volume = %request.volume_id, node_id = %request.node_id,
            "VolumeAttachment gone while its Publish may have acted; unpublishing");
        self.unpublish(request.clone(), undo.published.origin, Some(&undo.va))
            .await?
            .map_err(FlowError::UndoPublish)
    }

    /// Reports every Publish and Unpublish answer to `listener`.
    pub fn with_listener(mut self, listener: Arc<dyn Listener>) -> Self {
        self.listener = Some(listener);
        self
    }

    /// The window the calls are fenced by.
    pub fn leadership(&self) -> &Leadership {
        &self.leadership
    }

    /// The per-call deadline (`--timeout`).
    pub fn timeout(&self) -> Duration {
        self.driver.timeout()
    }

    /// `ControllerPublishVolume` inside the window: the publish context, or
    /// [`NotLeading`] when the window was closed at the start or closed while
    /// the call ran (then it is abandoned: the driver may still run it).
    /// `va` is the VolumeAttachment it is for (the listener's node and key).
    pub async fn publish(
        &self,
        request: ControllerPublishVolumeRequest,
        origin: Origin,
        va: &CachedVa,
    ) -> Result<Result<HashMap<String, String>, RpcStatus>, NotLeading> {
        let published = Published::of(&request, origin);
        let answer = self
            .call(Lane::Attach, Some(va), || {
                self.driver.publish(request, origin)
            })
            .await;
        let (volume, node_id) = (&published.request.volume_id, &published.request.node_id);
        match &answer {
            Ok(Ok(_)) => self.undos.paid(va.name(), volume, node_id),
            Ok(Err(status)) if !may_have_acted(status.code) => {}
            // It may have acted, or act still: owed an Unpublish should the VA
            // go away before a later attempt settles it.
            Ok(Err(_)) | Err(_) => {
                self.undos.owe(va, &published);
            }
        }
        answer
    }

    /// `ControllerUnpublishVolume` inside the window (as [`Self::publish`]);
    /// an OK settles what VA `va` owed on that pair; `None` for a call no VA
    /// stands behind (an orphan's: no listener hears it, nothing was owed).
    pub async fn unpublish(
        &self,
        request: ControllerUnpublishVolumeRequest,
        origin: Origin,
        va: Option<&CachedVa>,
    ) -> Result<Result<(), RpcStatus>, NotLeading> {
        let pair = (request.volume_id.clone(), request.node_id.clone());
        let answer = self
            .call(Lane::Detach, va, || self.driver.unpublish(request, origin))
            .await;
        if let (Some(va), Ok(Ok(()))) = (va, &answer) {
            self.undos.paid(va.name(), &pair.0, &pair.1);
        }
        answer
    }

    /// Runs the call `start` builds inside the window, and tells the listener
    /// how the call for `va` ended (an abandoned call tells it nothing: no
    /// answer came).
    async fn call<T, F: Future<Output = Result<T, RpcStatus>>>(
        &self,
        lane: Lane,
        va: Option<&CachedVa>,
        start: impl FnOnce() -> F,
    ) -> Result<Result<T, RpcStatus>, NotLeading> {
        // Not even built outside the window (a driver may act on the call itself).
        if !self.leadership.may_start() {
            return Err(NotLeading);
        }
        let started = tokio::time::Instant::now();
        let answer = self.leadership.call(start()).await;
        // A call that ended at its deadline may still run in the driver
        // (a cloud operation outlives its caller): counted as abandoned.
        if matches!(&answer, Ok(Err(status)) if status.code == Code::DeadlineExceeded) {
            self.leadership.gave_up();
        }
        if let (Some(listener), Some(va), Ok(result)) = (&self.listener, va, &answer) {
            let answer = result
                .as_ref()
                .err()
                .map(|status| (status.code, status.message.as_str()));
            listener.finished(lane, va.name(), va.node_name(), started, answer);
        }
        answer
    }

    /// A read through the driver (the reconciler's ListVolumes pages) inside
    /// the window: [`NotLeading`] when the window is closed before it starts,
    /// closes while it runs, or is closed when it ends, so a listing from
    /// outside the window decides nothing. A read leaves nothing running in
    /// the driver, so it is not counted as a call in flight.
    pub async fn read<'a, T, F>(
        &'a self,
        read: impl FnOnce(&'a dyn Driver) -> F,
    ) -> Result<T, NotLeading>
    where
        F: Future<Output = T> + 'a,
    {
        if !self.leadership.may_start() {
            return Err(NotLeading);
        }
        let out = tokio::select! {
            biased;
            () = self.leadership.closed() => return Err(NotLeading),
            out = read(self.driver.as_ref()) => out,
        };
        if !self.leadership.may_start() {
            return Err(NotLeading);
        }
        Ok(out)
    }

    /// The same driver behind another window (tests that take the
    /// leadership away).
    #[cfg(test)]
    pub(crate) fn with_leadership(&self, leadership: Leadership) -> Self {
        Self {
            driver: Arc::clone(&self.driver),
            leadership,
            listener: self.listener.clone(),
            undos: Arc::clone(&self.undos),
        }
    }
}

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
    use tokio::sync::watch;
    use tokio::time::Instant;

    use super::*;
    use crate::controller::testing::FakeDriver;
    use crate::csi::VolumePage;
    use crate::leader::Window;

    /// The VA the calls are for.
    fn va() -> CachedVa {
        CachedVa::from(crate::controller::testing::va(serde_json::json!({})))
    }

    fn fenced(window: Window) -> (Arc<FakeDriver>, FencedDriver, watch::Sender<Window>) {
        let (tx, rx) = watch::channel(window);
        let driver = Arc::new(FakeDriver::default());
        let fenced = FencedDriver::new(driver.clone(), Leadership::following(rx));
        (driver, fenced, tx)
    }

    #[tokio::test(start_paused = true)]
    async fn no_call_reaches_the_driver_outside_the_window() {
        let (driver, fenced, _tx) = fenced(Window::Closed);
        let publish = fenced
            .publish(
                ControllerPublishVolumeRequest::default(),
                Origin::Csi,
                &va(),
            )
            .await;
        assert!(publish.is_err(), "Publish outside the window");
        let unpublish = fenced
            .unpublish(
                ControllerUnpublishVolumeRequest::default(),
                Origin::Csi,
                Some(&va()),
            )
            .await;
        assert!(unpublish.is_err(), "Unpublish outside the window");
        let read = fenced.read(|d| d.list_volumes(0, String::new())).await;
        assert!(read.is_err(), "ListVolumes outside the window");
        assert!(driver.journal().is_empty(), "{:?}", driver.journal());
    }

    /// A driver whose calls never answer.
    struct Hanging;

    impl Driver for Hanging {
        fn publish(
            &self,
            _: ControllerPublishVolumeRequest,
            _: Origin,
        ) -> futures::future::BoxFuture<'_, Result<HashMap<String, String>, RpcStatus>> {
            Box::pin(std::future::pending())
        }
        fn unpublish(
            &self,
            _: ControllerUnpublishVolumeRequest,
            _: Origin,
        ) -> futures::future::BoxFuture<'_, Result<(), RpcStatus>> {
            Box::pin(std::future::pending())
        }
        fn list_volumes(
            &self,
            _: i32,
            _: String,
        ) -> futures::future::BoxFuture<'_, Result<VolumePage, RpcStatus>> {
            Box::pin(std::future::pending())
        }
        fn timeout(&self) -> Duration {
            Duration::from_secs(15)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_in_flight_is_abandoned_when_the_window_closes() {
        let (tx, rx) = watch::channel(Window::Until(
            crate::leader::TokioClock::stamp(Instant::now()) + Duration::from_secs(60),
        ));
        let fenced = FencedDriver::new(Arc::new(Hanging), Leadership::following(rx));
        let closing = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            tx.send_replace(Window::Closed);
        };
        let va = va();
        let publish = tokio::time::timeout(
            Duration::from_secs(30),
            fenced.publish(ControllerPublishVolumeRequest::default(), Origin::Csi, &va),
        );
        let (publish, ()) = tokio::join!(publish, closing);
        assert!(
            matches!(publish, Ok(Err(NotLeading))),
            "Publish not abandoned at the window's close: {publish:?}"
        );
        assert_eq!(fenced.leadership().abandoned(), 1);
    }

    #[tokio::test]
    async fn a_call_that_ended_at_its_deadline_counts_as_abandoned() {
        let driver = Arc::new(FakeDriver::default());
        let fenced = FencedDriver::new(driver.clone(), Leadership::unbounded());
        driver.fail("unpublish", tonic::Code::Internal, "boom");
        let failed = fenced
            .unpublish(
                ControllerUnpublishVolumeRequest::default(),
                Origin::Csi,
                Some(&va()),
            )
            .await;
        assert!(matches!(failed, Ok(Err(_))), "{failed:?}");
        assert_eq!(fenced.leadership().abandoned(), 0, "an answer is an answer");
        driver.fail(
            "publish",
            tonic::Code::DeadlineExceeded,
            "context deadline exceeded",
        );
        let late = fenced
            .publish(
                ControllerPublishVolumeRequest::default(),
                Origin::Csi,
                &va(),
            )
            .await;
        assert!(matches!(late, Ok(Err(_))), "{late:?}");
        assert_eq!(
            fenced.leadership().abandoned(),
            1,
            "the driver may still run a call that hit its deadline"
        );
    }

    /// A ListVolumes page that takes a minute.
    fn slow_list(d: &dyn Driver) -> impl Future<Output = Result<VolumePage, RpcStatus>> + '_ {
        let page = d.list_volumes(0, String::new());
        async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            page.await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn inside_the_window_calls_go_through_and_a_read_past_its_end_counts_for_nothing() {
        let end = crate::leader::TokioClock::stamp(Instant::now()) + Duration::from_secs(10);
        let (driver, fenced, tx) = fenced(Window::Until(end));
        driver.push_page(Ok(VolumePage::default()));
        let read = fenced.read(|d| d.list_volumes(0, String::new())).await;
        assert!(matches!(read, Ok(Ok(_))), "{read:?}");
        assert!(fenced
            .unpublish(
                ControllerUnpublishVolumeRequest::default(),
                Origin::Csi,
                Some(&va())
            )
            .await
            .is_ok());
        assert_eq!(driver.journal().len(), 2);
        // The window closes while the read runs: its answer is not used.
        let closing = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            tx.send_replace(Window::Closed);
        };
        let (read, ()) = tokio::join!(fenced.read(slow_list), closing);
        assert!(read.is_err(), "read across the window's end: {read:?}");
    }
}

#[cfg(test)]
mod undo_tests {
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
