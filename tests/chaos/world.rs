//! The world under test: mock driver (one socket per replica), attacher
//! replicas behind fault proxies, a supervisor that restarts exited replicas
//! (as kubelet would), and a tail of the driver's ledger file.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde_json::Value;
use tokio::sync::broadcast;

use crate::cp::ChaosCp;
use crate::proxy::Proxy;
use crate::support::controlplane::free_port;
use crate::support::procs::{self, Guard};

pub const DRIVER: &str = "chaos.csi.example.com";
pub const FINALIZER: &str = "external-attacher/chaos-csi-example-com";
pub const LEASE: &str = "external-attacher-leader-chaos-csi-example-com";

/// Attacher timings (short, so takeovers are quick).
pub const TIMEOUT: Duration = Duration::from_secs(2);
pub const LEASE_DURATION: Duration = Duration::from_secs(3);
pub const RENEW_DEADLINE: Duration = Duration::from_secs(2);

pub fn now_nanos() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or_default()
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How a replica process ended.
#[derive(Debug, Clone)]
pub struct Exit {
    pub replica: usize,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// The signal the suite sent it, if any.
    pub sent: Option<i32>,
    pub at: i128,
}

pub struct ReplicaSlot {
    pub process: Option<Guard>,
    /// Signal the suite sent to the current process (expected exit).
    pub sent: Option<i32>,
    /// Do not restart while set.
    pub hold: bool,
    pub starts: u32,
}

pub struct Replica {
    pub index: usize,
    pub identity: String,
    pub http: std::net::SocketAddr,
    pub log: PathBuf,
    pub proxy: Proxy,
    pub kubeconfig: PathBuf,
    pub slot: Mutex<ReplicaSlot>,
}

pub struct Driver {
    pub sockets: Vec<PathBuf>,
    pub admin_port: u16,
    pub ledger: PathBuf,
    pub state: PathBuf,
    pub log: PathBuf,
    pub process: Mutex<Option<Guard>>,
}

pub struct World {
    pub dir: PathBuf,
    pub cp: tokio::sync::Mutex<ChaosCp>,
    pub driver: Driver,
    pub replicas: Vec<Replica>,
    pub exits: Mutex<Vec<Exit>>,
    /// Every ledger line so far (event lines and call records), in file order.
    pub ledger: Mutex<Vec<Value>>,
    pub ledger_tx: broadcast::Sender<Value>,
}

impl Driver {
    fn spawn(&self) -> Result<Guard> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut command = Command::new(crate::support::mock::binary());
        for socket in &self.sockets {
            command.arg(format!("--endpoint={}", socket.display()));
        }
        command
            .arg(format!("--name={DRIVER}"))
            .arg(format!("--ledger={}", self.ledger.display()))
            .arg("--ledger-events")
            .arg("--finish-abandoned-calls")
            // As real drivers do: a second operation on a volume with one
            // still running (e.g. a Publish finishing after its caller left) is
            // refused with ABORTED, not run concurrently.
            .arg("--serialize-volumes")
            .arg(format!("--state-file={}", self.state.display()))
            .arg(format!("--admin-addr=127.0.0.1:{}", self.admin_port))
            .stdout(Stdio::piped())
            .stderr(log);
        let mut child = procs::spawn(command).context("starting csi-mock-driver")?;
        let stdout = child.stdout.take().context("mock stdout")?;
        let guard = Guard(Some(child));
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        anyhow::ensure!(
            line.contains("admin"),
            "csi-mock-driver did not start: {line:?}"
        );
        Ok(guard)
    }

    /// Stops the driver with `signal` (SIGTERM keeps its state file), optionally
    /// forgetting its state, and starts it again.
    pub fn restart(&self, signal: libc::c_int, empty: bool) -> Result<()> {
        let mut process = lock(&self.process);
        if let Some(mut old) = process.take() {
            old.signal(signal);
            let deadline = Instant::now() + Duration::from_secs(3);
            while old.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            drop(old); // SIGKILL if still running
        }
        if empty {
            let _ = std::fs::remove_file(&self.state);
        }
        // Call ids restart at 0 in a new process: mark the boundary.
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.ledger)?;
        writeln!(file, "{}", serde_json::json!({"event": "incarnation"}))?;
        *process = Some(self.spawn()?);
        Ok(())
    }

    pub async fn admin(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        use http_body_util::{BodyExt, Full};
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], self.admin_port).into();
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", addr.to_string())
            .header("content-type", "application/json")
            .body(Full::new(hyper::body::Bytes::from(
                body.map(|b| b.to_string()).unwrap_or_default(),
            )))?;
        let response = tokio::time::timeout(Duration::from_secs(5), sender.send_request(request))
            .await
            .context("admin timeout")??;
        let bytes = response.into_body().collect().await?.to_bytes();
        Ok(serde_json::from_slice(&bytes)?)
    }
}

impl World {
    pub async fn start(dir: &Path, replicas: usize) -> Result<Arc<Self>> {
        let cp = ChaosCp::start(dir).await?;
        let client = cp.client().await?;
        // The replicas' group may do anything (as cluster-admin), but is not exempt from APF.
        let binding = serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "chaos-attachers"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": crate::cp::REPLICA_GROUP}],
        });
        crate::post(
            &client,
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            &binding,
        )
        .await?;
        let driver = Driver {
            sockets: (0..replicas)
                .map(|i| dir.join(format!("csi-{i}.sock")))
                .collect(),
            admin_port: free_port()?,
            ledger: dir.join("ledger.jsonl"),
            state: dir.join("driver-state.json"),
            log: dir.join("driver.log"),
            process: Mutex::new(None),
        };
        *lock(&driver.process) = Some(driver.spawn()?);
        let upstream = ([127, 0, 0, 1], cp.port).into();
        let mut members = Vec::new();
        for index in 0..replicas {
            let proxy = Proxy::start(upstream).await?;
            let identity = format!("replica-{index}");
            let kubeconfig = cp.write_kubeconfig(
                &identity,
                &format!("chaos-{identity}"),
                &[crate::cp::REPLICA_GROUP],
                proxy.addr.port(),
            )?;
            members.push(Replica {
                index,
                identity,
                http: ([127, 0, 0, 1], free_port()?).into(),
                log: dir.join(format!("replica-{index}.log")),
                proxy,
                kubeconfig,
                slot: Mutex::new(ReplicaSlot {
                    process: None,
                    sent: None,
                    hold: false,
                    starts: 0,
                }),
            });
        }
        let (ledger_tx, _) = broadcast::channel(4096);
        let world = Arc::new(Self {
            dir: dir.to_path_buf(),
            cp: tokio::sync::Mutex::new(cp),
            driver,
            replicas: members,
            exits: Mutex::new(Vec::new()),
            ledger: Mutex::new(Vec::new()),
            ledger_tx,
        });
        for replica in &world.replicas {
            world.spawn_replica(replica)?;
        }
        tokio::spawn(supervise(Arc::clone(&world)));
        tokio::spawn(tail_ledger(Arc::clone(&world)));
        Ok(world)
    }

    pub fn spawn_replica(&self, replica: &Replica) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&replica.log)?;
        let mut command = Command::new(env!("CARGO_BIN_EXE_csi-attacher"));
        let verbosity = if replica.index == 0 { "--v=5" } else { "--v=2" };
        command
            .arg(format!(
                "--csi-address={}",
                self.driver.sockets[replica.index].display()
            ))
            .arg(format!("--kubeconfig={}", replica.kubeconfig.display()))
            .arg("--leader-election")
            .arg("--leader-election-namespace=default")
            .arg(format!(
                "--leader-election-lease-duration={}s",
                LEASE_DURATION.as_secs()
            ))
            .arg(format!(
                "--leader-election-renew-deadline={}s",
                RENEW_DEADLINE.as_secs()
            ))
            .arg("--leader-election-retry-period=500ms")
            .arg(format!("--leader-election-identity={}", replica.identity))
            .arg(format!("--http-endpoint={}", replica.http))
            .arg(format!("--timeout={}s", TIMEOUT.as_secs()))
            .arg("--reconcile-sync=5s")
            // Orphans (the finalizer-stripped faults) are unpublished when
            // their Node does not list them in status.volumesInUse.
            .arg("--unpublish-orphans")
            .arg("--worker-threads=8")
            // The default 5 QPS would make the post-fault backlog, not the attacher, decide I5.
            .arg("--kube-api-qps=50")
            .arg("--kube-api-burst=100")
            .arg(format!(
                "--termination-log-path={}",
                self.dir
                    .join(format!("replica-{}.termination", replica.index))
                    .display()
            ))
            .arg(verbosity)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(log);
        let child = procs::spawn(command).context("starting csi-attacher")?;
        let mut slot = lock(&replica.slot);
        slot.process = Some(Guard(Some(child)));
        slot.sent = None;
        slot.starts += 1;
        Ok(())
    }

    /// Sends `signal` to replica `index`, remembering it was us.
    pub fn signal_replica(&self, index: usize, signal: libc::c_int) {
        let mut slot = lock(&self.replicas[index].slot);
        if let Some(process) = &slot.process {
            process.signal(signal);
            if signal != libc::SIGSTOP && signal != libc::SIGCONT {
                slot.sent = Some(signal);
            }
        }
    }

    /// The replica holding the Lease now (by identity), if any.
    pub async fn leader(&self, client: &kube::Client) -> Option<usize> {
        let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
            kube::Api::namespaced(client.clone(), "default");
        let lease = tokio::time::timeout(Duration::from_secs(3), leases.get_opt(LEASE))
            .await
            .ok()?
            .ok()??;
        let holder = lease.spec?.holder_identity?;
        self.replicas.iter().position(|r| r.identity == holder)
    }

    /// Waits for the next ledger line matching `pred` (lines already read do not count).
    pub async fn next_ledger(
        &self,
        rx: &mut broadcast::Receiver<Value>,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Ok(line)) if pred(&line) => return Some(line),
                Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
                _ => return None,
            }
        }
    }

    pub async fn metrics(&self, index: usize) -> Option<String> {
        let (status, body) = tokio::time::timeout(
            Duration::from_secs(3),
            crate::support::http_get(self.replicas[index].http, "/metrics"),
        )
        .await
        .ok()??;
        (status == 200).then_some(body)
    }
}

/// Restarts replicas that exited (after 300 ms, as a kubelet would, minus backoff).
async fn supervise(world: Arc<World>) {
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        for replica in &world.replicas {
            let exited = {
                let mut slot = lock(&replica.slot);
                let status = match slot.process.as_mut() {
                    Some(p) => p.try_wait().ok().flatten(),
                    None => None,
                };
                if let Some(status) = status {
                    use std::os::unix::process::ExitStatusExt;
                    lock(&world.exits).push(Exit {
                        replica: replica.index,
                        code: status.code(),
                        signal: status.signal(),
                        sent: slot.sent,
                        at: crate::world::now_nanos(),
                    });
                    slot.process = None;
                }
                slot.process.is_none() && !slot.hold
            };
            if exited {
                tokio::time::sleep(Duration::from_millis(300)).await;
                if let Err(err) = world.spawn_replica(replica) {
                    eprintln!("chaos: cannot restart replica {}: {err:#}", replica.index);
                }
            }
        }
    }
}

/// Follows the ledger file, keeping every line and broadcasting it.
async fn tail_ledger(world: Arc<World>) {
    let mut offset = 0usize;
    let mut partial = String::new();
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let Ok(bytes) = std::fs::read(&world.driver.ledger) else {
            continue;
        };
        if bytes.len() <= offset {
            continue;
        }
        partial.push_str(&String::from_utf8_lossy(&bytes[offset..]));
        offset = bytes.len();
        while let Some(end) = partial.find('\n') {
            let line: String = partial.drain(..=end).collect();
            if let Ok(value) = serde_json::from_str::<Value>(line.trim()) {
                lock(&world.ledger).push(value.clone());
                let _ = world.ledger_tx.send(value);
            }
        }
    }
}

/// A driver call reconstructed from the ledger.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: String,
    pub caller: usize,
    pub volume: String,
    pub node: String,
    pub code: String,
    pub start: i128,
    pub end: i128,
    /// When the caller went away before the answer.
    pub abandoned: Option<i128>,
    /// Which driver process answered (0, then one more per restart).
    pub incarnation: u32,
}

impl Call {
    /// The end of the call as its caller saw it.
    pub fn caller_end(&self) -> i128 {
        self.abandoned.map_or(self.end, |a| a.min(self.end))
    }
}

/// Controller calls of the ledger (Publish, Unpublish, ListVolumes), with their abandonment.
pub fn calls(lines: &[Value]) -> Vec<Call> {
    let mut incarnation = 0u32;
    let mut abandoned = BTreeMap::new();
    let mut starts = BTreeMap::new();
    let mut out = Vec::new();
    for line in lines {
        match line["event"].as_str() {
            Some("incarnation") => incarnation += 1,
            Some("start") => {
                starts.insert(
                    (incarnation, line["call_id"].as_u64().unwrap_or(u64::MAX)),
                    line.clone(),
                );
            }
            Some("abandoned") => {
                abandoned.insert(
                    (incarnation, line["call_id"].as_u64().unwrap_or(u64::MAX)),
                    line["time_unix_nanos"].as_i64().unwrap_or_default() as i128,
                );
            }
            Some(_) => {}
            None => {
                let method = line["method"].as_str().unwrap_or_default();
                if !matches!(
                    method,
                    "ControllerPublishVolume" | "ControllerUnpublishVolume" | "ListVolumes"
                ) {
                    continue;
                }
                let start = line["time_unix_nanos"].as_i64().unwrap_or_default() as i128;
                let end = start + (line["duration_ms"].as_f64().unwrap_or_default() * 1e6) as i128;
                out.push((
                    incarnation,
                    line["call_id"].as_u64().unwrap_or(u64::MAX),
                    Call {
                        method: method.to_string(),
                        caller: line["caller"].as_u64().unwrap_or(99) as usize,
                        volume: line["volume_id"].as_str().unwrap_or_default().to_string(),
                        node: line["node_id"].as_str().unwrap_or_default().to_string(),
                        code: line["code"].as_str().unwrap_or_default().to_string(),
                        start,
                        end,
                        abandoned: None,
                        incarnation,
                    },
                ));
            }
        }
    }
    let recorded: std::collections::BTreeSet<(u32, u64)> =
        out.iter().map(|(inc, id, _)| (*inc, *id)).collect();
    // A call whose caller went away and that left no record (the driver
    // dropped it, e.g. during an injected delay): it occupied the caller
    // from its start to its abandonment, with an unknown outcome.
    let unrecorded: Vec<Call> = abandoned
        .iter()
        .filter(|(key, _)| !recorded.contains(*key))
        .filter_map(|((inc, id), at)| {
            let start = starts.get(&(*inc, *id))?;
            let method = start["method"].as_str().unwrap_or_default();
            if !matches!(
                method,
                "ControllerPublishVolume" | "ControllerUnpublishVolume" | "ListVolumes"
            ) {
                return None;
            }
            let begun = start["time_unix_nanos"].as_i64().unwrap_or_default() as i128;
            Some(Call {
                method: method.to_string(),
                caller: start["caller"].as_u64().unwrap_or(99) as usize,
                volume: String::new(),
                node: String::new(),
                code: UNRECORDED.into(),
                start: begun,
                end: *at,
                abandoned: Some(*at),
                incarnation: *inc,
            })
        })
        .collect();
    out.into_iter()
        .map(|(inc, id, mut call)| {
            // Ids restart with each driver incarnation; an abandonment
            // before the call began is another call's.
            call.abandoned = abandoned
                .get(&(inc, id))
                .copied()
                .filter(|at| *at >= call.start);
            call
        })
        .chain(unrecorded)
        .collect()
}

/// The code of an abandoned call the ledger has no record of (outcome unknown).
pub const UNRECORDED: &str = "UNRECORDED";
