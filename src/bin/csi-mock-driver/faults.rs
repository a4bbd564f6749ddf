//! Programmable faults, one per CSI method: delay, error, hang, exit.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tonic::{Code, Status};

/// What to do to calls of one method, in this order: exit, delay, hang, fail.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// Sleep this long before answering.
    #[serde(default)]
    pub delay_ms: u64,
    /// Fail with this gRPC code: a Go name (`ResourceExhausted`) or a number.
    #[serde(default)]
    pub code: Option<String>,
    /// Message of the failure.
    #[serde(default)]
    pub message: Option<String>,
    /// Apply to the next N calls only, then clear (not for `hang`).
    #[serde(default)]
    pub times: Option<u32>,
    /// Do not answer until this fault is cleared.
    #[serde(default)]
    pub hang: bool,
    /// Exit the process (simulates a driver crash).
    #[serde(default)]
    pub exit: bool,
}

impl Fault {
    /// Checks the code before the fault is stored, so a typo is a 400, not a silent OK.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(code) = &self.code {
            parse_code(code)?;
        }
        if self.times == Some(0) {
            return Err("times must be at least 1".into());
        }
        Ok(())
    }
}

/// The fault table, shared by the gRPC services and the admin API.
pub struct Faults {
    table: Mutex<HashMap<String, Fault>>,
    changed: watch::Sender<u64>,
}

impl Faults {
    pub fn new() -> Self {
        Self {
            table: Mutex::new(HashMap::new()),
            changed: watch::channel(0).0,
        }
    }

    pub fn set(&self, method: &str, fault: Fault) {
        self.lock().insert(method.to_string(), fault);
        self.changed.send_modify(|g| *g += 1);
    }

    pub fn clear(&self, method: Option<&str>) {
        match method {
            Some(m) => {
                self.lock().remove(m);
            }
            None => self.lock().clear(),
        }
        self.changed.send_modify(|g| *g += 1);
    }

    pub fn snapshot(&self) -> HashMap<String, Fault> {
        self.lock().clone()
    }

    /// Applies the fault for `method`, if any. `Err` is the status to answer with.
    pub async fn apply(&self, method: &str) -> Result<(), Status> {
        let Some(fault) = self.take(method) else {
            return Ok(());
        };
        if fault.exit {
            eprintln!("csi-mock-driver: exit fault on {method}");
            std::process::exit(1);
        }
        if fault.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(fault.delay_ms)).await;
        }
        if fault.hang {
            let mut changed = self.changed.subscribe();
            while self.lock().get(method).is_some_and(|f| f.hang) {
                if changed.changed().await.is_err() {
                    break;
                }
            }
        }
        match &fault.code {
            Some(code) => {
                let code = parse_code(code).unwrap_or(Code::Unknown);
                let message = fault
                    .message
                    .clone()
                    .unwrap_or_else(|| "mock rpc error".into());
                Err(Status::new(code, message))
            }
            None => Ok(()),
        }
    }

    /// The fault to apply to this call, counting down `times`.
    fn take(&self, method: &str) -> Option<Fault> {
        let mut table = self.lock();
        let fault = table.get_mut(method)?;
        let copy = fault.clone();
        if !fault.hang {
            if let Some(times) = &mut fault.times {
                *times -= 1;
                if *times == 0 {
                    table.remove(method);
                }
            }
        }
        Some(copy)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Fault>> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A gRPC code from its Go name (`Canceled`, `NotFound`, ...) or its number.
pub fn parse_code(text: &str) -> Result<Code, String> {
    if let Ok(n) = text.parse::<i32>() {
        return match Code::from_i32(n) {
            Code::Unknown if n != 2 => Err(format!("unknown gRPC code {n}")),
            code => Ok(code),
        };
    }
    let codes = [
        Code::Ok,
        Code::Cancelled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];
    codes
        .into_iter()
        .find(|c| csi_attacher::csi::go_code_name(*c) == text)
        .ok_or_else(|| {
            format!("unknown gRPC code {text:?} (use Go names such as ResourceExhausted)")
        })
}
