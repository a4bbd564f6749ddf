//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's semantics.
//! Contract: `docs/contract.md#lease`, `docs/contract.md#a-leadership-window-with-a-margin`.
//!
//! # Protocol (client-go `leaderelection`)
//! - A candidate GETs the Lease; if it is missing it CREATEs it, if it is held
//!   by someone else whose lease (as *observed locally*) has not expired it
//!   waits, otherwise it replaces the Lease with itself as holder. The
//!   resourceVersion makes concurrent replaces conflict (409): one wins.
//! - The leader renews every `retry_period` by replacing its cached Lease
//!   (fast path, no GET); a failed fast path falls back to GET + replace and
//!   counts `leader_election_slowpath_total`.
//! - If no renewal succeeds within its leadership window (below), leadership
//!   is lost: the process exits 1, as upstream.
//!
//! # The leadership window: why `renew_deadline` < `lease_duration` is a margin
//! Two clocks decide who may call the driver, and neither replica reads the
//! other's:
//! - The **leader** may start a driver call (ControllerPublish/Unpublish,
//!   ListVolumes) only before `S + renew_deadline`, where `S` is the instant
//!   (its own boot-time clock, below) at which it *started* the attempt that last
//!   renewed the Lease successfully: the API server wrote that renewal after
//!   `S`. [`Leadership`] carries this window to the workers; when it closes,
//!   calls in flight are abandoned (their futures dropped, which cancels the
//!   gRPC call) and no new one starts, even if the renewal loop has not
//!   noticed yet or the process was frozen (SIGSTOP, a VM pause) across the
//!   deadline: the check is against the clock, not against a flag the
//!   renewal loop would have to clear.
//! - A **standby** takes the Lease no sooner than `O + lease_duration`, where
//!   `O` is when *it observed* (its own clock) the holder's last renewal.
//!   `O` comes after the API server wrote it, so after `S`.
//!
//!   The window closes [`cancel_allowance`] early (200 ms, or a tenth of a
//!   shorter renew deadline), so that the cancellation of an abandoned call
//!   has reached the driver by `S + renew_deadline`, the instant anyone
//!   reading the Lease would compute from its `renewTime`.
//!
//! Hence the leader's window ends at least `lease_duration - renew_deadline`
//! before any standby can take over (15 s - 10 s = 5 s with the defaults):
//! the margin absorbs clock-rate differences between the two machines and
//! the time a cancelled call takes to stop on our side. The Lease carries
//! whole seconds, so a sub-second `lease_duration` is written rounded *up*
//! (a standby then waits at least as long as we assume; client-go truncates
//! 500 ms to 0 s, which lets a standby take over at once).
//!
//! What no client can rule out: a call the driver received inside the window
//! but keeps running after it (a driver that ignores cancellation), or a
//! freeze in the microseconds between the window check and the write to the
//! socket. CSI has no fencing token; the margin is the defence.
//!
//! # The clock: `CLOCK_BOOTTIME`
//! Every decision about time above (the window's end, whether a call may
//! start, the hold after a CREATE, the observed expiry) reads
//! `CLOCK_BOOTTIME` ([`BootClock`]), not the monotonic clock of
//! `tokio::time::Instant` (client-go's `time.Now()` monotonic reading),
//! which stops while the machine is suspended: a leader resumed after a
//! suspend longer than its window would otherwise find the window still
//! open. Tokio's timers only say when to read the clock again; a call in
//! flight across a suspend is abandoned within [`RESUME_CHECK`] of the
//! resume. The clock is injectable ([`Elector::with_clock`]): the tests run
//! replicas whose clocks run fast or slow and show where the margin holds
//! (a rate ratio below `lease_duration / window_length`) and where it cannot.
//!
//! # Beyond upstream
//! A standby watches the Lease and tries when it is released or its observed
//! lease expires; a replica that CREATEd the Lease (or finds it naming us but
//! not by our last write) holds it, renewing, for `lease_duration` before its
//! window opens (a Lease deleted under a leader that does not know yet); on
//! SIGTERM the leader releases the Lease unless a driver call of its own may
//! still run ([`Leadership::abandoned`]); the renewal loop gives up at the
//! window's end. The reasons and costs: `docs/contract.md`, "Where we differ
//! from upstream". The files: `docs/architecture.md`, the module map.

mod clock;
mod elector;
mod health;
mod lease_api;
mod metrics;
mod settings;
mod window;

#[cfg(test)]
pub use clock::{sleep_until, BootClock, Clock, Stamp, TokioClock, RESUME_CHECK};
pub use elector::Elector;
pub use health::{Health, HEALTH_TOLERANCE};
pub use lease_api::{KubeLeases, LeaseApi};
pub use metrics::Metrics;
pub use settings::{
    lease_duration_seconds, validate_timing, InvalidTiming, Settings, JITTER_FACTOR,
};
pub use window::{cancel_allowance, window_length, Leadership, NotLeading, Window};

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
