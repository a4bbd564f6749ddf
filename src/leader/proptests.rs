//! Property: whatever the API latency, failures, lost answers, hung requests
//! and frozen replicas, no two replicas are ever inside their leadership
//! windows at the same instant, i.e. never two replicas that both may start a
//! driver call (judged by [`Window::is_open`], the check [`Leadership::call`]
//! makes).
//!
//! The replicas run real [`Elector`]s on one tokio runtime with paused time
//! (one clock, no skew) against a simulated API server whose requests are
//! delivered after a delay even when the caller gave up on them, as over a
//! network. A frozen replica is one whose task is not polled for a while (a
//! SIGSTOP); its outstanding requests still reach the server.
//!
//! `cargo test` runs a bounded number of cases; `PROPTEST_CASES=2000 cargo
//! test --lib leader::proptests` runs more.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::core::Status;
use proptest::prelude::*;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Elector, LeaseApi, Settings, Window};

/// Cases per `cargo test` run unless `PROPTEST_CASES` says otherwise.
const DEFAULT_CASES: u32 = 48;
/// Simulated time per case.
const RUN_FOR: Duration = Duration::from_secs(120);

/// What happens to one API request.
#[derive(Debug, Clone, Copy)]
enum Fate {
    /// Reaches the server after `request`, answer arrives `response` later.
    Delivered,
    /// Never reaches the server (connection refused, timeout before sending).
    Refused,
    /// Reaches the server, but the answer is lost: the caller sees an error.
    AnswerLost,
    /// Stuck in the network for a long time, then applied; the caller hears nothing.
    Hung,
}

#[derive(Debug, Clone, Copy)]
struct Call {
    request: Duration,
    response: Duration,
    fate: Fate,
}

/// One Lease on the "server", with resourceVersion conflicts.
#[derive(Default)]
struct Server {
    lease: Option<Lease>,
    version: u64,
}

enum Op {
    Get,
    Create(Lease),
    Replace(Lease),
}

fn api_error(code: u16, reason: &str) -> kube::Error {
    let mut status = Status::failure(reason, reason);
    status.code = code;
    kube::Error::Api(status.boxed())
}

impl Server {
    fn apply(&mut self, op: Op) -> Result<Option<Lease>, kube::Error> {
        match op {
            Op::Get => Ok(self.lease.clone()),
            Op::Create(lease) => {
                if self.lease.is_some() {
                    return Err(api_error(409, "AlreadyExists"));
                }
                Ok(Some(self.write(lease)))
            }
            Op::Replace(lease) => {
                let current = self
                    .lease
                    .as_ref()
                    .and_then(|l| l.metadata.resource_version.clone());
                if current.is_none() || current != lease.metadata.resource_version {
                    return Err(api_error(409, "Conflict"));
                }
                Ok(Some(self.write(lease)))
            }
        }
    }

    fn write(&mut self, mut lease: Lease) -> Lease {
        self.version += 1;
        lease.metadata.resource_version = Some(self.version.to_string());
        self.lease = Some(lease.clone());
        lease
    }
}

/// A replica's view of the simulated API server.
#[derive(Clone)]
struct SimApi {
    server: Arc<Mutex<Server>>,
    plan: Arc<Vec<Call>>,
    next: Arc<AtomicUsize>,
    hang: Duration,
}

impl SimApi {
    async fn send(&self, op: Op) -> Result<Option<Lease>, kube::Error> {
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let call = self.plan[n % self.plan.len()];
        let (answer_tx, answer_rx) = oneshot::channel();
        let server = Arc::clone(&self.server);
        let travel = match call.fate {
            Fate::Hung => call.request + self.hang,
            _ => call.request,
        };
        let fate = call.fate;
        // The request travels on its own: a caller that gives up does not stop it.
        tokio::spawn(async move {
            tokio::time::sleep(travel).await;
            let answer = match fate {
                Fate::Refused => Err(api_error(503, "ServiceUnavailable")),
                _ => server
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .apply(op),
            };
            let _ = answer_tx.send(answer);
        });
        let answer = answer_rx
            .await
            .unwrap_or_else(|_| Err(api_error(500, "lost")));
        tokio::time::sleep(call.response).await;
        match fate {
            Fate::AnswerLost => Err(api_error(504, "GatewayTimeout")),
            _ => answer,
        }
    }
}

impl LeaseApi for SimApi {
    async fn get(&self) -> Result<Option<Lease>, kube::Error> {
        self.send(Op::Get).await
    }

    async fn create(&self, lease: &Lease) -> Result<Lease, kube::Error> {
        self.send(Op::Create(lease.clone()))
            .await?
            .ok_or_else(|| api_error(500, "empty"))
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, kube::Error> {
        self.send(Op::Replace(lease.clone()))
            .await?
            .ok_or_else(|| api_error(500, "empty"))
    }
}

#[derive(Debug, Clone)]
struct Timing {
    lease: Duration,
    renew: Duration,
    retry: Duration,
}

#[derive(Debug, Clone)]
struct Case {
    timing: Timing,
    plan: Vec<Call>,
    /// Per replica: (start, length) of each freeze, in start order.
    freezes: Vec<Vec<(Duration, Duration)>>,
    /// Per replica: when it starts (a fresh elector that has seen nothing).
    starts: Vec<Duration>,
    /// When the Lease is deleted (as an admin or a namespace clean-up would).
    deletions: Vec<Duration>,
    /// Whether the Lease exists (released, no holder) before anyone starts.
    released_lease: bool,
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Valid client-go timings, to the millisecond (sub-second ones included).
fn timing() -> impl Strategy<Value = Timing> {
    // Small margins often: a Lease rounded the wrong way would show there.
    let margin = prop_oneof![1u64..1_000, 1u64..5_000];
    (100u64..3_000, 1u64..5_000, margin).prop_map(|(retry, extra, margin)| {
        let renew = retry * 6 / 5 + extra;
        Timing {
            lease: ms(renew + margin),
            renew: ms(renew),
            retry: ms(retry),
        }
    })
}

fn call() -> impl Strategy<Value = Call> {
    let fate = prop_oneof![
        14 => Just(Fate::Delivered),
        2 => Just(Fate::Refused),
        2 => Just(Fate::AnswerLost),
        2 => Just(Fate::Hung),
    ];
    // Mostly a fast network, sometimes a slow one.
    let latency = || prop_oneof![3 => 0u64..50, 1 => 0u64..2_500];
    (latency(), latency(), fate).prop_map(|(request, response, fate)| Call {
        request: ms(request),
        response: ms(response),
        fate,
    })
}

fn freezes() -> impl Strategy<Value = Vec<(Duration, Duration)>> {
    prop::collection::vec((0u64..100_000, 0u64..40_000), 0..5).prop_map(|mut v| {
        v.sort_unstable();
        v.into_iter().map(|(at, len)| (ms(at), ms(len))).collect()
    })
}

fn case() -> impl Strategy<Value = Case> {
    (
        timing(),
        prop::collection::vec(call(), 1..48),
        prop::collection::vec(freezes(), 2..=3),
        prop::collection::vec(prop_oneof![2 => Just(0u64), 1 => 0u64..60_000], 3),
        prop::collection::vec(0u64..100_000, 0..4),
        any::<bool>(),
    )
        .prop_map(
            |(timing, plan, freezes, starts, deletions, released_lease)| Case {
                timing,
                plan,
                starts: starts[..freezes.len()].iter().map(|t| ms(*t)).collect(),
                freezes,
                deletions: deletions.into_iter().map(ms).collect(),
                released_lease,
            },
        )
}

/// Runs `work`, not polling it during each freeze (measured from `t0`).
async fn with_freezes(
    work: impl std::future::Future<Output = ()>,
    t0: Instant,
    freezes: Vec<(Duration, Duration)>,
) {
    tokio::pin!(work);
    for (at, length) in freezes {
        tokio::select! {
            () = &mut work => return,
            () = tokio::time::sleep_until(t0 + at) => {}
        }
        tokio::time::sleep(length).await;
    }
    work.await;
}

/// A Lease as a leader's release leaves it: no holder.
fn released(name: &str) -> Lease {
    Lease {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: Some(String::new()),
            ..Default::default()
        }),
    }
}

/// Intervals [from, to) (since the start) during which each replica's window was open.
fn simulate(case: &Case) -> Vec<Vec<(Duration, Duration)>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime for the simulation");
    runtime.block_on(async {
        let mut initial = Server::default();
        if case.released_lease {
            initial.write(released("lease"));
        }
        let server = Arc::new(Mutex::new(initial));
        let plan = Arc::new(case.plan.clone());
        let next = Arc::new(AtomicUsize::new(0));
        let t0 = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        let mut histories = Vec::new();
        for (i, freezes) in case.freezes.iter().enumerate() {
            let api = SimApi {
                server: Arc::clone(&server),
                plan: Arc::clone(&plan),
                next: Arc::clone(&next),
                hang: case.timing.lease * 3,
            };
            let settings = Settings {
                namespace: "default".into(),
                name: "lease".into(),
                identity: format!("replica-{i}"),
                lease_duration: case.timing.lease,
                renew_deadline: case.timing.renew,
                retry_period: case.timing.retry,
                labels: Default::default(),
            };
            let mut elector = Elector::new(api, settings, None);
            // Every change of the window, at the instant it is made.
            let history = Arc::new(Mutex::new(vec![(t0, Window::Closed)]));
            histories.push(Arc::clone(&history));
            let mut window = elector.window.subscribe();
            tasks.spawn(async move {
                while window.changed().await.is_ok() {
                    let now = Instant::now();
                    let value = *window.borrow_and_update();
                    history
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((now, value));
                }
            });
            let start = case.starts.get(i).copied().unwrap_or_default();
            let work = async move {
                tokio::time::sleep(start).await;
                loop {
                    elector.acquire(futures::stream::pending()).await;
                    elector.renew_until_lost().await;
                }
            };
            tasks.spawn(with_freezes(work, t0, freezes.clone()));
        }
        for at in case.deletions.iter().copied() {
            let server = Arc::clone(&server);
            tasks.spawn(async move {
                tokio::time::sleep_until(t0 + at).await;
                server.lock().unwrap_or_else(PoisonError::into_inner).lease = None;
            });
        }
        tokio::time::sleep(RUN_FOR).await;
        let end = Instant::now();
        tasks.shutdown().await;
        histories
            .iter()
            .map(|h| {
                let h = h.lock().unwrap_or_else(PoisonError::into_inner);
                let mut open = Vec::new();
                for (i, (from, window)) in h.iter().enumerate() {
                    let next_change = h.get(i + 1).map_or(end, |(t, _)| *t);
                    if let Window::Until(until) = window {
                        let to = (*until).min(next_change);
                        if *from < to {
                            open.push((*from - t0, to - t0));
                        }
                    }
                }
                open
            })
            .collect()
    })
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn never_two_replicas_inside_their_windows_at_once(case in case()) {
        let open = simulate(&case);
        for (a, a_open) in open.iter().enumerate() {
            for (b, b_open) in open.iter().enumerate().skip(a + 1) {
                for (a_from, a_to) in a_open {
                    for (b_from, b_to) in b_open {
                        prop_assert!(
                            !(a_from < b_to && b_from < a_to),
                            "replica-{a} open {a_from:?}..{a_to:?} and replica-{b} open {b_from:?}..{b_to:?} overlap",
                        );
                    }
                }
            }
        }
    }
}

/// The simulation is not vacuous: without faults someone leads nearly all the time.
#[test]
fn without_faults_one_replica_leads_throughout() {
    let case = Case {
        timing: Timing {
            lease: ms(15_000),
            renew: ms(10_000),
            retry: ms(2_000),
        },
        plan: vec![Call {
            request: ms(5),
            response: ms(5),
            fate: Fate::Delivered,
        }],
        freezes: vec![Vec::new(), Vec::new()],
        starts: vec![Duration::ZERO; 2],
        deletions: Vec::new(),
        released_lease: true,
    };
    let open = simulate(&case);
    let led: Duration = open.iter().flatten().map(|(from, to)| *to - *from).sum();
    assert!(led > RUN_FOR - ms(100), "led for {led:?} of {RUN_FOR:?}");
}

/// A frozen leader loses the lease to the other replica, and they never overlap.
#[test]
fn a_frozen_leader_is_replaced_without_overlap() {
    let case = Case {
        timing: Timing {
            lease: ms(15_000),
            renew: ms(10_000),
            retry: ms(2_000),
        },
        plan: vec![Call {
            request: ms(5),
            response: ms(5),
            fate: Fate::Delivered,
        }],
        freezes: vec![vec![(ms(20_000), ms(30_000))], Vec::new()],
        starts: vec![Duration::ZERO; 2],
        deletions: Vec::new(),
        released_lease: true,
    };
    let open = simulate(&case);
    assert!(!open[0].is_empty() && !open[1].is_empty(), "{open:?}");
    let second_start = open[1][0].0;
    let first_end = open[0]
        .iter()
        .filter(|(from, _)| *from < second_start)
        .map(|(_, to)| *to)
        .max()
        .expect("replica-0 led first");
    // Frozen at 20 s, after a renewal at most one retry period (+ jitter) earlier.
    assert!(first_end <= ms(30_000), "{first_end:?}");
    assert!(
        second_start >= first_end + ms(5_000) - ms(100),
        "margin {:?}",
        second_start - first_end
    );
}
