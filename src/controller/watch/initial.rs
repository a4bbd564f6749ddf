//! How a watch gets the objects that exist when it starts: a streaming list
//! (KEP-3157, `sendInitialEvents=true`, as upstream v4.12's client-go) where
//! the API server serves one, a paginated, consistent LIST where it does not.
//! The facts (client-go's `KUBE_FEATURE_WatchListClient=false` switch, which
//! API servers refuse and how) are in `docs/contract.md`, "Watches and
//! queues". Here a refusal (422, or 400) switches that watch to paginated
//! LISTs for the life of the process, logged once; so do two streaming
//! attempts in a row that end before the end bookmark (something that
//! ignores the parameter would never send it), where one is a dropped
//! connection, retried as a stream. Any other error is retried with the
//! watch's backoff.

use futures::stream::BoxStream;
use futures::StreamExt;
use kube::runtime::watcher::{self, Event};

use super::proto;
use crate::controller::model::proto::FromProto;

/// The environment variable client-go reads for its `WatchListClient` gate.
pub const WATCH_LIST_ENV: &str = "KUBE_FEATURE_WatchListClient";

/// How a watch lists what exists when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitialList {
    /// A streaming list, falling back to pages where it is refused.
    Streaming,
    /// Paginated, consistent LISTs only.
    Paginated,
}

impl InitialList {
    /// The mode `KUBE_FEATURE_WatchListClient` asks for (streaming when
    /// unset), and a warning to log when its value is not a Go boolean.
    pub fn from_env_value(value: Option<&str>) -> (Self, Option<String>) {
        let Some(value) = value else {
            return (Self::Streaming, None);
        };
        match parse_go_bool(value) {
            Some(true) => (Self::Streaming, None),
            Some(false) => (Self::Paginated, None),
            None => (
                Self::Streaming,
                Some(format!(
                    "{WATCH_LIST_ENV}={value:?} is not a boolean; ignored (streaming lists stay on)"
                )),
            ),
        }
    }

    /// The mode this process's environment asks for, read once.
    pub fn from_env() -> Self {
        static MODE: std::sync::OnceLock<InitialList> = std::sync::OnceLock::new();
        *MODE.get_or_init(|| {
            let value = std::env::var(WATCH_LIST_ENV).ok();
            let (mode, warning) = Self::from_env_value(value.as_deref());
            if let Some(warning) = warning {
                tracing::warn!("{warning}");
            }
            mode
        })
    }
}

/// Go's `strconv.ParseBool`.
fn parse_go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Whether `err` is the API server refusing a streaming list (422, 400):
/// not a failure to retry.
pub fn is_refusal(err: &watcher::Error) -> bool {
    matches!(
        err,
        watcher::Error::WatchStartFailed(kube::Error::Api(status))
            if matches!(status.code, 400 | 422)
    )
}

/// What one streaming attempt has shown so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Attempts {
    /// An attempt has started (its `Init` seen) and not ended (`InitDone`).
    open: bool,
    /// Attempts in a row that ended before their end bookmark.
    unfinished: u32,
}

impl Attempts {
    /// Notes one item of a streaming watcher: the reason to list in pages
    /// from now on, if it gives one (`None`: go on streaming).
    pub fn observe<K>(&mut self, item: &Result<Event<K>, watcher::Error>) -> Option<&'static str> {
        match item {
            Err(err) if is_refusal(err) => {
                return Some("the API server refuses streaming lists");
            }
            Ok(Event::Init) => {
                if self.open {
                    self.unfinished += 1;
                }
                self.open = true;
                if self.unfinished >= 2 {
                    return Some("two streaming lists in a row ended before their end bookmark");
                }
            }
            Ok(Event::InitDone) => {
                self.open = false;
                self.unfinished = 0;
            }
            _ => {}
        }
        None
    }
}

/// The protobuf watcher ([`super::proto`]) in `mode`: in
/// [`InitialList::Streaming`], switched to paginated lists when the API
/// server refuses streaming ones (module docs).
pub fn proto_watcher<K>(
    client: kube::Client,
    mode: InitialList,
    kind: &'static str,
) -> BoxStream<'static, Result<Event<K>, watcher::Error>>
where
    K: kube::Resource<DynamicType = ()> + FromProto + Send + 'static,
{
    if mode == InitialList::Paginated {
        return proto::watcher(client, true);
    }
    let state = (
        proto::watcher(client.clone(), false),
        Some(Attempts::default()),
    );
    // A stream that switches ends its open attempt with the paginated
    // watcher's own `Init`, so consumers see one re-list.
    futures::stream::unfold(state, move |(mut inner, mut attempts)| {
        let client = client.clone();
        async move {
            loop {
                let item = inner.next().await?;
                if let Some(reason) = attempts.as_mut().and_then(|seen| seen.observe(&item)) {
                    match &item {
                        Err(err) => tracing::info!(
                            kind,
                            reason,
                            error = %crate::kube_client::error_chain(err),
                            "listing in pages from now on"
                        ),
                        Ok(_) => tracing::warn!(kind, reason, "listing in pages from now on"),
                    }
                    inner = proto::watcher(client.clone(), true);
                    attempts = None;
                    continue;
                }
                return Some((item, (inner, attempts)));
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api_error(code: u16) -> watcher::Error {
        watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(Status::failure(
            "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
            "Invalid",
        ).with_code(code))))
    }

    #[test]
    fn the_environment_switches_streaming_off_as_client_go_reads_it() {
        assert_eq!(InitialList::from_env_value(None).0, InitialList::Streaming);
        for on in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(
                InitialList::from_env_value(Some(on)),
                (InitialList::Streaming, None)
            );
        }
        for off in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(
                InitialList::from_env_value(Some(off)),
                (InitialList::Paginated, None)
            );
        }
        for bad in ["", "no", "off", "tRUE", " false"] {
            let (mode, warning) = InitialList::from_env_value(Some(bad));
            assert_eq!(mode, InitialList::Streaming, "{bad:?}");
            assert!(
                warning.is_some_and(|w| w.contains(WATCH_LIST_ENV)),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_refused_stream_falls_back_and_other_failures_do_not() {
        assert!(is_refusal(&api_error(422)));
        assert!(is_refusal(&api_error(400)));
        // Protobuf refused is a failure, not a reason to page (the pages are protobuf too).
        for code in [403, 406, 410, 415, 429, 500, 503] {
            assert!(!is_refusal(&api_error(code)), "{code}");
        }
        let mut attempts = Attempts::default();
        let item: Result<Event<()>, _> = Err(api_error(503));
        assert_eq!(attempts.observe(&item), None);
        let item: Result<Event<()>, _> = Err(api_error(422));
        assert!(attempts.observe(&item).is_some());
    }

    #[test]
    fn two_unfinished_attempts_in_a_row_fall_back_and_one_does_not() {
        let mut attempts = Attempts::default();
        let init: Result<Event<()>, watcher::Error> = Ok(Event::Init);
        let done: Result<Event<()>, watcher::Error> = Ok(Event::InitDone);
        assert_eq!(attempts.observe(&init), None);
        assert_eq!(attempts.observe(&init), None, "one dropped stream");
        assert_eq!(attempts.observe(&done), None);
        // Finished attempts reset the count.
        assert_eq!(attempts.observe(&init), None);
        assert_eq!(attempts.observe(&done), None);
        assert_eq!(attempts.observe(&init), None);
        assert_eq!(attempts.observe(&init), None);
        assert!(attempts.observe(&init).is_some());
    }
}
