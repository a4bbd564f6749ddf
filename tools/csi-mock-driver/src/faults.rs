//! Programmable faults, one per CSI method: delay, error, hang, exit, and
//! hostile answers (a raw HTTP/2 reply of any bytes, endless ListVolumes tokens).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// Answer with these bytes instead of a well-formed gRPC reply (see [`RawReply`]).
    #[serde(default)]
    pub raw: Option<RawReply>,
    /// ListVolumes: answer every page with no entries and a next_token never seen before.
    #[serde(default)]
    pub endless_tokens: bool,
}

/// A gRPC reply written byte by byte, for answers no well-behaved server sends:
/// invalid UTF-8 in strings, unknown status codes, broken headers or framing.
///
/// The reply is HTTP/2 status 200, `content-type: application/grpc`, one data
/// frame (when `body_hex` is set) and trailers `grpc-status` / `grpc-message` /
/// `grpc-status-details-bin`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReply {
    /// The protobuf message, hex; framed with the 5-byte gRPC prefix unless `unframed`.
    #[serde(default)]
    pub body_hex: Option<String>,
    /// Send `body_hex` as the whole data frame, without the gRPC length prefix.
    #[serde(default)]
    pub unframed: bool,
    /// The `grpc-status` trailer, as sent (any text: `0`, `99`, `abc`).
    #[serde(default)]
    pub grpc_status: Option<String>,
    /// The `grpc-message` trailer's bytes, hex (need not be UTF-8 or percent-encoded).
    #[serde(default)]
    pub grpc_message_hex: Option<String>,
    /// The `grpc-status-details-bin` trailer, as sent (need not be base64).
    #[serde(default)]
    pub grpc_status_details: Option<String>,
}

impl RawReply {
    /// Bytes of a hex string (whitespace allowed).
    pub fn hex(text: &str) -> Result<Vec<u8>, String> {
        let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        if !digits.len().is_multiple_of(2) {
            return Err("hex needs an even number of digits".into());
        }
        digits
            .chunks(2)
            .map(|pair| {
                std::str::from_utf8(pair)
                    .ok()
                    .and_then(|p| u8::from_str_radix(p, 16).ok())
                    .ok_or_else(|| format!("not hex: {:?}", String::from_utf8_lossy(pair)))
            })
            .collect()
    }

    fn validate(&self) -> Result<(), String> {
        for hex in [&self.body_hex, &self.grpc_message_hex]
            .into_iter()
            .flatten()
        {
            Self::hex(hex)?;
        }
        Ok(())
    }
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
        if let Some(raw) = &self.raw {
            raw.validate()?;
        }
        Ok(())
    }
}

/// The fault table, shared by the gRPC services and the admin API.
pub struct Faults {
    table: Mutex<HashMap<String, Fault>>,
    changed: watch::Sender<u64>,
    /// Counter behind `endless_tokens`.
    tokens: AtomicU64,
}

impl Faults {
    pub fn new() -> Self {
        Self {
            table: Mutex::new(HashMap::new()),
            changed: watch::channel(0).0,
            tokens: AtomicU64::new(0),
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

    /// A token no ListVolumes answer has carried before.
    pub fn fresh_token(&self) -> String {
        format!("endless-{}", self.tokens.fetch_add(1, Ordering::Relaxed))
    }

    /// The raw reply for this call of `method`, if its fault has one (counts down `times`).
    pub fn take_raw(&self, method: &str) -> Option<RawReply> {
        let has_raw = self.lock().get(method).is_some_and(|f| f.raw.is_some());
        if !has_raw {
            return None;
        }
        self.take(method).and_then(|f| f.raw)
    }

    /// Applies the fault for `method`, if any. `Err` is the status to answer with;
    /// `Ok` carries the fault (for the answer-shaping fields) when there is one.
    pub async fn apply(&self, method: &str) -> Result<Option<Fault>, Status> {
        let Some(fault) = self.take(method) else {
            return Ok(None);
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
            None => Ok(Some(fault)),
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
