//! The HTTP endpoint under abuse, with the attacher as a real process: an
//! idle-connection flood, a slowloris client, and a flood under a low
//! file-descriptor limit must not stop `/healthz`, spin the CPU or cost the Lease.

use crate::support;

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::env::{tail, Env};
use support::procs::{self, Guard};

/// The attacher with `--http-endpoint` on a free port, started with
/// RLIMIT_NOFILE = `nofile`; returns it, its log and the endpoint.
fn attacher(env: &Env, nofile: u64, extra: &[&str]) -> (Guard, PathBuf, SocketAddr) {
    let port = support::controlplane::free_port().expect("port");
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let log = env.cp.dir.join(format!("{}.log", support::unique("http")));
    let mut command = Command::new(env!("CARGO_BIN_EXE_csi-attacher"));
    command
        .arg(format!("--csi-address={}", env.mock.address()))
        .arg(format!("--kubeconfig={}", env.cp.kubeconfig.display()))
        .arg(format!("--http-endpoint={addr}"))
        .arg("--termination-log-path=/dev/null")
        .arg("--v=2")
        .args(extra)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"));
    let limit = libc::rlimit {
        rlim_cur: nofile,
        rlim_max: nofile,
    };
    // SAFETY: setrlimit(2) only, between fork and exec.
    unsafe {
        command.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let process = Guard(Some(procs::spawn(command).expect("start csi-attacher")));
    (process, log, addr)
}

/// `/healthz` answered 200 within `within`, on a fresh connection.
async fn healthz_within(addr: SocketAddr, within: Duration) -> bool {
    matches!(
        tokio::time::timeout(within, support::http_get(addr, "/healthz")).await,
        Ok(Some((200, _)))
    )
}

async fn wait_healthz(addr: SocketAddr, log: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !healthz_within(addr, Duration::from_secs(1)).await {
        assert!(
            Instant::now() < deadline,
            "no /healthz: {}",
            tail(&std::fs::read_to_string(log).unwrap_or_default(), 20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Opens `n` TCP connections that never send a byte.
async fn idle_flood(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        if let Ok(Ok(stream)) =
            tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr)).await
        {
            held.push(stream);
        }
    }
    held
}

/// CPU seconds (user + system) the process `pid` has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the command name (which may hold spaces) start at field 3.
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 =
        fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / per_second
}

/// Raises this test process' own descriptor limit, for the floods.
fn raise_own_nofile() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on this process with a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// More idle connections than the attacher has descriptors (and 4x its
/// connection cap of 64): `/healthz` still answers at once, and the attacher
/// does not spin.
#[tokio::test]
async fn an_idle_connection_flood_does_not_stop_healthz() {
    raise_own_nofile();
    let env = Env::without_attacher(&[]).await;
    let (process, log, addr) = attacher(&env, 256, &[]);
    wait_healthz(addr, &log).await;

    let cpu_before = cpu_seconds(process.id());
    let started = Instant::now();
    let held = idle_flood(addr, 300).await;
    assert!(
        held.len() > 256,
        "the flood reached {} connections",
        held.len()
    );
    for _ in 0..5 {
        assert!(
            healthz_within(addr, Duration::from_secs(2)).await,
            "/healthz during the flood: {}",
            tail(&std::fs::read_to_string(&log).unwrap_or_default(), 20)
        );
    }
    let cpu = cpu_seconds(process.id()) - cpu_before;
    let wall = started.elapsed().as_secs_f64();
    eprintln!("idle flood: {cpu:.2} s CPU in {wall:.2} s");
    assert!(
        cpu < 0.5 * wall + 0.5,
        "{cpu:.2} s of CPU in {wall:.2} s under the flood"
    );
    drop(held);
}

/// A client that sends its headers a byte at a time is closed after the
/// header-read timeout (5 s); `/healthz` answers meanwhile.
#[tokio::test]
async fn a_slowloris_client_is_closed_and_healthz_answers_meanwhile() {
    let env = Env::without_attacher(&[]).await;
    let (_process, log, addr) = attacher(&env, 1024, &[]);
    wait_healthz(addr, &log).await;

    let mut slow = TcpStream::connect(addr).await.expect("connect");
    slow.write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .expect("write");
    let started = Instant::now();
    let mut closed = false;
    while started.elapsed() < Duration::from_secs(15) {
        assert!(healthz_within(addr, Duration::from_secs(2)).await);
        // One more header byte; a closed connection fails the write or reads EOF.
        if slow.write_all(b"X").await.is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 1024];
        match tokio::time::timeout(Duration::from_millis(500), slow.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            // A 408 or similar answer: the server gave up on the headers.
            Ok(Ok(_)) => {
                closed = true;
                break;
            }
            Err(_) => {}
        }
    }
    let took = started.elapsed();
    eprintln!("slowloris connection closed after {took:?}");
    assert!(
        closed,
        "the slowloris connection was still open after {took:?}"
    );
    assert!(took < Duration::from_secs(9), "closed after {took:?}");
}

async fn renew_time(leases: &Api<Lease>, name: &str) -> Option<(String, String)> {
    let lease = leases.get_opt(name).await.ok().flatten()?;
    let spec = lease.spec?;
    Some((spec.holder_identity?, format!("{:?}", spec.renew_time?)))
}

/// Open descriptors of `pid`.
fn open_fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count() as u64)
        .unwrap_or(0)
}

/// With its descriptor limit just above what it uses, a flood makes every
/// accept fail with EMFILE: the attacher backs off instead of spinning, keeps
/// renewing its Lease, and `/healthz` still answers.
#[tokio::test]
async fn a_flood_at_the_descriptor_limit_neither_spins_nor_costs_the_lease() {
    raise_own_nofile();
    let env = Env::without_attacher(&[]).await;
    let identity = support::unique("leader");
    let (process, log, addr) = attacher(
        &env,
        1024,
        &[
            "--leader-election",
            "--leader-election-namespace=default",
            &format!("--leader-election-identity={identity}"),
        ],
    );
    wait_healthz(addr, &log).await;
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), "default");
    let lease_name = format!("external-attacher-leader-{}", env.driver.replace('.', "-"));
    let before = support::eventually("leadership", Duration::from_secs(30), || async {
        renew_time(&leases, &lease_name)
            .await
            .filter(|(holder, _)| *holder == identity)
    })
    .await;

    // A few descriptors to spare, fewer than the HTTP connection cap.
    let pid = process.id();
    let soft = open_fds(pid) + 3;
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: 1024,
    };
    // SAFETY: prlimit(2) on our own child with a valid struct.
    let set = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_NOFILE,
            &limit,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(set, 0, "prlimit: {}", std::io::Error::last_os_error());

    let cpu_before = cpu_seconds(pid);
    let started = Instant::now();
    let held = idle_flood(addr, 200).await;
    assert!(
        held.len() > 100,
        "the flood reached {} connections",
        held.len()
    );
    // Hold the flood for more than one renew period (retry period 5 s).
    let renewed = support::eventually(
        "a Lease renewal during the flood",
        Duration::from_secs(20),
        || async {
            renew_time(&leases, &lease_name)
                .await
                .filter(|now| *now != before)
        },
    )
    .await;
    assert_eq!(renewed.0, identity, "still the holder");
    while started.elapsed() < Duration::from_secs(6) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cpu = cpu_seconds(pid) - cpu_before;
    let wall = started.elapsed().as_secs_f64();
    eprintln!("flood at the descriptor limit: {cpu:.2} s CPU in {wall:.2} s");
    let logs = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        cpu < 0.25 * wall,
        "{cpu:.2} s of CPU in {wall:.2} s at the descriptor limit: {}",
        tail(&logs, 10)
    );
    assert!(
        logs.contains("HTTP accept failed"),
        "the flood reached the limit: {}",
        tail(&logs, 10)
    );
    drop(held);
    assert!(
        healthz_within(addr, Duration::from_secs(3)).await,
        "/healthz after the flood"
    );
}
