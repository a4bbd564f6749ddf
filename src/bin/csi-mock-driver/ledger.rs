//! The call ledger: one JSON line per CSI call, in a file and in memory.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

pub struct Ledger {
    file: Option<Mutex<File>>,
    entries: Mutex<Vec<Value>>,
}

impl Ledger {
    pub fn open(path: Option<&Path>) -> std::io::Result<Self> {
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
        })
    }

    /// Appends one entry: `fields` plus method, time, code and message.
    pub fn record(
        &self,
        method: &str,
        received: SystemTime,
        mut fields: Map<String, Value>,
        result: &Result<(), tonic::Status>,
    ) {
        let nanos = received
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default();
        let took = received
            .elapsed()
            .map(|d| d.as_secs_f64() * 1e3)
            .unwrap_or_default();
        fields.insert("method".into(), method.into());
        fields.insert("time_unix_nanos".into(), nanos.into());
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
        let entry = Value::Object(fields);
        if let Some(file) = &self.file {
            let mut file = file.lock().unwrap_or_else(PoisonError::into_inner);
            if let Err(err) = writeln!(file, "{entry}") {
                eprintln!("csi-mock-driver: cannot write ledger: {err}");
            }
        }
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
