//! The call ledger: one JSON line per CSI call, in a file and in memory.
//!
//! Every entry names the socket the call came through (`caller`, the index of
//! its `--endpoint`) and a per-process `call_id`. With `--ledger-events` the
//! file also gets a line when a Controller call starts (`"event": "start"`)
//! and when its caller goes away before the answer (`"event": "abandoned"`),
//! so a test can act the moment a call begins and bound a call by its caller's
//! lifetime, and, under a driver profile, a line when a cloud operation starts
//! (`"event": "operation"`, with the latency drawn for it). Those event lines
//! are not in the in-memory ledger (`GET /ledger`).

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

/// The socket and call a request came through.
#[derive(Debug, Clone)]
pub struct CallTag {
    /// Index of the `--endpoint` the call arrived on.
    pub caller: usize,
    /// Unique within this process.
    pub call_id: u64,
}

tokio::task_local! {
    /// Set around every call by the caller layer in `main.rs`.
    pub static CALL: CallTag;
}

pub struct Ledger {
    file: Option<Mutex<File>>,
    entries: Mutex<Vec<Value>>,
    /// Write `start` / `abandoned` event lines to the file.
    events: bool,
}

fn unix_nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default()
}

impl Ledger {
    pub fn open(path: Option<&Path>, events: bool) -> std::io::Result<Self> {
        let file = match path {
            Some(p) => Some(Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)?,
            )),
            None => None,
        };
        Ok(Self {
            file,
            entries: Mutex::new(Vec::new()),
            events,
        })
    }

    fn write_line(&self, entry: &Value) {
        if let Some(file) = &self.file {
            let mut file = file.lock().unwrap_or_else(PoisonError::into_inner);
            if let Err(err) = writeln!(file, "{entry}") {
                eprintln!("csi-mock-driver: cannot write ledger: {err}");
            }
        }
    }

    /// An event line (`start`, `abandoned`) for one call, when enabled.
    pub fn event(&self, event: &str, method: &str, tag: &CallTag) {
        if !self.events {
            return;
        }
        self.write_line(&json!({
            "event": event,
            "method": method,
            "caller": tag.caller,
            "call_id": tag.call_id,
            "time_unix_nanos": unix_nanos(SystemTime::now()),
        }));
    }

    /// An `operation` line, when event lines are enabled: a cloud operation
    /// started (its kind, `attach` or `detach`, its volume and node, its
    /// number among the operations of that kind for that pair, from 1) and
    /// the latency drawn for it, in milliseconds at the run's time scale.
    /// The benchmark's operations bound (P8) reads them: what the cloud
    /// alone takes, whoever calls in whatever order.
    pub fn operation(&self, kind: &str, volume: &str, node: &str, number: u64, latency: Duration) {
        if !self.events {
            return;
        }
        self.write_line(&json!({
            "event": "operation",
            "kind": kind,
            "volume_id": volume,
            "node_id": node,
            "number": number,
            "latency_ms": latency.as_secs_f64() * 1e3,
            "time_unix_nanos": unix_nanos(SystemTime::now()),
        }));
    }

    /// Appends one entry: `fields` plus method, time, code, message and the caller.
    pub fn record(
        &self,
        method: &str,
        received: SystemTime,
        mut fields: Map<String, Value>,
        result: &Result<(), tonic::Status>,
    ) {
        let took = received
            .elapsed()
            .map(|d| d.as_secs_f64() * 1e3)
            .unwrap_or_default();
        fields.insert("method".into(), method.into());
        fields.insert("time_unix_nanos".into(), unix_nanos(received).into());
        fields.insert("duration_ms".into(), took.into());
        let (code, message) = match result {
            Ok(()) => ("OK", String::new()),
            Err(status) => (
                csi_attacher::csi::go_code_name(status.code()),
                status.message().to_string(),
            ),
        };
        fields.insert("code".into(), code.into());
        fields.insert("message".into(), message.into());
        if let Ok(tag) = CALL.try_with(CallTag::clone) {
            fields.insert("caller".into(), tag.caller.into());
            fields.insert("call_id".into(), tag.call_id.into());
        }
        let entry = Value::Object(fields);
        self.write_line(&entry);
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(entry);
    }

    pub fn entries(&self) -> Vec<Value> {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
