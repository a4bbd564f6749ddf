//! Wire formats: what protobuf instead of JSON would save the API server and
//! us when a watch lists every PersistentVolume (issue 30, item 3). Upstream
//! v4.12 asks for protobuf (`application/vnd.kubernetes.protobuf`); we ask for
//! JSON, because kube-client speaks JSON only.
//!
//! On a real kube-apiserver + etcd with `--pvs` PVs (another driver's, as in
//! a big cluster), for each format and each way of listing:
//! - **pages**: a paginated LIST, 500 objects a page, consistent (what a
//!   watch does where streaming lists are refused);
//! - **stream**: a streaming list (`watch=true&sendInitialEvents=true`),
//!   read until the `k8s.io/initial-events-end` bookmark (what our watches
//!   and upstream's do against 1.34 and later);
//!
//! it measures, `--reps` times each, interleaved:
//! - the API server's CPU seconds (its `/proc/<pid>/stat` utime + stime)
//!   while it serves the list, from the client's first byte asked to its
//!   last byte read (the list runs alone: nothing else talks to it);
//! - the API server's peak RSS growth while it serves (`VmHWM` reset through
//!   `/proc/<pid>/clear_refs` before, read after), the cost streaming lists
//!   exist to cut, and what its Go heap allocated meanwhile (its
//!   `go_memstats_alloc_bytes_total`, read before and after: steadier than
//!   the peak, which a heap kept from an earlier list hides);
//! - the bytes of the response body;
//! - **our decode**: this process's thread CPU to turn those same bytes into
//!   the views our PV cache keeps. JSON goes through our own decoder
//!   (`Wire<CachedPv>`, serde_json). For protobuf there is no decoder in the
//!   product: a prototype here (prost messages written from the fields of
//!   k8s.io/api's `generated.proto`, holding exactly what `CachedPv` keeps of
//!   these PVs) gives the figure it would reach.
//!
//! Run: `hack/bench.sh --wire-format [--pvs N] [--reps R] [--out DIR]`
//! (writes `DIR/wire-format.md`; default bench/).

// Measurement tooling: Cargo.toml's deny of unwrap/expect/panic is for the product.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

// The attacher benchmark's /proc readers (it uses all of them; this file not `parse_stat`).
#[path = "../tools/bench/src/procstat.rs"]
#[allow(dead_code)]
mod procstat;
#[path = "../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use futures::{stream, StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, PostParams};
use prost::Message;
use serde::Deserialize;

use csi_attacher::controller::model::{CachedPv, Wire};
use support::controlplane::{ControlPlane, Options};

const JSON: &str = "application/json";
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
const PROTOBUF_STREAM: &str = PROTOBUF;
const END_MARK: &[u8] = b"k8s.io/initial-events-end";
const PAGE: usize = 500;

struct Args {
    pvs: usize,
    reps: usize,
    out: PathBuf,
}

fn args() -> Result<Args> {
    let mut args = Args {
        pvs: 10_000,
        reps: 5,
        out: PathBuf::from("bench"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().context("a flag without its value");
        match arg.as_str() {
            "--pvs" => args.pvs = value()?.parse()?,
            "--reps" => args.reps = value()?.parse()?,
            "--out" => args.out = value()?.into(),
            // cargo bench passes --bench.
            "--bench" => {}
            other => bail!("unknown flag {other} (--pvs N, --reps R, --out DIR)"),
        }
    }
    Ok(args)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Format {
    Json,
    Protobuf,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Way {
    Pages,
    Stream,
}

/// One response body as read: the pages of a LIST, or the bytes of a stream.
struct Fetched {
    bodies: Vec<Vec<u8>>,
    server_cpu: f64,
    /// The API server's peak RSS while it served, over its RSS before, MiB.
    server_peak: f64,
    /// What the API server's Go heap allocated while it served, MiB.
    server_alloc: f64,
    wall: f64,
}

fn main() -> Result<()> {
    let args = args()?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let cp = ControlPlane::start(Options::default()).await?;
    let client = cp.client().await;
    let pid = apiserver_pid(cp.port)?;
    eprintln!("wire-format: creating {} PVs", args.pvs);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    stream::iter(0..args.pvs)
        .map(|i| {
            let pvs = pvs.clone();
            async move {
                let name = format!("wire-{i:06}");
                let pv = support::objects::pv(&name, "other.csi.example.com").build();
                pvs.create(&PostParams::default(), &pv).await.map(|_| ())
            }
        })
        .buffer_unordered(64)
        .try_collect::<()>()
        .await?;

    let cases = [
        (Format::Json, Way::Pages),
        (Format::Protobuf, Way::Pages),
        (Format::Json, Way::Stream),
        (Format::Protobuf, Way::Stream),
    ];
    // Warm-up: one of each (the watch cache, the encoders, the connection).
    for &(format, way) in &cases {
        fetch(&client, pid, format, way).await?;
    }
    let mut rows: Vec<Row> = cases
        .iter()
        .map(|&(format, way)| Row::new(format, way))
        .collect();
    for rep in 0..args.reps {
        eprintln!("wire-format: round {}/{}", rep + 1, args.reps);
        for (i, &(format, way)) in cases.iter().enumerate() {
            let fetched = fetch(&client, pid, format, way).await?;
            let (objects, decode) = decode(format, way, &fetched.bodies)?;
            if objects != args.pvs {
                bail!("{format:?} {way:?}: decoded {objects} PVs of {}", args.pvs);
            }
            rows[i].add(&fetched, decode);
        }
    }
    let text = report(&args, &rows, cp.kube_minor);
    print!("{text}");
    std::fs::create_dir_all(&args.out)?;
    std::fs::write(args.out.join("wire-format.md"), text)?;
    Ok(())
}

/// kube-apiserver's pid: the process serving `--secure-port=<port>`.
fn apiserver_pid(port: u16) -> Result<u32> {
    let flag = format!("--secure-port={port}");
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if cmdline.split(|&b| b == 0).any(|arg| arg == flag.as_bytes()) {
            return Ok(pid);
        }
    }
    bail!("no kube-apiserver with {flag}")
}

/// The API server's `go_memstats_alloc_bytes_total`: bytes its Go heap has
/// allocated so far.
async fn go_allocated(client: &kube::Client) -> Result<f64> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    let line = text
        .lines()
        .find(|l| l.starts_with("go_memstats_alloc_bytes_total "))
        .context("no go_memstats_alloc_bytes_total")?;
    Ok(line
        .split_whitespace()
        .nth(1)
        .context("no value")?
        .parse()?)
}

/// This thread's CPU seconds.
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

async fn fetch(client: &kube::Client, pid: u32, format: Format, way: Way) -> Result<Fetched> {
    let accept = match (format, way) {
        (Format::Json, _) => JSON,
        (Format::Protobuf, Way::Pages) => PROTOBUF,
        (Format::Protobuf, Way::Stream) => PROTOBUF_STREAM,
    };
    let alloc0 = go_allocated(client).await?;
    let started = Instant::now();
    procstat::reset_peak_rss(pid)?;
    let rss0 = procstat::status_mib(pid, "VmRSS")?;
    let cpu0 = procstat::cpu_seconds(pid)?;
    let mut bodies = Vec::new();
    match way {
        Way::Pages => {
            let mut next: Option<String> = None;
            loop {
                let mut uri = format!("/api/v1/persistentvolumes?limit={PAGE}");
                if let Some(token) = &next {
                    uri.push_str(&format!("&continue={token}"));
                }
                let body = get(client, &uri, accept).await?;
                next = continue_token(format, &body)?;
                bodies.push(body);
                if next.is_none() {
                    break;
                }
            }
        }
        Way::Stream => {
            let uri = "/api/v1/persistentvolumes?watch=true&sendInitialEvents=true\
                       &resourceVersionMatch=NotOlderThan&resourceVersion=0\
                       &allowWatchBookmarks=true&timeoutSeconds=290";
            bodies.push(stream_until_end(client, uri, accept).await?);
        }
    }
    let server_cpu = procstat::cpu_seconds(pid)? - cpu0;
    let server_peak = (procstat::status_mib(pid, "VmHWM")? - rss0).max(0.0);
    let wall = started.elapsed().as_secs_f64();
    let server_alloc = (go_allocated(client).await? - alloc0) / (1024.0 * 1024.0);
    Ok(Fetched {
        bodies,
        server_cpu,
        server_peak,
        server_alloc,
        wall,
    })
}

/// The body of a successful GET of `uri` asking for `accept`.
async fn body_of(client: &kube::Client, uri: &str, accept: &str) -> Result<kube::client::Body> {
    let request = http::Request::get(uri)
        .header(http::header::ACCEPT, accept)
        .body(Vec::new())?;
    let response = client.send(request.map(kube::client::Body::from)).await?;
    if !response.status().is_success() {
        bail!("GET {uri}: {}", response.status());
    }
    Ok(response.into_body())
}

async fn get(client: &kube::Client, uri: &str, accept: &str) -> Result<Vec<u8>> {
    let body = body_of(client, uri, accept).await?;
    Ok(body.collect().await?.to_bytes().to_vec())
}

/// The body of a streaming list up to (and with) its end bookmark; the
/// stream is dropped there.
async fn stream_until_end(client: &kube::Client, uri: &str, accept: &str) -> Result<Vec<u8>> {
    let mut body = body_of(client, uri, accept).await?;
    let mut bytes = Vec::new();
    let mut searched: usize = 0;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            bytes.extend_from_slice(&data);
            let from = searched.saturating_sub(END_MARK.len());
            if bytes[from..].windows(END_MARK.len()).any(|w| w == END_MARK) {
                // The rest of the bookmark's frame or line.
                return finish_last_event(bytes, &mut body).await;
            }
            searched = bytes.len();
        }
    }
    bail!("the stream ended before its end bookmark")
}

/// Reads on until the event holding the end bookmark is complete: a JSON
/// line ends with '\n'; a protobuf frame is as long as its 4-byte prefix says.
async fn finish_last_event(mut bytes: Vec<u8>, body: &mut kube::client::Body) -> Result<Vec<u8>> {
    loop {
        if complete(&bytes) {
            return Ok(bytes);
        }
        match body.frame().await {
            Some(frame) => {
                if let Ok(data) = frame?.into_data() {
                    bytes.extend_from_slice(&data);
                }
            }
            None => return Ok(bytes),
        }
    }
}

fn complete(bytes: &[u8]) -> bool {
    if bytes.first() == Some(&b'{') {
        return bytes.last() == Some(&b'\n');
    }
    let mut at = 0;
    while at + 4 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if at + 4 + len > bytes.len() {
            return false;
        }
        at += 4 + len;
    }
    at == bytes.len()
}

fn continue_token(format: Format, body: &[u8]) -> Result<Option<String>> {
    let token = match format {
        Format::Json => {
            #[derive(Deserialize)]
            struct Meta {
                #[serde(rename = "continue", default)]
                token: String,
            }
            #[derive(Deserialize)]
            struct List {
                metadata: Meta,
            }
            serde_json::from_slice::<List>(body)?.metadata.token
        }
        Format::Protobuf => {
            let list = PvList::decode(unwrap_unknown(body)?.as_slice())?;
            list.metadata.unwrap_or_default().continue_token
        }
    };
    Ok((!token.is_empty()).then_some(token))
}

/// Decodes every body into the views the PV cache keeps; (objects, CPU s).
fn decode(format: Format, way: Way, bodies: &[Vec<u8>]) -> Result<(usize, f64)> {
    let cpu0 = thread_cpu();
    let mut objects = 0;
    match (format, way) {
        (Format::Json, Way::Pages) => {
            #[derive(Deserialize)]
            struct List {
                items: Vec<Wire<CachedPv>>,
            }
            for body in bodies {
                let list: List = serde_json::from_slice(body)?;
                objects += std::hint::black_box(list.items).len();
            }
        }
        (Format::Json, Way::Stream) => {
            #[derive(Deserialize)]
            #[serde(tag = "type", content = "object")]
            enum Event {
                #[serde(rename = "ADDED")]
                Added(Box<Wire<CachedPv>>),
                #[serde(rename = "BOOKMARK")]
                Bookmark(serde::de::IgnoredAny),
            }
            for line in bodies[0].split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                if let Event::Added(pv) = serde_json::from_slice(line)? {
                    std::hint::black_box(pv);
                    objects += 1;
                }
            }
        }
        (Format::Protobuf, Way::Pages) => {
            for body in bodies {
                let list = PvList::decode(unwrap_unknown(body)?.as_slice())?;
                objects += std::hint::black_box(list.items).len();
            }
        }
        (Format::Protobuf, Way::Stream) => {
            let bytes = &bodies[0];
            let mut at = 0;
            while at + 4 <= bytes.len() {
                let len = u32::from_be_bytes(bytes[at..at + 4].try_into()?) as usize;
                let frame = &bytes[at + 4..at + 4 + len];
                at += 4 + len;
                // Frames are bare WatchEvents (the API server's raw protobuf
                // serializer); the objects in them carry the envelope.
                let event = WatchEvent::decode(frame)?;
                if event.kind == "ADDED" {
                    let raw = event.object.unwrap_or_default().raw;
                    let pv = Pv::decode(unwrap_unknown(&raw)?.as_slice())?;
                    std::hint::black_box(pv);
                    objects += 1;
                }
            }
        }
    }
    Ok((objects, thread_cpu() - cpu0))
}

/// The `raw` of the `runtime.Unknown` behind the "k8s\0" magic.
fn unwrap_unknown(bytes: &[u8]) -> Result<Vec<u8>> {
    let Some(inner) = bytes.strip_prefix(b"k8s\0") else {
        bail!("no protobuf magic")
    };
    Ok(Unknown::decode(inner)?.raw)
}

// The prototype's messages: field numbers from k8s.io/api and
// k8s.io/apimachinery's generated.proto (v0.36), only what `CachedPv` keeps.

#[derive(Clone, PartialEq, prost::Message)]
struct Unknown {
    #[prost(bytes = "vec", tag = "2")]
    raw: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct WatchEvent {
    #[prost(string, tag = "1")]
    kind: String,
    #[prost(message, optional, tag = "2")]
    object: Option<RawExtension>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawExtension {
    #[prost(bytes = "vec", tag = "1")]
    raw: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ListMeta {
    #[prost(string, tag = "2")]
    resource_version: String,
    #[prost(string, tag = "3")]
    continue_token: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PvList {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ListMeta>,
    #[prost(message, repeated, tag = "2")]
    items: Vec<Pv>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Time {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ObjectMeta {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "5")]
    uid: String,
    #[prost(string, tag = "6")]
    resource_version: String,
    #[prost(message, optional, tag = "9")]
    deletion_timestamp: Option<Time>,
    #[prost(btree_map = "string, string", tag = "11")]
    labels: std::collections::BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    annotations: std::collections::BTreeMap<String, String>,
    #[prost(string, repeated, tag = "14")]
    finalizers: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Pv {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<PvSpec>,
    #[prost(message, optional, tag = "3")]
    status: Option<PvStatus>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Quantity {
    #[prost(string, tag = "1")]
    string: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ObjectReference {
    #[prost(string, tag = "1")]
    kind: String,
    #[prost(string, tag = "2")]
    namespace: String,
    #[prost(string, tag = "3")]
    name: String,
    #[prost(string, tag = "4")]
    uid: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SecretReference {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    namespace: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct CsiSource {
    #[prost(string, tag = "1")]
    driver: String,
    #[prost(string, tag = "2")]
    volume_handle: String,
    #[prost(bool, tag = "3")]
    read_only: bool,
    #[prost(string, tag = "4")]
    fs_type: String,
    #[prost(btree_map = "string, string", tag = "5")]
    volume_attributes: std::collections::BTreeMap<String, String>,
    #[prost(message, optional, tag = "6")]
    controller_publish_secret_ref: Option<SecretReference>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PvSource {
    #[prost(message, optional, tag = "22")]
    csi: Option<CsiSource>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PvSpec {
    #[prost(btree_map = "string, message", tag = "1")]
    capacity: std::collections::BTreeMap<String, Quantity>,
    #[prost(message, optional, tag = "2")]
    source: Option<PvSource>,
    #[prost(string, repeated, tag = "3")]
    access_modes: Vec<String>,
    #[prost(message, optional, tag = "4")]
    claim_ref: Option<ObjectReference>,
    #[prost(string, tag = "5")]
    reclaim_policy: String,
    #[prost(string, tag = "6")]
    storage_class_name: String,
    #[prost(string, repeated, tag = "7")]
    mount_options: Vec<String>,
    #[prost(string, tag = "8")]
    volume_mode: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PvStatus {
    #[prost(string, tag = "1")]
    phase: String,
}

/// The figures of one (format, way) over the rounds.
struct Row {
    format: Format,
    way: Way,
    server_cpu: Vec<f64>,
    server_peak: Vec<f64>,
    server_alloc: Vec<f64>,
    bytes: Vec<f64>,
    decode: Vec<f64>,
    wall: Vec<f64>,
}

impl Row {
    fn new(format: Format, way: Way) -> Self {
        Self {
            format,
            way,
            server_cpu: Vec::new(),
            server_peak: Vec::new(),
            server_alloc: Vec::new(),
            bytes: Vec::new(),
            decode: Vec::new(),
            wall: Vec::new(),
        }
    }

    fn add(&mut self, fetched: &Fetched, decode: f64) {
        self.server_cpu.push(fetched.server_cpu);
        self.server_peak.push(fetched.server_peak);
        self.server_alloc.push(fetched.server_alloc);
        self.bytes
            .push(fetched.bodies.iter().map(Vec::len).sum::<usize>() as f64);
        self.decode.push(decode);
        self.wall.push(fetched.wall);
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn spread(values: &[f64]) -> String {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{min:.3}–{max:.3}")
}

fn report(args: &Args, rows: &[Row], minor: u32) -> String {
    let mut out = format!(
        "# Wire formats: JSON against protobuf for a list of {} PVs\n\n\
         kube-apiserver 1.{minor} (the tests' control plane, `tests/support/controlplane.rs`), one client, nothing else running on \
         it; {} rounds, medians (range). Command: `hack/bench.sh --wire-format --pvs {} --reps {}`.\n\n\
         | way | format | API server CPU s | API server peak RSS growth MiB | API server Go allocation MiB | bytes | our decode CPU s | wall s |\n\
         |---|---|---|---|---|---|---|---|\n",
        args.pvs, args.reps, args.pvs, args.reps
    );
    for row in rows {
        out.push_str(&format!(
            "| {} | {} | {:.3} ({}) | {:.1} ({}) | {:.0} | {:.0} | {:.3} ({}) | {:.3} |\n",
            match row.way {
                Way::Pages => "pages of 500",
                Way::Stream => "streaming list",
            },
            match row.format {
                Format::Json => "JSON",
                Format::Protobuf => "protobuf",
            },
            median(&row.server_cpu),
            spread(&row.server_cpu),
            median(&row.server_peak),
            spread(&row.server_peak),
            median(&row.server_alloc),
            median(&row.bytes),
            median(&row.decode),
            spread(&row.decode),
            median(&row.wall),
        ));
    }
    out.push_str(
        "\nOur decode for JSON is the product's (`Wire<CachedPv>`); for protobuf it is this \
         benchmark's prototype (prost, only the fields `CachedPv` keeps), the least a protobuf \
         decoder would cost.\n",
    );
    out
}
