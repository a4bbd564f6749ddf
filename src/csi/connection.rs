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

/// Largest header list (headers or trailers) accepted from the driver:
/// gRPC-Go's default. With h2's 16 KiB, a driver error message over ~16 KiB
/// would arrive as "ResourceExhausted: h2 protocol error", not as the
/// driver's code and (capped) text.
const MAX_HEADER_LIST_SIZE: u32 = 16 << 20;

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

/// How long a dial refused with EACCES is retried before giving up.
///
/// Upstream (gRPC's blocking dial) retries EACCES like any dial error until
/// its 30 s timeout, exits 1 with a bare "context deadline exceeded", and the
/// container crash-loops. A socket that another user owns and we may not
/// write does not become writable on its own, so waiting the full 30 s only
/// delays the explanation. A few seconds still cover a driver that binds its
/// socket and then chmods or chowns it.
const PERMISSION_DENIED_GRACE: Duration = Duration::from_secs(5);

/// Dials the driver socket, retrying every second for up to `timeout`.
///
/// A socket we may not write fails fast, after [`PERMISSION_DENIED_GRACE`],
/// with [`Error::SocketPermissionDenied`] saying whose socket it is and the
/// ways out.
pub async fn connect(path: &Path, timeout: Duration) -> Result<(Channel, ConnectionLoss), Error> {
    let (lost_tx, lost_rx) = watch::channel(false);
    let lost_tx = Arc::new(lost_tx);
    let socket = Arc::new(path.to_path_buf());
    // The URI is never resolved: the connector below dials the socket.
    let endpoint = Endpoint::from_static("http://csi.driver.local")
        .http2_max_header_list_size(MAX_HEADER_LIST_SIZE);
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
    let mut denied_since: Option<tokio::time::Instant> = None;
    let dial = || endpoint.connect_with_connector(connector.clone());
    let attempt = dial
        .retry(
            ConstantBuilder::default()
                .with_delay(DIAL_RETRY)
                .without_max_times(),
        )
        .sleep(tokio::time::sleep)
        // Everything but a lasting EACCES is retried until the overall timeout.
        .when(|err| {
            if dial_error_kind(err) != Some(io::ErrorKind::PermissionDenied) {
                denied_since = None;
                return true;
            }
            let since = *denied_since.get_or_insert_with(|| {
                tracing::warn!(
                    address = %shown,
                    grace = ?PERMISSION_DENIED_GRACE,
                    "Permission denied connecting to CSI driver socket, retrying briefly"
                );
                tokio::time::Instant::now()
            });
            since.elapsed() < PERMISSION_DENIED_GRACE
        })
        .notify(|err, _| {
            if last_log.elapsed() >= DIAL_LOG_EVERY {
                last_log = tokio::time::Instant::now();
                tracing::warn!(address = %shown, error = %err, "Still connecting to CSI driver");
            }
        });
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(channel)) => {
            tracing::info!(address = %path.display(), "Connected to CSI driver");
            Ok((channel, ConnectionLoss(lost_rx)))
        }
        Ok(Err(err)) if dial_error_kind(&err) == Some(io::ErrorKind::PermissionDenied) => {
            Err(Error::SocketPermissionDenied {
                message: SocketAccess::inspect(path).to_string(),
            })
        }
        Ok(Err(err)) => Err(connect_timeout(path, timeout, err.to_string())),
        Err(_) => {
            // The dial itself reports why: try once more without waiting to say it.
            let last_error = match tokio::time::timeout(Duration::from_millis(100), dial()).await {
                Ok(Err(err)) => format!("{err}: {}", source_chain(&err)),
                _ => String::from("no attempt finished"),
            };
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

/// The kind of the I/O error behind a failed dial, if one is in its source chain.
fn dial_error_kind(err: &(dyn std::error::Error + 'static)) -> Option<io::ErrorKind> {
    std::iter::successors(Some(err), |err| err.source())
        .find_map(|err| err.downcast_ref::<io::Error>())
        .map(io::Error::kind)
}

/// Why a connect(2) to the socket was refused: who owns it, who we are.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SocketAccess {
    path: String,
    /// The socket's owner and mode, or why it could not be read.
    socket: Result<FileOwner, String>,
    /// Our effective uid and gid, and supplementary groups.
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

/// Owner and permission bits of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileOwner {
    uid: u32,
    gid: u32,
    /// `st_mode`: file type and permission bits.
    mode: u32,
}

impl SocketAccess {
    /// Reads the socket's metadata and this process's credentials.
    fn inspect(path: &Path) -> Self {
        use rustix::process::{getegid, geteuid, getgroups};
        use std::os::unix::fs::MetadataExt;
        let socket = std::fs::metadata(path)
            .map(|m| FileOwner {
                uid: m.uid(),
                gid: m.gid(),
                mode: m.mode(),
            })
            .map_err(|err| err.to_string());
        Self {
            path: path.display().to_string(),
            socket,
            uid: geteuid().as_raw(),
            gid: getegid().as_raw(),
            groups: getgroups()
                .map(|groups| groups.into_iter().map(|g| g.as_raw()).collect())
                .unwrap_or_default(),
        }
    }
}

impl std::fmt::Display for SocketAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            path,
            socket,
            uid,
            gid,
            groups,
        } = self;
        let groups = if groups.is_empty() {
            "none".to_string()
        } else {
            groups
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        write!(
            f,
            "permission denied connecting to CSI driver socket {path} "
        )?;
        match socket {
            Ok(owner) => {
                let as_root = if owner.uid == 0 {
                    ", as the default image does"
                } else {
                    ""
                };
                write!(
                    f,
                    "({} {}:{}) as uid {uid} gid {gid} groups {groups}: connecting needs write \
                     permission on the socket. Either run the attacher as the socket's owner \
                     (securityContext.runAsUser: {}{as_root}), or have the driver create the \
                     socket writable for the attacher: group-writable (umask 0002) with a group \
                     the attacher is in (pod fsGroup, or runAsGroup/supplementalGroups: {})",
                    unix_mode::to_string(owner.mode),
                    owner.uid,
                    owner.gid,
                    owner.uid,
                    owner.gid,
                )
            }
            // stat(2) failing as well means a directory on the path is not searchable.
            Err(stat_error) => write!(
                f,
                "(cannot read its owner: {stat_error}) as uid {uid} gid {gid} groups {groups}: \
                 a directory on the path is not searchable for the attacher. Either make the \
                 socket's directories accessible to it (e.g. mode 0755), or run the attacher as \
                 root (securityContext.runAsUser: 0, as the default image does)"
            ),
        }
    }
}

fn source_chain(err: &dyn std::error::Error) -> String {
    let sources = std::iter::successors(err.source(), |err| err.source());
    sources
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

/// A Unix stream that reports EOF and I/O errors on a watch channel.
struct WatchedStream {
    inner: UnixStream,
    lost: Arc<watch::Sender<bool>>,
}

impl WatchedStream {
    fn note<T>(&self, result: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if let Poll::Ready(Err(err)) = &result {
            tracing::debug!(error = %err, "CSI socket I/O error");
            self.lost.send_replace(true);
        }
        result
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
        let result = self.note(result);
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
        self.note(result)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        self.note(result)
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
        self.note(result)
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

    #[tokio::test]
    async fn dial_errors_carry_the_io_error_kind_of_connect() {
        let path = std::env::temp_dir().join(format!("csi-kind-{}.sock", std::process::id()));
        let connector = tower::service_fn(move |_uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        });
        let err = Endpoint::from_static("http://csi.driver.local")
            .connect_with_connector(connector)
            .await
            .err()
            .map(|err| dial_error_kind(&err));
        assert_eq!(err, Some(Some(io::ErrorKind::NotFound)));
    }

    fn denied(socket: Result<FileOwner, String>) -> String {
        SocketAccess {
            path: "/csi/csi.sock".into(),
            socket,
            uid: 65532,
            gid: 65532,
            groups: vec![],
        }
        .to_string()
    }

    #[test]
    fn permission_denied_names_owner_mode_our_ids_and_the_ways_out() {
        let root_socket = FileOwner {
            uid: 0,
            gid: 0,
            mode: 0o140755,
        };
        assert_eq!(
            denied(Ok(root_socket)),
            "permission denied connecting to CSI driver socket /csi/csi.sock (srwxr-xr-x 0:0) \
             as uid 65532 gid 65532 groups none: connecting needs write permission on the \
             socket. Either run the attacher as the socket's owner (securityContext.runAsUser: \
             0, as the default image does), or have the driver create the socket writable for \
             the attacher: group-writable (umask 0002) with a group the attacher is in (pod \
             fsGroup, or runAsGroup/supplementalGroups: 0)"
        );
    }

    #[test]
    fn permission_denied_on_a_non_root_socket_names_its_owner_not_the_root_image() {
        let message = SocketAccess {
            path: "/run/csi/socket".into(),
            socket: Ok(FileOwner {
                uid: 1000,
                gid: 2000,
                mode: 0o140750,
            }),
            uid: 65532,
            gid: 65532,
            groups: vec![65532, 2000],
        }
        .to_string();
        assert!(message.contains("(srwxr-x--- 1000:2000)"), "{message}");
        assert!(message.contains("groups 65532,2000:"), "{message}");
        assert!(message.contains("runAsUser: 1000)"), "{message}");
        assert!(message.contains("supplementalGroups: 2000)"), "{message}");
        assert!(!message.contains("default image"), "{message}");
    }

    #[test]
    fn permission_denied_without_a_readable_socket_points_at_the_directories() {
        assert_eq!(
            denied(Err("Permission denied (os error 13)".into())),
            "permission denied connecting to CSI driver socket /csi/csi.sock (cannot read its \
             owner: Permission denied (os error 13)) as uid 65532 gid 65532 groups none: a \
             directory on the path is not searchable for the attacher. Either make the socket's \
             directories accessible to it (e.g. mode 0755), or run the attacher as root \
             (securityContext.runAsUser: 0, as the default image does)"
        );
    }
}
