//! The leadership window ([`Window`]) the workers check before and during
//! every driver call ([`Leadership::call`]), and how long it lasts after a
//! renewal ([`window_length`]). Why it is shorter than the lease: the
//! `leader` module doc.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::clock::{self, BootClock, Clock, Stamp};

/// How much earlier than `renew_deadline` the window closes: time for the
/// cancellation of an abandoned call to reach the driver.
pub fn cancel_allowance(renew_deadline: Duration) -> Duration {
    (renew_deadline / 10).min(Duration::from_millis(200))
}

/// The leadership window's length after the start of a successful renewal.
pub fn window_length(renew_deadline: Duration) -> Duration {
    renew_deadline.saturating_sub(cancel_allowance(renew_deadline))
}

/// Until when this replica may start driver calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// Not leading.
    Closed,
    /// Leading until this reading of the window's clock (last successful
    /// renewal's start + [`window_length`]).
    Until(Stamp),
    /// No leader election: always.
    Unbounded,
}

impl Window {
    /// Whether a call may start at `now`.
    pub fn is_open(&self, now: Stamp) -> bool {
        match self {
            Self::Closed => false,
            Self::Until(end) => now < *end,
            Self::Unbounded => true,
        }
    }
}

/// A driver call was not started, or was abandoned, because this replica's
/// leadership window closed. Retriable (by the next leader); never written on
/// an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not leading: the driver call was not started or was abandoned")]
pub struct NotLeading;

/// The leadership window as the workers see it, and the driver calls made under it.
///
/// Every call to the driver that changes or reads published state goes through
/// [`Leadership::call`]: it starts only inside the window and is abandoned
/// (dropped, which cancels the gRPC call) the moment the window closes.
#[derive(Clone, Debug)]
pub struct Leadership {
    pub(super) window: watch::Receiver<Window>,
    pub(super) calls: Arc<CallCounts>,
    /// The clock the window is timed by (the elector's).
    pub(super) clock: Arc<dyn Clock>,
}

#[derive(Default, Debug)]
pub(super) struct CallCounts {
    in_flight: AtomicUsize,
    abandoned: AtomicUsize,
}

/// Counts one call in flight; a drop before [`InFlight::finished`] counts it abandoned.
struct InFlight<'a> {
    counts: &'a CallCounts,
    finished: bool,
}

impl<'a> InFlight<'a> {
    fn start(counts: &'a CallCounts) -> Self {
        counts.in_flight.fetch_add(1, Ordering::SeqCst);
        Self {
            counts,
            finished: false,
        }
    }

    fn finished(mut self) {
        self.finished = true;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.counts.abandoned.fetch_add(1, Ordering::SeqCst);
        }
        self.counts.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Leadership {
    /// Without leader election: the window never closes.
    pub fn unbounded() -> Self {
        let (_, window) = watch::channel(Window::Unbounded);
        Self {
            window,
            calls: Arc::default(),
            clock: Arc::new(BootClock),
        }
    }

    pub fn window(&self) -> Window {
        *self.window.borrow()
    }

    /// Whether a driver call may start now.
    pub fn may_start(&self) -> bool {
        self.window().is_open(self.clock.now())
    }

    pub fn in_flight(&self) -> usize {
        self.calls.in_flight.load(Ordering::SeqCst)
    }

    /// Driver calls dropped before they returned (window closed, shutdown
    /// aborted them), or that ended at their deadline ([`Self::gave_up`]):
    /// the driver may still be running them.
    pub fn abandoned(&self) -> usize {
        self.calls.abandoned.load(Ordering::SeqCst)
    }

    /// A call ended at its deadline (`DeadlineExceeded`): it returned, but
    /// the driver may still be running it, so it counts as abandoned and
    /// the Lease is not released on exit (the next leader waits it out).
    pub fn gave_up(&self) {
        self.calls.abandoned.fetch_add(1, Ordering::SeqCst);
    }

    /// Runs the driver call `call` if the window is open, and abandons it
    /// when the window closes.
    ///
    /// # Cancel safety
    /// Dropping the returned future abandons the call (counted in
    /// [`Leadership::abandoned`]).
    pub async fn call<F: Future>(&self, call: F) -> Result<F::Output, NotLeading> {
        if !self.may_start() {
            return Err(NotLeading);
        }
        let tracked = InFlight::start(&self.calls);
        // Biased: after a freeze, the closed window is seen before the call is polled.
        tokio::select! {
            biased;
            () = self.closed() => Err(NotLeading),
            out = call => {
                tracked.finished();
                Ok(out)
            }
        }
    }

    /// Resolves once the window is closed (at once if it is).
    pub async fn closed(&self) {
        let mut window = self.window.clone();
        loop {
            let current = *window.borrow_and_update();
            match current {
                Window::Closed => return,
                Window::Until(end) => {
                    if self.clock.now() >= end {
                        return;
                    }
                    tokio::select! {
                        () = clock::sleep_until(self.clock.as_ref(), end) => {}
                        changed = window.changed() => {
                            if changed.is_err() {
                                // No more renewals: the window ends as it stands.
                                clock::sleep_until(self.clock.as_ref(), end).await;
                                return;
                            }
                        }
                    }
                }
                Window::Unbounded => {
                    if window.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
impl Leadership {
    /// A window that follows `window` (tests: open and close it at will),
    /// timed by tokio's clock ([`clock::TokioClock`]).
    pub fn following(window: watch::Receiver<Window>) -> Self {
        Self {
            window,
            calls: Arc::default(),
            clock: Arc::new(clock::TokioClock),
        }
    }

    /// Now, on the window's clock.
    pub fn now(&self) -> Stamp {
        self.clock.now()
    }
}
