//! The gRPC connection to the driver's Unix socket, and noticing when it dies.
//!
//! One tonic `Channel` is opened at startup and cloned for every call (a
//! `Channel` is a cheap handle to one HTTP/2 connection). Every socket the
//! channel opens is wrapped so that an EOF or I/O error flips a watch flag:
//! like upstream, a lost driver connection ends the process rather than being
//! papered over by reconnects (see [`ConnectionLoss`]).

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use backon::{ConstantBuilder, Retryable};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};

use super::Error;

/// Upstream gives up dialling after this long and exits.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(30);
/// Upstream's reconnect backoff is capped at one second.
const DIAL_RETRY: Duration = Duration::from_secs(1);
/// "Still connecting" is logged this often while dialling.
const DIAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// Parses `--csi-address` as upstream accepts it: an absolute socket path,
/// or `unix://` followed by an absolute path.
///
/// `unix://relative/csi.sock` is refused, as upstream refuses it: gRPC-Go
/// reads `relative` as the URL's authority and its unix resolver rejects any
/// authority ("invalid (non-empty) authority"), so the Go attacher exits 1
/// before dialling. A bare relative path, or `unix:relative`, never reaches
/// the dialer there either ("OnConnectionLoss callback only supported for
/// unix:// addresses").
pub fn parse_address(address: &str) -> Result<PathBuf, Error> {
    let invalid = |reason| Error::InvalidAddress {
        address: address.to_string(),
        reason,
    };
    let path = if let Some(rest) = address.strip_prefix("unix://") {
        if !rest.is_empty() && !rest.starts_with('/') {
            return Err(invalid(
                "unix:// must be followed by an absolute path (gRPC reads what follows as the \
                 URL authority and refuses it: invalid (non-empty) authority)",
            ));
        }
        rest
    } else if address.contains("://") {
        return Err(invalid(
            "only unix:// addresses are supported (the attacher exits when the connection is lost)",
        ));
    } else {
        address
    };
    if path.is_empty() {
        return Err(invalid("the socket path is empty"));
    }
    if !path.starts_with('/') {
        return Err(invalid(
            "expected an absolute socket path or unix:///absolute/path",
        ));
    }
    Ok(PathBuf::from(path))
}

/// Resolves when the driver connection is gone.
#[derive(Clone)]
pub struct ConnectionLoss(watch::Receiver<bool>);

impl ConnectionLoss {
    /// Waits until a socket of the channel saw EOF or an I/O error.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing; call again to keep waiting.
    pub async fn lost(&mut self) {
        // An Err means the sender (owned by the channel's connector) is gone,
        // which only happens once the channel itself is dropped: also a loss.
        let _ = self.0.wait_for(|lost| *lost).await;
    }

    /// Whether the loss has already been seen.
    pub fn is_lost(&self) -> bool {
        *self.0.borrow()
    }
}

/// Dials the driver socket, retrying every second for up to `timeout`.
pub async fn connect(path: &Path, timeout: Duration) -> Result<(Channel, ConnectionLoss), Error> {
    let (lost_tx, lost_rx) = watch::channel(false);
    let lost_tx = Arc::new(lost_tx);
    let socket = Arc::new(path.to_path_buf());
    // The URI is required by tonic but never resolved: the connector below dials the socket.
    let endpoint = Endpoint::from_static("http://csi.driver.local");
    let connector = tower::service_fn(move |_uri| {
        let socket = Arc::clone(&socket);
        let lost_tx = Arc::clone(&lost_tx);
        async move {
            let stream = UnixStream::connect(&*socket).await?;
            Ok::<_, io::Error>(TokioIo::new(WatchedStream {
                inner: stream,
                lost: lost_tx,
            }))
        }
    });

    let shown = path.display().to_string();
    let started = tokio::time::Instant::now();
    let mut last_log = started;
    let dial = || endpoint.connect_with_connector(connector.clone());
    let attempt = dial
        .retry(
            ConstantBuilder::default()
                .with_delay(DIAL_RETRY)
                .without_max_times(),
        )
        .sleep(tokio::time::sleep)
        .notify(|err, _| {
            if last_log.elapsed() >= DIAL_LOG_EVERY {
                last_log = tokio::time::Instant::now();
                tracing::warn!(address = %shown, error = %err, "Still connecting to CSI driver");
            }
        });
    let mut last_error = String::from("no attempt finished");
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(channel)) => {
            tracing::info!(address = %path.display(), "Connected to CSI driver");
            Ok((channel, ConnectionLoss(lost_rx)))
        }
        Ok(Err(err)) => {
            last_error = err.to_string();
            Err(connect_timeout(path, timeout, last_error))
        }
        Err(_) => {
            // The dial itself reports why: try once more without waiting to say it.
            if let Ok(Err(err)) = tokio::time::timeout(Duration::from_millis(100), dial()).await {
                last_error = format!("{err}: {}", source_chain(&err));
            }
            Err(connect_timeout(path, timeout, last_error))
        }
    }
}

fn connect_timeout(path: &Path, timeout: Duration, last_error: String) -> Error {
    Error::ConnectTimeout {
        address: path.display().to_string(),
        timeout,
        last_error,
    }
}

fn source_chain(err: &dyn std::error::Error) -> String {
    let mut parts = Vec::new();
    let mut source = err.source();
    while let Some(s) = source {
        parts.push(s.to_string());
        source = s.source();
    }
    parts.join(": ")
}

/// A Unix stream that reports EOF and I/O errors on a watch channel.
struct WatchedStream {
    inner: UnixStream,
    lost: Arc<watch::Sender<bool>>,
}

impl WatchedStream {
    fn note<T>(&self, result: &Poll<io::Result<T>>) {
        if let Poll::Ready(Err(err)) = result {
            tracing::debug!(error = %err, "CSI socket I/O error");
            self.lost.send_replace(true);
        }
    }
}

impl AsyncRead for WatchedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let wanted = buf.remaining() > 0;
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        self.note(&result);
        if matches!(result, Poll::Ready(Ok(()))) && wanted && buf.filled().len() == before {
            // Zero bytes into a non-empty buffer: the driver closed the socket.
            self.lost.send_replace(true);
        }
        result
    }
}

impl AsyncWrite for WatchedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note(&result);
        result
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        self.note(&result);
        result
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note(&result);
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_paths_and_unix_urls_are_accepted() {
        assert_eq!(
            parse_address("/run/csi/socket").ok(),
            Some(PathBuf::from("/run/csi/socket"))
        );
        assert_eq!(
            parse_address("unix:///run/csi/socket").ok(),
            Some(PathBuf::from("/run/csi/socket"))
        );
    }

    #[test]
    fn other_addresses_are_rejected_with_a_reason() {
        for bad in [
            "tcp://127.0.0.1:10000",
            "relative/socket",
            "unix://",
            "",
            "unix:relative",
            "unix://relative",
            "unix://./csi.sock",
        ] {
            let err = parse_address(bad).expect_err(bad);
            assert!(err.to_string().starts_with("invalid CSI address"), "{err}");
        }
        let err = parse_address("unix://csi/socket").expect_err("relative");
        assert!(err.to_string().contains("authority"), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn dialling_a_missing_socket_gives_up_after_the_timeout() {
        let dir = std::env::temp_dir().join(format!("csi-dial-{}", std::process::id()));
        let err = connect(&dir.join("nothing.sock"), Duration::from_secs(3))
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("failed to connect to CSI driver"), "{err}");
        assert!(err.contains("nothing.sock"), "{err}");
    }
}
