//! A byte-counting TCP proxy on 127.0.0.1 between an attacher and the API
//! server (the cost scenario): the attacher's kubeconfig points at it, TLS
//! passes through untouched, and it counts the bytes each way. Closing its
//! gate cuts every connection through it and turns new ones away (accepted,
//! then closed at once) until it opens again. It connects to loopback only.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

#[derive(Default)]
struct Shared {
    /// Bytes from the API server to the client.
    down: AtomicU64,
    /// Bytes from the client to the API server.
    up: AtomicU64,
    closed: AtomicBool,
    /// The copying tasks of the open connections (finished ones too, until
    /// the next cut).
    connections: Mutex<Vec<AbortHandle>>,
}

/// A running proxy; stops (and cuts its connections) when dropped.
pub struct CountingProxy {
    /// Where it listens.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}

impl CountingProxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `target`, which
    /// must be a loopback address.
    pub async fn start(target: SocketAddr) -> Result<Self> {
        if !target.ip().is_loopback() {
            bail!("the counting proxy forwards to loopback only, not {target}");
        }
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let accept_shared = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if accept_shared.closed.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let shared = accept_shared.clone();
                let handle = tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    let up = copy(client_read, server_write, &shared.up);
                    let down = copy(server_read, client_write, &shared.down);
                    // Either side closing ends the connection (both halves dropped).
                    tokio::select! {
                        _ = up => {}
                        _ = down => {}
                    }
                });
                accept_shared
                    .connections
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(handle.abort_handle());
            }
        });
        Ok(CountingProxy { addr, shared, task })
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Bytes sent to clients (from the API server) so far.
    pub fn bytes_down(&self) -> u64 {
        self.shared.down.load(Ordering::SeqCst)
    }

    /// Bytes sent to the API server (from clients) so far.
    pub fn bytes_up(&self) -> u64 {
        self.shared.up.load(Ordering::SeqCst)
    }

    /// Closes the gate: cuts every connection and turns new ones away.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.cut();
    }

    /// Opens the gate again.
    pub fn open(&self) {
        self.shared.closed.store(false, Ordering::SeqCst);
    }

    fn cut(&self) {
        let handles = std::mem::take(
            &mut *self
                .shared
                .connections
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for handle in handles {
            handle.abort();
        }
    }
}

/// Copies `from` into `to`, adding what passes to `count`, until either ends.
async fn copy(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    count: &AtomicU64,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        count.fetch_add(n as u64, Ordering::SeqCst);
    }
    let _ = to.shutdown().await;
}
