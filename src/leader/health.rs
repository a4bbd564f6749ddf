//! The `/healthz/leader-election` check ([`Health`]).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// Extra time a leader may go without renewing before `/healthz/leader-election` fails.
pub const HEALTH_TOLERANCE: Duration = Duration::from_secs(20);

/// What `/healthz/leader-election` reports.
#[derive(Clone, Default)]
pub struct Health(pub(super) Arc<Mutex<HealthState>>);

#[derive(Default)]
pub(super) struct HealthState {
    leading: bool,
    last_renew: Option<Instant>,
    pub(super) lease_duration: Duration,
    pub(super) lease_name: String,
}

impl Health {
    /// Ok, or upstream's message when this leader has not renewed for
    /// lease duration + 20 s. Non-leaders are always healthy.
    pub fn check(&self) -> Result<(), String> {
        let state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match (state.leading, state.last_renew) {
            (true, Some(at)) if at.elapsed() > state.lease_duration + HEALTH_TOLERANCE => {
                Err(format!(
                    "failed election to renew leadership on lease {}",
                    state.lease_name
                ))
            }
            _ => Ok(()),
        }
    }

    pub(super) fn set(&self, leading: bool, renewed: Option<Instant>) {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        state.leading = leading;
        state.last_renew = renewed.or(state.last_renew);
    }
}

#[cfg(test)]
impl Health {
    /// Whether this replica currently leads.
    pub fn is_leading(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .leading
    }
}
