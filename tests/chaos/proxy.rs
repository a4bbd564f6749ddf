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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
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
    /// Bumped by [`Proxy::vanish_open`]: every connection accepted before
    /// the bump vanishes when its task next runs, however late that is.
    vanish: watch::Sender<u64>,
    /// Connections vanished so far.
    vanished: Arc<AtomicUsize>,
    /// What each fault mode did so far (a fault's evidence: the counts it moved).
    counts: Arc<Counts>,
}

/// What the proxy's fault modes did, counted as they act: a fault's
/// evidence is the counts that moved while it was on.
#[derive(Debug, Default)]
pub struct Counts {
    /// Chunks delayed ([`Mode::Delay`]).
    pub delayed: AtomicUsize,
    /// Connections reset or refused ([`Mode::Reset`]).
    pub reset: AtomicUsize,
    /// Replies dropped with their connection ([`Mode::LoseReplies`]).
    pub lost: AtomicUsize,
    /// Chunks or new connections held in a black hole ([`Mode::Blackhole`]).
    pub held: AtomicUsize,
}

/// A snapshot of [`Counts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counted {
    pub delayed: usize,
    pub reset: usize,
    pub lost: usize,
    pub held: usize,
}

impl std::ops::Sub for Counted {
    type Output = Counted;
    fn sub(self, before: Counted) -> Counted {
        Counted {
            delayed: self.delayed - before.delayed,
            reset: self.reset - before.reset,
            lost: self.lost - before.lost,
            held: self.held - before.held,
        }
    }
}

impl Proxy {
    /// Listens on 127.0.0.1 (a free port) and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, _) = watch::channel(Mode::Pass);
        let (vanish, _) = watch::channel(0);
        let vanished = Arc::new(AtomicUsize::new(0));
        let counts = Arc::new(Counts::default());
        let rx = Signals {
            mode: mode.subscribe(),
            vanish: vanish.subscribe(),
            vanished: vanished.clone(),
            counts: counts.clone(),
        };
        tokio::spawn(accept_loop(listener, upstream, rx));
        Ok(Self {
            addr,
            mode,
            vanish,
            vanished,
            counts,
        })
    }

    /// What the fault modes did so far.
    pub fn counted(&self) -> Counted {
        let c = &self.counts;
        Counted {
            delayed: c.delayed.load(Ordering::SeqCst),
            reset: c.reset.load(Ordering::SeqCst),
            lost: c.lost.load(Ordering::SeqCst),
            held: c.held.load(Ordering::SeqCst),
        }
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Makes every connection open now vanish (see [`vanish`]), even one
    /// whose task does not run until the mode has changed back; the
    /// half-open mode ([`Mode::HalfOpen`]) covers the connections accepted
    /// while it lasts.
    pub fn vanish_open(&self) {
        self.vanish.send_modify(|n| *n += 1);
    }

    /// How many connections have vanished so far (either way).
    pub fn vanished(&self) -> usize {
        self.vanished.load(Ordering::SeqCst)
    }
}

/// What a connection's task listens to.
#[derive(Clone)]
struct Signals {
    mode: watch::Receiver<Mode>,
    vanish: watch::Receiver<u64>,
    vanished: Arc<AtomicUsize>,
    counts: Arc<Counts>,
}

impl Signals {
    fn vanish(&self, stream: TcpStream) {
        self.vanished.fetch_add(1, Ordering::SeqCst);
        vanish(stream);
    }
    fn count(&self, which: fn(&Counts) -> &AtomicUsize) {
        which(&self.counts).fetch_add(1, Ordering::SeqCst);
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, mut rx: Signals) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        // Accepted now: only a later vanish_open concerns this connection.
        rx.vanish.borrow_and_update();
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

/// Waits until the mode is not a black hole (counting a wait in `held`);
/// `None` if the proxy is gone.
async fn through_blackhole(rx: &mut watch::Receiver<Mode>, counts: &Counts) -> Option<Mode> {
    let mut counted = false;
    loop {
        let mode = *rx.borrow_and_update();
        if mode != Mode::Blackhole {
            return Some(mode);
        }
        if !counted {
            counted = true;
            counts.held.fetch_add(1, Ordering::SeqCst);
        }
        rx.changed().await.ok()?;
    }
}

async fn connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    signals: Signals,
) -> std::io::Result<()> {
    let mut rx = signals.mode.clone();
    let mut vanishing = signals.vanish.clone();
    match through_blackhole(&mut rx, &signals.counts).await {
        Some(Mode::Reset) | None => {
            signals.count(|c| &c.reset);
            reset(&client);
            return Ok(());
        }
        Some(Mode::HalfOpen) => {
            signals.vanish(client);
            return Ok(());
        }
        _ => {}
    }
    if vanishing.has_changed().unwrap_or(false) {
        signals.vanish(client);
        return Ok(());
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
            // First, so that a task run late vanishes before it forwards.
            biased;
            Ok(()) = vanishing.changed() => {
                signals.vanish(client);
                return Ok(());
            }
            read = client.read(&mut up) => {
                let n = read?;
                if n == 0 { return Ok(()); }
                match forward_mode(&mut rx, &signals.counts).await {
                    Some(Mode::Reset) | None => { signals.count(|c| &c.reset); reset(&client); reset(&server); return Ok(()); }
                    Some(Mode::HalfOpen) => { signals.vanish(client); return Ok(()); }
                    Some(Mode::Delay(ms)) => { signals.count(|c| &c.delayed); tokio::time::sleep(Duration::from_millis(ms)).await }
                    _ => {}
                }
                server.write_all(&up[..n]).await?;
            }
            read = server.read(&mut down) => {
                let n = read?;
                if n == 0 { return Ok(()); }
                match forward_mode(&mut rx, &signals.counts).await {
                    Some(Mode::LoseReplies) => {
                        signals.count(|c| &c.lost);
                        reset(&client); reset(&server); return Ok(());
                    }
                    Some(Mode::Reset) | None => {
                        signals.count(|c| &c.reset);
                        reset(&client); reset(&server); return Ok(());
                    }
                    Some(Mode::HalfOpen) => { signals.vanish(client); return Ok(()); }
                    Some(Mode::Delay(ms)) => { signals.count(|c| &c.delayed); tokio::time::sleep(Duration::from_millis(ms)).await }
                    _ => {}
                }
                client.write_all(&down[..n]).await?;
            }
            changed = rx.changed() => {
                if changed.is_err() || *rx.borrow() == Mode::Reset {
                    signals.count(|c| &c.reset);
                    reset(&client); reset(&server); return Ok(());
                }
                if *rx.borrow() == Mode::HalfOpen {
                    signals.vanish(client);
                    return Ok(());
                }
            }
        }
    }
}

/// The mode to forward one chunk under (waits out a black hole).
async fn forward_mode(rx: &mut watch::Receiver<Mode>, counts: &Counts) -> Option<Mode> {
    through_blackhole(rx, counts).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upstream that echoes every byte back.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream) -> std::io::Result<()> {
        s.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut buf))
            .await
            .map_err(|_| std::io::Error::other("no echo within 5 s"))??;
        Ok(())
    }

    /// A connection open at `vanish_open` vanishes even though the mode
    /// never leaves `Pass` (as for a task that runs only after the half-open
    /// mode has ended); one opened after it is forwarded.
    #[tokio::test]
    async fn vanish_open_takes_every_open_connection_whenever_its_task_runs() {
        let proxy = Proxy::start(echo().await).await.unwrap();
        let mut open = TcpStream::connect(proxy.addr).await.unwrap();
        round_trip(&mut open).await.unwrap();
        proxy.vanish_open();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while proxy.vanished() == 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(proxy.vanished(), 1);
        // Silently: the first thing it sends is answered with a reset.
        let err = round_trip(&mut open).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
        let mut later = TcpStream::connect(proxy.addr).await.unwrap();
        round_trip(&mut later).await.unwrap();
        assert_eq!(proxy.vanished(), 1);
    }
}
