//! A loopback TCP fault proxy between one attacher replica and the API server.
//!
//! TLS passes through untouched (the proxy never sees HTTP); faults act on the
//! byte streams: delay every chunk, black hole (hold everything, new
//! connections too, until healed), reset (RST every connection, refuse new
//! ones), and lost replies (requests reach the API server, the first reply
//! bytes are dropped and the connection is reset: the write is applied, its
//! answer never arrives), and half-open (every connection vanishes on the
//! proxy's side without a FIN or RST, as when a NAT or load balancer drops
//! the flow or the peer's host dies: the replica's side stays established
//! and learns of it only when it sends, a keepalive probe included, and
//! gets a reset back).

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does to traffic right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Delay(u64),
    Blackhole,
    Reset,
    LoseReplies,
    HalfOpen,
}

/// A running proxy; traffic to `addr` goes to the upstream.
pub struct Proxy {
    pub addr: SocketAddr,
    mode: watch::Sender<Mode>,
}

impl Proxy {
    /// Listens on 127.0.0.1 (a free port) and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, _) = watch::channel(Mode::Pass);
        let rx = mode.subscribe();
        tokio::spawn(accept_loop(listener, upstream, rx));
        Ok(Self { addr, mode })
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, rx: watch::Receiver<Mode>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let rx = rx.clone();
        tokio::spawn(async move {
            let _ = connection(client, upstream, rx).await;
        });
    }
}

/// Closes `stream` with an RST instead of a FIN.
fn reset(stream: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a socket we own, with a correctly sized linger struct.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// Closes `stream` silently: in TCP repair mode the kernel destroys the
/// socket without sending a FIN or RST (needs CAP_NET_ADMIN, as the suite's
/// root has). The peer keeps its end established until it sends something.
fn vanish(stream: TcpStream) {
    let on: libc::c_int = 1;
    // SAFETY: setsockopt on a socket we own, with a correctly sized int.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_TCP,
            libc::TCP_REPAIR,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    drop(stream);
}

/// Waits until the mode is not a black hole; `None` if the proxy is gone.
async fn through_blackhole(rx: &mut watch::Receiver<Mode>) -> Option<Mode> {
    loop {
        let mode = *rx.borrow_and_update();
        if mode != Mode::Blackhole {
            return Some(mode);
        }
        rx.changed().await.ok()?;
    }
}

async fn connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut rx: watch::Receiver<Mode>,
) -> std::io::Result<()> {
    match through_blackhole(&mut rx).await {
        Some(Mode::Reset) | None => {
            reset(&client);
            return Ok(());
        }
        Some(Mode::HalfOpen) => {
            vanish(client);
            return Ok(());
        }
        _ => {}
    }
    let mut server = match TcpStream::connect(upstream).await {
        Ok(s) => s,
        Err(_) => {
            reset(&client);
            return Ok(());
        }
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let mut up = vec![0u8; 64 * 1024];
    let mut down = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            read = client.read(&mut up) => {
                let n = read?;
                if n == 0 { return Ok(()); }
                match forward_mode(&mut rx).await {
                    Some(Mode::Reset) | None => { reset(&client); reset(&server); return Ok(()); }
                    Some(Mode::HalfOpen) => { vanish(client); return Ok(()); }
                    Some(Mode::Delay(ms)) => tokio::time::sleep(Duration::from_millis(ms)).await,
                    _ => {}
                }
                server.write_all(&up[..n]).await?;
            }
            read = server.read(&mut down) => {
                let n = read?;
                if n == 0 { return Ok(()); }
                match forward_mode(&mut rx).await {
                    Some(Mode::Reset) | Some(Mode::LoseReplies) | None => {
                        reset(&client); reset(&server); return Ok(());
                    }
                    Some(Mode::HalfOpen) => { vanish(client); return Ok(()); }
                    Some(Mode::Delay(ms)) => tokio::time::sleep(Duration::from_millis(ms)).await,
                    _ => {}
                }
                client.write_all(&down[..n]).await?;
            }
            changed = rx.changed() => {
                if changed.is_err() || *rx.borrow() == Mode::Reset {
                    reset(&client); reset(&server); return Ok(());
                }
                if *rx.borrow() == Mode::HalfOpen {
                    vanish(client);
                    return Ok(());
                }
            }
        }
    }
}

/// The mode to forward one chunk under (waits out a black hole).
async fn forward_mode(rx: &mut watch::Receiver<Mode>) -> Option<Mode> {
    through_blackhole(rx).await
}
