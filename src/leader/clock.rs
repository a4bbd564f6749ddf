//! The clock the leadership window is timed by ([`Clock`]): `CLOCK_BOOTTIME`
//! ([`BootClock`]), which keeps counting while the machine is suspended.
//!
//! `tokio::time::Instant` reads `CLOCK_MONOTONIC`, which stops during a
//! system suspend: a leader resumed after a suspend would find its window
//! still open by that clock although, in the time the standbys (and the API
//! server) count, it ended long ago. So every decision about the window
//! (when it ends, whether a driver call may start, when a held Lease may
//! first act, when an observed Lease expires) reads this clock; tokio timers
//! only say when to look again ([`Clock::timer`]).

use std::fmt;
use std::ops::Add;
use std::time::Duration;

/// A reading of a [`Clock`]: the time since the clock's origin (boot, for
/// [`BootClock`]). Only readings of one clock compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp(Duration);

impl Stamp {
    /// `self - earlier`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Stamp) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<Duration> for Stamp {
    type Output = Stamp;

    fn add(self, rhs: Duration) -> Stamp {
        Stamp(self.0.saturating_add(rhs))
    }
}

/// Where the leadership window reads the time.
pub trait Clock: Send + Sync + fmt::Debug {
    fn now(&self) -> Stamp;

    /// How long a tokio timer sleeps to let `wait` pass on this clock (a
    /// first guess: the caller reads [`Clock::now`] again when it wakes).
    fn timer(&self, wait: Duration) -> Duration {
        wait
    }
}

/// `CLOCK_BOOTTIME`: monotonic, and counts time spent suspended.
#[derive(Debug, Default, Clone, Copy)]
pub struct BootClock;

/// The clock [`BootClock`] reads. A clock that stopped while the machine was
/// suspended would let a resumed leader believe its window still open.
#[cfg(any(target_os = "linux", target_os = "android"))]
const BOOT_CLOCK: rustix::time::ClockId = rustix::time::ClockId::Boottime;
/// Elsewhere (not a target this sidecar ships for): the monotonic clock.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const BOOT_CLOCK: rustix::time::ClockId = rustix::time::ClockId::Monotonic;

impl Clock for BootClock {
    fn now(&self) -> Stamp {
        let t = rustix::time::clock_gettime(BOOT_CLOCK);
        Stamp(Duration::new(
            u64::try_from(t.tv_sec).unwrap_or(0),
            u32::try_from(t.tv_nsec).unwrap_or(0),
        ))
    }
}

/// How long a call in flight may outlive its window's end after a resume
/// from suspend: tokio's timers (monotonic) do not count the suspend, so
/// [`sleep_until`] wakes at least this often to read the clock.
pub const RESUME_CHECK: Duration = Duration::from_millis(250);

/// Sleeps until `clock` reads `at` or later, waking at least every
/// [`RESUME_CHECK`] to read it.
pub async fn sleep_until(clock: &dyn Clock, at: Stamp) {
    loop {
        let left = at.saturating_duration_since(clock.now());
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(clock.timer(left).min(RESUME_CHECK)).await;
    }
}

#[cfg(test)]
impl Stamp {
    /// The reading `since_origin` after the clock's origin.
    pub const fn from_origin(since_origin: Duration) -> Self {
        Self(since_origin)
    }

    /// The time since the clock's origin.
    pub const fn since_origin(self) -> Duration {
        self.0
    }
}

/// Tests: tokio's clock (paused or not) as a [`Clock`], so that the
/// window follows `tokio::time::advance`.
#[cfg(test)]
#[derive(Debug, Default, Clone, Copy)]
pub struct TokioClock;

#[cfg(test)]
impl TokioClock {
    /// How far before the first reading on a thread its stamps may go.
    const BEFORE: Duration = Duration::from_secs(86_400);

    /// The stamp of `at` (a reading of tokio's clock on this thread).
    pub fn stamp(at: tokio::time::Instant) -> Stamp {
        thread_local! {
            static BASE: tokio::time::Instant = tokio::time::Instant::now();
        }
        let base = BASE.with(|b| *b);
        if at >= base {
            Stamp(Self::BEFORE + (at - base))
        } else {
            Stamp(Self::BEFORE.saturating_sub(base - at))
        }
    }
}

#[cfg(test)]
impl Clock for TokioClock {
    fn now(&self) -> Stamp {
        Self::stamp(tokio::time::Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_clock_moves_forward_and_is_at_least_the_monotonic_clock() {
        let monotonic = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        let a = BootClock.now();
        std::thread::sleep(Duration::from_millis(5));
        let b = BootClock.now();
        assert!(b.saturating_duration_since(a) >= Duration::from_millis(5));
        // Boot time = monotonic time + time suspended.
        let monotonic = Duration::new(
            u64::try_from(monotonic.tv_sec).unwrap_or(0),
            u32::try_from(monotonic.tv_nsec).unwrap_or(0),
        );
        assert!(a.since_origin() >= monotonic, "{a:?} < {monotonic:?}");
    }

    /// A suspend cannot be made in a test: the clock read is the one that
    /// counts it (`CLOCK_MONOTONIC` stops while suspended).
    #[test]
    fn the_boot_clock_counts_time_spent_suspended() {
        assert_eq!(BOOT_CLOCK, rustix::time::ClockId::Boottime);
    }

    #[tokio::test(start_paused = true)]
    async fn sleep_until_wakes_when_the_clock_reads_the_stamp() {
        let start = tokio::time::Instant::now();
        let at = TokioClock.now() + Duration::from_secs(3);
        sleep_until(&TokioClock, at).await;
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        assert!(TokioClock.now() >= at);
    }
}
