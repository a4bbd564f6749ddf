//! `--enforce-epoch`: the attacher's fencing token (`x-csi-attacher-epoch`,
//! sent with its `--fencing-token-metadata`), enforced as a driver that
//! adopts the extension would (docs/mock-driver.md, docs/contract.md).

use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use csi_attacher::csi::EPOCH_HEADER;
use serde_json::{Map, Value};
use tonic::Status;

/// The fencing token of `--enforce-epoch`: the highest epoch number
/// (`x-csi-attacher-epoch: <number>/<holder>`) any Controller call acted
/// for. A call with a lower number is refused with FAILED_PRECONDITION when
/// it would act (after its fault's delay or hang: a call that arrived in
/// time but acts after a newer leader's is refused too). A call without the
/// header is not fenced. The highest number is kept in a file (with
/// `--state-file`: the state file's path with the extension `.epoch`),
/// written as it rises, so that a
/// restarted driver still refuses what it refused before, as a real one
/// must: its memory of the epoch is part of what it has done.
#[derive(Debug, Default)]
pub struct Epochs {
    highest: Mutex<Option<u64>>,
    file: Option<PathBuf>,
}

impl Epochs {
    /// Remembers the highest epoch in `file` (read now when it exists).
    pub fn open(file: Option<PathBuf>) -> std::io::Result<Self> {
        let highest = match &file {
            Some(path) => match std::fs::read_to_string(path) {
                Ok(text) => Some(
                    text.trim()
                        .parse()
                        .map_err(|e| std::io::Error::other(format!("{}: {e}", path.display())))?,
                ),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
                Err(err) => return Err(err),
            },
            None => None,
        };
        Ok(Self {
            highest: Mutex::new(highest),
            file,
        })
    }

    /// Writes `number` to the file (a new file renamed over the old one).
    fn save(&self, number: u64) {
        if let Some(path) = &self.file {
            let fresh = path.with_extension("epoch.new");
            let saved = std::fs::write(&fresh, number.to_string())
                .and_then(|()| std::fs::rename(&fresh, path));
            if let Err(err) = saved {
                eprintln!(
                    "csi-mock-driver: cannot save the epoch to {}: {err}",
                    path.display()
                );
            }
        }
    }

    /// Admits a call of epoch `number` now (raising the highest), or refuses
    /// it. Admitted: when, in Unix nanoseconds, read under the lock, so the
    /// admissions' times are in the order the fence saw them.
    pub fn admit(&self, number: u64) -> Result<u64, Status> {
        let mut highest = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        match *highest {
            Some(seen) if number < seen => Err(Status::failed_precondition(format!(
                "stale leadership epoch {number}: a call of epoch {seen} has acted ({EPOCH_HEADER})"
            ))),
            seen => {
                if seen != Some(number) {
                    *highest = Some(number);
                    self.save(number);
                }
                Ok(SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
                    .unwrap_or_default())
            }
        }
    }
}

/// The epoch header of `metadata` (as sent), if any.
pub fn epoch_of(metadata: &tonic::metadata::MetadataMap) -> Option<String> {
    metadata
        .get(EPOCH_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// The number of an epoch header (`<number>/<holder>`); `None`: unreadable.
pub fn epoch_number(epoch: &str) -> Option<u64> {
    epoch.split('/').next()?.parse().ok()
}

/// The call's epoch header in its ledger entry (`epoch`), when it has one.
pub fn with_epoch(fields: &mut Map<String, Value>, epoch: Option<String>) {
    if let Some(epoch) = epoch {
        fields.insert("epoch".into(), epoch.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lower_epoch_is_refused_once_a_higher_one_acted_and_an_equal_one_is_not() {
        let epochs = Epochs::default();
        assert!(epochs.admit(3).is_ok(), "the first epoch");
        assert!(epochs.admit(3).is_ok(), "the same leader again");
        let stale = epochs.admit(2).expect_err("an earlier leader");
        assert_eq!(stale.code(), tonic::Code::FailedPrecondition);
        assert!(
            stale.message().contains("stale leadership epoch 2"),
            "{stale:?}"
        );
        assert!(epochs.admit(4).is_ok(), "a later leader");
        assert!(epochs.admit(3).is_err(), "the previous one, now stale");
    }

    #[test]
    fn a_restarted_driver_remembers_the_highest_epoch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("state.json.epoch");
        let epochs = Epochs::open(Some(file.clone())).expect("open");
        assert!(epochs.admit(5).is_ok());
        assert!(epochs.admit(9).is_ok());
        drop(epochs);
        let restarted = Epochs::open(Some(file)).expect("reopen");
        assert!(
            restarted.admit(5).is_err(),
            "refused before the restart, refused after"
        );
        assert!(restarted.admit(9).is_ok());
    }

    #[test]
    fn the_number_is_read_before_the_first_slash() {
        assert_eq!(epoch_number("7/replica-a"), Some(7));
        assert_eq!(epoch_number("12/a/b"), Some(12));
        assert_eq!(epoch_number("x/replica-a"), None);
        assert_eq!(epoch_number(""), None);
    }
}
