//! Property test: the ListVolumes pager (`reconcile::list_published`) against
//! a fuzzed in-process driver on a Unix socket: random volumes and nodes,
//! page sizes, entries without volume or status, a stale-token ABORTED (once
//! or twice), another error code, a repeated token. The pager must return
//! exactly the union of one complete listing, or the error the reconciler
//! documents. 128 cases by default (`PROPTEST_CASES` for more).
//!
//! A driver that hands out a new token forever is `endless_fresh_tokens_end_the_pass`,
//! ignored: the pager has no bound on pages and that pass never ends.

use crate::support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use csi_attacher::controller::reconcile::{list_published, list_published_within, ReconcileError};
use csi_attacher::csi::proto::controller_server::{Controller, ControllerServer};
use csi_attacher::csi::proto::{self, list_volumes_response};
use csi_attacher::csi::Client;
use proptest::prelude::*;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Code, Request, Response, Status};

/// What the fuzzed driver does, one pass.
#[derive(Debug, Clone)]
struct Script {
    /// The listing: volume → node IDs, in page order.
    volumes: Vec<(String, Vec<String>)>,
    page_size: usize,
    /// Per page, whether it also carries an entry without volume or status.
    junk: Vec<bool>,
    /// A page that answers ABORTED the first `n` times it is asked for.
    abort: Option<(usize, usize)>,
    /// A page that answers with another error.
    error: Option<(usize, i32)>,
    /// A page whose next token is the token of page 1 again.
    repeat: Option<usize>,
    /// Endless: every page is empty with a fresh token.
    endless: bool,
}

impl Script {
    fn pages(&self) -> usize {
        self.volumes.len().div_ceil(self.page_size).max(1)
    }
}

#[derive(Default)]
struct DriverState {
    script: Option<Script>,
    aborts_left: usize,
    calls: usize,
}

#[derive(Clone, Default)]
struct Driver(Arc<Mutex<DriverState>>);

fn token(page: usize) -> String {
    if page == 0 {
        String::new()
    } else {
        format!("t{page}")
    }
}

#[tonic::async_trait]
impl Controller for Driver {
    async fn controller_publish_volume(
        &self,
        _: Request<proto::ControllerPublishVolumeRequest>,
    ) -> Result<Response<proto::ControllerPublishVolumeResponse>, Status> {
        Err(Status::unimplemented("no"))
    }

    async fn controller_unpublish_volume(
        &self,
        _: Request<proto::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<proto::ControllerUnpublishVolumeResponse>, Status> {
        Err(Status::unimplemented("no"))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<proto::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<proto::ControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(Default::default()))
    }

    async fn list_volumes(
        &self,
        request: Request<proto::ListVolumesRequest>,
    ) -> Result<Response<proto::ListVolumesResponse>, Status> {
        let req = request.into_inner();
        let mut state = self.0.lock().unwrap_or_else(|e| e.into_inner());
        state.calls += 1;
        let script = state.script.clone().expect("script");
        let page = if req.starting_token.is_empty() {
            0
        } else {
            req.starting_token[1..]
                .parse::<usize>()
                .map_err(|_| Status::aborted("bad token"))?
        };
        if script.endless {
            return Ok(Response::new(proto::ListVolumesResponse {
                entries: Vec::new(),
                next_token: token(page + 1),
            }));
        }
        if script.abort.is_some_and(|(p, _)| p == page) && state.aborts_left > 0 {
            state.aborts_left -= 1;
            return Err(Status::aborted("stale token"));
        }
        if let Some((p, code)) = script.error {
            if p == page {
                return Err(Status::new(Code::from(code), "driver failed"));
            }
        }
        let start = page * script.page_size;
        let mut entries: Vec<_> = script
            .volumes
            .iter()
            .skip(start)
            .take(script.page_size)
            .map(|(volume, nodes)| list_volumes_response::Entry {
                volume: Some(proto::Volume {
                    volume_id: volume.clone(),
                    ..Default::default()
                }),
                status: Some(list_volumes_response::VolumeStatus {
                    published_node_ids: nodes.clone(),
                    volume_condition: None,
                }),
            })
            .collect();
        if script.junk.get(page).copied().unwrap_or(false) {
            entries.push(list_volumes_response::Entry {
                volume: Some(proto::Volume {
                    volume_id: "junk-without-status".into(),
                    ..Default::default()
                }),
                status: None,
            });
            entries.push(list_volumes_response::Entry {
                volume: None,
                status: Some(Default::default()),
            });
        }
        let next_token = if script.repeat == Some(page) {
            token(1)
        } else if page + 1 < script.pages() {
            token(page + 1)
        } else {
            String::new()
        };
        Ok(Response::new(proto::ListVolumesResponse {
            entries,
            next_token,
        }))
    }
}

/// What the pager must answer for `script` (as its doc says).
#[derive(Debug, PartialEq)]
enum Want {
    Published(HashMap<String, HashSet<String>>),
    ListError(Code),
    RepeatedToken(String),
}

fn model(script: &Script) -> Want {
    let mut aborts_left = script.abort.map_or(0, |(_, n)| n);
    let mut restarted = false;
    let mut published: HashMap<String, HashSet<String>> = HashMap::new();
    let mut seen = HashSet::new();
    let mut page = 0;
    loop {
        if script.abort.is_some_and(|(p, _)| p == page) && aborts_left > 0 {
            aborts_left -= 1;
            if restarted {
                return Want::ListError(Code::Aborted);
            }
            restarted = true;
            published.clear();
            seen.clear();
            page = 0;
            continue;
        }
        if let Some((p, code)) = script.error {
            if p == page {
                return Want::ListError(Code::from(code));
            }
        }
        for (volume, nodes) in script
            .volumes
            .iter()
            .skip(page * script.page_size)
            .take(script.page_size)
        {
            published
                .entry(volume.clone())
                .or_default()
                .extend(nodes.iter().cloned());
        }
        let next = if script.repeat == Some(page) {
            token(1)
        } else if page + 1 < script.pages() {
            token(page + 1)
        } else {
            return Want::Published(published);
        };
        if !seen.insert(next.clone()) {
            return Want::RepeatedToken(next);
        }
        page = next[1..].parse().expect("token");
    }
}

fn script() -> impl Strategy<Value = Script> {
    (
        prop::collection::vec(
            ("v[0-9]{1,2}", prop::collection::vec("n[0-3]", 0..3)),
            0..12,
        ),
        1usize..5,
        prop::collection::vec(any::<bool>(), 12),
        prop::option::of((0usize..4, 1usize..3)),
        prop::option::weighted(
            0.15,
            (0usize..4, prop::sample::select(vec![2, 4, 5, 13, 14])),
        ),
        prop::option::weighted(0.15, 1usize..4),
    )
        .prop_map(|(volumes, page_size, junk, abort, error, repeat)| Script {
            volumes,
            page_size,
            junk,
            abort,
            error,
            repeat,
            endless: false,
        })
}

struct Harness {
    runtime: tokio::runtime::Runtime,
    driver: Driver,
    client: Client,
    _dir: tempfile::TempDir,
}

/// The driver the property runs against (one for all its cases).
fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(new_harness)
}

/// A driver of its own on a socket of its own, and a client of it.
fn new_harness() -> Harness {
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("csi.sock");
        let driver = Driver::default();
        let client = runtime.block_on(async {
            let listener = UnixListener::bind(&socket).expect("bind");
            let service = ControllerServer::new(driver.clone());
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming(UnixListenerStream::new(listener)),
            );
            let metrics = csi_attacher::metrics::Metrics::new().expect("metrics");
            let (client, _loss) = Client::connect(
                &socket,
                Duration::from_secs(10),
                Duration::from_secs(10),
                metrics.csi.clone(),
            )
            .await
            .expect("connect");
            client
        });
        Harness {
            runtime,
            driver,
            client,
            _dir: dir,
        }
    }
}

fn run(script: &Script, max_entries: i32) -> Result<Want, ReconcileError> {
    let h = harness();
    {
        let mut state = h.driver.0.lock().unwrap_or_else(|e| e.into_inner());
        *state = DriverState {
            script: Some(script.clone()),
            aborts_left: script.abort.map_or(0, |(_, n)| n),
            calls: 0,
        };
    }
    let (published, _pages) = h.runtime.block_on(list_published(&h.client, max_entries))?;
    Ok(Want::Published(published))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(support::proptest_cases(128)))]

    #[test]
    fn the_pager_returns_one_complete_listing_or_the_documented_error(
        script in script(),
        max_entries in 0i32..10,
    ) {
        let want = model(&script);
        let got = match run(&script, max_entries) {
            Ok(published) => published,
            Err(ReconcileError::List(status)) => Want::ListError(status.code),
            Err(ReconcileError::RepeatedToken(token)) => Want::RepeatedToken(token),
            // A finite listing never takes the whole pass limit, and no
            // leadership is in play here.
            Err(err @ (ReconcileError::PassTimeout { .. } | ReconcileError::NotLeading(_))) => {
                return Err(TestCaseError::fail(format!("script {script:?}: {err}")));
            }
        };
        prop_assert_eq!(got, want, "script {:?}", script);
    }
}

/// A driver that answers every page with a new token: the pass ends at its
/// overall limit with `PassTimeout` instead of listing forever.
#[test]
fn endless_fresh_tokens_end_the_pass() {
    let script = Script {
        volumes: Vec::new(),
        page_size: 1,
        junk: Vec::new(),
        abort: None,
        error: None,
        repeat: None,
        endless: true,
    };
    // Its own driver: the property's cases run in parallel with this test.
    let h = new_harness();
    h.driver.0.lock().unwrap_or_else(|e| e.into_inner()).script = Some(script);
    let limit = Duration::from_secs(1);
    let ended = h.runtime.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(20),
            list_published_within(&h.client, 0, limit),
        )
        .await
    });
    let calls = h.driver.0.lock().unwrap_or_else(|e| e.into_inner()).calls;
    match ended {
        Ok(Err(ReconcileError::PassTimeout { pages, .. })) => assert!(pages > 1, "{pages}"),
        Ok(other) => panic!("expected PassTimeout after {calls} pages, got {other:?}"),
        Err(_) => panic!("the pass was still listing after 20 s and {calls} pages"),
    }
}
