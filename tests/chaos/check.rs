//! The invariants, checked after a run from the audit log, the driver's ledger
//! and state, the objects, metrics and logs.
//!
//! Every invariant is a pure function over a [`History`] (gathered by
//! `tests/chaos.rs`, which does all the I/O) that adds to [`Findings`]:
//! violations, checks that could not be made (counted, reported, never a
//! silent pass), exemptions (counted) and measurements. `check_selftest.rs`
//! feeds each one synthetic histories that violate it.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use std::time::Duration;

use crate::faults::Window;
use crate::workload::Instance;
use crate::world::{Call, Exit, FINALIZER, LEASE_DURATION, RENEW_DEADLINE};

/// `2026-11-26T11:40:53.123456Z` → Unix nanoseconds.
pub fn parse_time(text: &str) -> Option<i128> {
    let (date, time) = text.trim_end_matches('Z').split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    let frac_nanos: i128 = format!("{:0<9}", &frac[..frac.len().min(9)]).parse().ok()?;
    // Days from civil (proleptic Gregorian).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = if y2 >= 0 { y2 } else { y2 - 399 } / 400;
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    let secs = days * 86400 + hh * 3600 + mm * 60 + ss;
    Some(secs as i128 * 1_000_000_000 + frac_nanos)
}

/// Unix nanoseconds → `2026-11-26T11:40:53.123456Z`.
pub fn format_time(nanos: i128) -> String {
    let secs = (nanos / 1_000_000_000) as i64;
    let micros = ((nanos % 1_000_000_000) / 1000) as i64;
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn secs(nanos: i128) -> String {
    format_time(nanos)
}

fn nanos(d: Duration) -> i128 {
    d.as_nanos() as i128
}

const SECOND: i128 = 1_000_000_000;

/// The leadership window's length after the start of a successful renewal:
/// the code's own (`src/leader.rs`: renew deadline minus the cancel allowance).
pub fn window() -> Duration {
    csi_attacher::leader::window_length(RENEW_DEADLINE)
}

/// The node a CSINode node ID belongs to (`<node>-id` or `<node>-id.<generation>`).
pub fn node_of_id(id: &str) -> Option<String> {
    id.split_once("-id").map(|(n, _)| n.to_string())
}

/// Everything the invariants read, gathered by the suite (all I/O is there).
#[derive(Debug, Clone, Default)]
pub struct History {
    pub audit: Vec<Value>,
    pub calls: Vec<Call>,
    pub instances: Vec<Instance>,
    pub live_vas: Vec<Value>,
    pub pvs: Vec<Value>,
    /// The driver's published table: volume → node IDs.
    pub published: Value,
    pub exits: Vec<Exit>,
    pub logs: Vec<(String, String)>,
    pub events_text: String,
    pub metrics: Vec<(String, String)>,
    pub canary: String,
    pub windows: Vec<Window>,
    pub replicas: usize,
    pub lease: String,
    pub after: AfterFaults,
}

/// What the suite saw once the faults stopped (I3, I5).
#[derive(Debug, Clone, Default)]
pub struct AfterFaults {
    /// The Lease holder once healed (`None`: none within 30 s).
    pub leader: Option<usize>,
    pub probe: Option<String>,
    pub probe_took: Duration,
    /// Why the probe VA did not attach (`None`: it did).
    pub probe_error: Option<String>,
    /// What was still to do 60 s after the faults (empty: drained).
    pub pending: String,
    /// Why three whole reconcile passes of one leader (after draining) were not seen (`None`: seen).
    pub reconcile_error: Option<String>,
    /// The leader's `/metrics` after draining (`None`: not served).
    pub leader_metrics: Option<String>,
}

/// What the checks found.
#[derive(Debug, Default)]
pub struct Findings {
    /// (invariant, evidence).
    pub violations: Vec<(String, String)>,
    /// (fault or check, why): a fault without evidence that it took effect, or
    /// a check that could not be made. Counted and reported, never a silent pass.
    pub skipped: Vec<(String, String)>,
    /// (invariant, what): exempted by a documented limit, counted.
    pub exempt: Vec<(String, String)>,
    /// (what, value): measurements for the report.
    pub measured: Vec<(String, String)>,
    /// (title, lines): what the history holds about a violation's object,
    /// so that a red run can be read from its report alone.
    pub stories: Vec<(String, Vec<String>)>,
}

impl Findings {
    fn violation(&mut self, invariant: &str, evidence: String) {
        self.violations.push((invariant.to_string(), evidence));
    }
    /// Violations of `invariant`.
    pub fn of(&self, invariant: &str) -> Vec<&str> {
        self.violations
            .iter()
            .filter(|(i, _)| i == invariant)
            .map(|(_, e)| e.as_str())
            .collect()
    }
}

/// A leadership term of one identity, from the Lease writes in the audit log.
#[derive(Debug, Clone)]
pub struct Term {
    pub identity: String,
    /// The write that made it holder (API server's receive time).
    pub acquired: i128,
    /// When its window may first open: at once, or a lease duration after a
    /// CREATE (`src/leader/` holds a Lease it created).
    pub opens: i128,
    pub last_renewal: i128,
}

impl Term {
    /// The last instant a call may start: the window of the last renewal,
    /// which the code times from the attempt's start (before the API server
    /// received it), so this bound is never early.
    pub fn calls_until(&self) -> i128 {
        self.last_renewal + nanos(window())
    }
    /// The last instant a call may still run for its caller: the window plus
    /// the cancel allowance (the cancellation has reached the driver).
    pub fn until(&self) -> i128 {
        self.last_renewal + nanos(RENEW_DEADLINE)
    }
    fn holds(&self, call: &Call) -> bool {
        call.start >= self.opens
            && call.start <= self.calls_until()
            && call.caller_end() <= self.until()
    }
}

fn received(event: &Value) -> i128 {
    event["requestReceivedTimestamp"]
        .as_str()
        .and_then(parse_time)
        .unwrap_or_default()
}

fn ok(event: &Value) -> bool {
    event["responseStatus"]["code"]
        .as_i64()
        .is_some_and(|c| (200..300).contains(&c))
}

/// Terms from every successful Lease write (create/update/patch/delete), in
/// time order. Renewals of one holder make one term only while each comes
/// within the window of the one before: a renewal after that was one the
/// holder's own client had given up on (its window closed, it stopped acting),
/// so it starts a new term.
pub fn terms(audit: &[Value], lease: &str) -> Vec<Term> {
    let mut writes: Vec<(i128, &str, Option<String>)> = audit
        .iter()
        .filter(|e| e["objectRef"]["resource"] == "leases" && e["objectRef"]["name"] == lease)
        .filter(|e| {
            matches!(
                e["verb"].as_str(),
                Some("create" | "update" | "patch" | "delete")
            )
        })
        .filter(|e| ok(e))
        .map(|e| {
            let verb = e["verb"].as_str().unwrap_or_default();
            let holder = if verb == "delete" {
                None
            } else {
                e["responseObject"]["spec"]["holderIdentity"]
                    .as_str()
                    .map(str::to_string)
            };
            (received(e), verb, holder)
        })
        .collect();
    writes.sort_by_key(|w| w.0);
    let gap = nanos(window());
    let mut terms: Vec<Term> = Vec::new();
    let mut current: Option<Term> = None;
    for (at, verb, holder) in writes {
        match (&mut current, holder) {
            // Also a CREATE after a deletion: a leader whose window is still
            // open goes on leading on the Lease it re-creates (no hold).
            (Some(term), Some(h)) if term.identity == h && at - term.last_renewal <= gap => {
                term.last_renewal = at
            }
            // A deletion ends nobody's window: the holder acts until its
            // window closes, and may re-create the Lease within it.
            (Some(_), None) if verb == "delete" => {}
            (_, holder) => {
                if let Some(term) = current.take() {
                    terms.push(term);
                }
                current = holder.filter(|h| !h.is_empty()).map(|identity| Term {
                    identity,
                    acquired: at,
                    opens: if verb == "create" {
                        at + nanos(LEASE_DURATION)
                    } else {
                        at
                    },
                    last_renewal: at,
                });
            }
        }
    }
    terms.extend(current);
    terms
}

/// Every invariant and the fault evidence.
pub fn check(h: &History) -> Findings {
    let mut f = Findings::default();
    i1(h, &mut f);
    i2(h, &mut f);
    i3(h, &mut f);
    i4(h, &mut f);
    i5(h, &mut f);
    i6(h, &mut f);
    i7(h, &mut f);
    i8(h, &mut f);
    i9(h, &mut f);
    i10(h, &mut f);
    i11(h, &mut f);
    i12(h, &mut f);
    i13(h, &mut f);
    i14(h, &mut f);
    evidence(h, &mut f);
    f
}

fn has_ours(obj: &Value) -> bool {
    obj["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
}

/// API server kills (the audit event of a write answered just before may be lost).
fn apiserver_killed(h: &History, from: i128, to: i128) -> bool {
    h.windows.iter().any(|w| {
        matches!(w.kind.as_str(), "apiserver-sigkill" | "watch-expiry-410")
            && w.end >= from
            && w.start <= to
    })
}

/// A successful delete of this VA answered with our finalizer on and no
/// deletionTimestamp: the API server removed it at once in spite of our
/// finalizer, not marked for deletion (a delete without our finalizer in
/// its answer removed a VA someone had stripped).
fn deleted_at_once(h: &History, inst: &Instance) -> bool {
    h.audit.iter().any(|e| {
        e["verb"] == "delete"
            && e["objectRef"]["resource"] == "volumeattachments"
            && e["objectRef"]["name"] == inst.name.as_str()
            && ok(e)
            && e["responseObject"]["metadata"]["uid"] == inst.uid.as_str()
            && has_ours(&e["responseObject"])
            && !e["responseObject"]["metadata"]["deletionTimestamp"].is_string()
    })
}

/// What the history holds about `inst` from its creation to 10 s after
/// `until`: every API request on its name (the workload's, the replicas'),
/// every driver call on its volume, the faults of that time and the replicas'
/// log lines naming it, each in time order.
fn va_story(h: &History, inst: &Instance, until: i128) -> Vec<String> {
    let (from, to) = (inst.created - SECOND, until + 10 * SECOND);
    let during = |t: i128| (from..=to).contains(&t);
    let mut lines: Vec<(i128, String)> = Vec::new();
    for e in &h.audit {
        let at = received(e);
        if e["objectRef"]["resource"] != "volumeattachments"
            || e["objectRef"]["name"] != inst.name.as_str()
            || !during(at)
        {
            continue;
        }
        let answer = &e["responseObject"]["metadata"];
        lines.push((
            at,
            format!(
                "api    {} {}{} by {} -> {} (uid {}, finalizers {}, deleting {})",
                e["verb"].as_str().unwrap_or("?"),
                inst.name,
                e["objectRef"]["subresource"]
                    .as_str()
                    .map(|s| format!("/{s}"))
                    .unwrap_or_default(),
                e["user"]["username"].as_str().unwrap_or("?"),
                e["responseStatus"]["code"],
                answer["uid"].as_str().unwrap_or("-"),
                answer["finalizers"],
                answer["deletionTimestamp"].is_string(),
            ),
        ));
    }
    for c in &h.calls {
        if c.volume != inst.handle || !during(c.start) {
            continue;
        }
        lines.push((
            c.start,
            format!(
                "driver {} {} by replica-{} (driver #{}) .. {} {}{}",
                c.method,
                c.node,
                c.caller,
                c.incarnation,
                secs(c.end),
                c.code,
                c.abandoned
                    .map(|a| format!(", abandoned {}", secs(a)))
                    .unwrap_or_default(),
            ),
        ));
    }
    for w in &h.windows {
        if w.end >= from && w.start <= to {
            lines.push((
                w.start,
                format!("fault  {} until {}: {}", w.kind, secs(w.end), w.note),
            ));
        }
    }
    let mut out: Vec<String> = lines
        .into_iter()
        .map(|(at, line)| format!("{} {line}", secs(at)))
        .collect();
    out.sort();
    for (name, log) in &h.logs {
        let named: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(inst.name.as_str()))
            .collect();
        let skip = named.len().saturating_sub(60);
        out.extend(named[skip..].iter().map(|l| format!("{name}: {l}")));
    }
    out
}

pub fn i1(h: &History, f: &mut Findings) {
    let live: BTreeSet<(&str, &str)> = h
        .live_vas
        .iter()
        .filter_map(|va| {
            Some((
                va["metadata"]["name"].as_str()?,
                va["metadata"]["uid"].as_str()?,
            ))
        })
        .collect();
    let mut va_writes: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for e in &h.audit {
        if e["objectRef"]["resource"] == "volumeattachments" {
            if let Some(name) = e["objectRef"]["name"].as_str() {
                va_writes.entry(name).or_default().push(e);
            }
        }
    }
    let stripped = stripped(h);
    for inst in &h.instances {
        if inst.deleted.is_none() || live.contains(&(inst.name.as_str(), inst.uid.as_str())) {
            continue; // not deleted, or still deleting (I2's business)
        }
        // Our finalizer stripped by the suite (a `finalizer-stripped-*`
        // fault): gone without a detach, an orphan made on purpose (I13's).
        if let Some(s) = stripped
            .iter()
            .find(|s| s.name == inst.name && s.uid == inst.uid)
        {
            f.exempt.push((
                "I1".into(),
                format!(
                    "VA {} (uid {}, volume {}): our finalizer stripped by the suite (fault #{}): an orphan made on purpose",
                    inst.name, inst.uid, inst.handle, s.fault
                ),
            ));
            continue;
        }
        let node_ok = |id: &str| node_of_id(id).as_deref() == Some(inst.node.as_str());
        // The last Publish is the one to undo (a refused one may have
        // acted too, for all the ledger tells).
        let Some(last) = h
            .calls
            .iter()
            .filter(|c| {
                c.method == "ControllerPublishVolume" && c.volume == inst.handle && node_ok(&c.node)
            })
            .max_by_key(|c| c.end)
        else {
            continue; // never published: nothing to undo
        };
        let unpublish = h
            .calls
            .iter()
            .filter(|c| {
                c.method == "ControllerUnpublishVolume"
                    && c.volume == inst.handle
                    && c.node == last.node
                    && c.code == "OK"
                    && c.start >= last.end
            })
            .min_by_key(|c| c.end);
        // When our finalizer left: first write on this VA whose response lacks
        // it, or whose request dropped it and got no answer saying whether it
        // applied (5xx: a 504 after etcd applied it): no sooner than its receipt.
        let removal = va_writes
            .get(inst.name.as_str())
            .into_iter()
            .flatten()
            .filter(|e| {
                let answered = e["responseObject"]["metadata"]["uid"] == inst.uid.as_str()
                    && ok(e)
                    && e["responseObject"]["metadata"]["deletionTimestamp"].is_string()
                    && !has_ours(&e["responseObject"]);
                let unknown = e["requestObject"]["metadata"]["uid"] == inst.uid.as_str()
                    && e["responseStatus"]["code"]
                        .as_i64()
                        .is_some_and(|c| c >= 500)
                    && e["requestObject"]["metadata"]
                        .get("finalizers")
                        .is_some_and(|f| f.is_null() || !has_ours(&e["requestObject"]));
                answered || unknown
            })
            .map(|e| received(e))
            .min();
        // The Publish's caller wrote `attached` to this very VA after the
        // Publish began, and the API server took it.
        let recorded = va_writes
            .get(inst.name.as_str())
            .into_iter()
            .flatten()
            .any(|e| {
                e["objectRef"]["subresource"] == "status"
                    && ok(e)
                    && e["responseObject"]["metadata"]["uid"] == inst.uid.as_str()
                    && e["responseObject"]["status"]["attached"] == true
                    && received(e) >= last.start
            });
        match (unpublish, removal) {
            // The API server removed the VA at once, finalizer and all, and
            // nothing told the Publish's caller its VA was gone: it gave the
            // Publish up (killed or stopped while the driver held it: no VA
            // and no book of it is left to ask for an Unpublish; the CI run
            // at 287fd5f, SIGTERM during a hung Publish), or it wrote
            // `attached` to the VA and the API server took the write (the
            // second full run at 5b59371: the delete's answer carried our
            // finalizer, the status write 14 ms later was answered 200, then
            // the VA was gone). An orphan publication: I13 must see it said,
            // I3 unpublished. A Publish whose caller got its answer and
            // recorded nothing is still I1's: the undo must unpublish a
            // Publish whose VA is gone.
            (None, _) if deleted_at_once(h, inst) && (last.abandoned.is_some() || recorded) => f.skipped.push((
                "I1".into(),
                format!(
                    "VA {} (uid {}): deleted at once by the API server with our finalizer on, and the Publish's caller {}: an orphan (I13's, I3's)",
                    inst.name,
                    inst.uid,
                    if last.abandoned.is_some() {
                        "gave it up"
                    } else {
                        "recorded it attached before the VA was gone"
                    }
                ),
            )),
            (None, _) => {
                f.violation(
                    "I1",
                    format!(
                        "VA {} (uid {}, volume {}, node {}, created {}, delete requested {}) is gone; its last Publish (to {} by replica-{}, {} .. {}, {}{}) has no OK Unpublish to that node ID started after it",
                        inst.name, inst.uid, inst.handle, inst.node, secs(inst.created), inst.deleted.map(secs).unwrap_or_default(),
                        last.node, last.caller, secs(last.start), secs(last.end), last.code,
                        if last.abandoned.is_some() { ", abandoned by its caller" } else { "" }
                    ),
                );
                f.stories.push((
                    format!("I1: VA {} (uid {}, volume {}, node {})", inst.name, inst.uid, inst.handle, inst.node),
                    va_story(h, inst, last.end),
                ));
            }
            (Some(u), Some(removed)) if removed < u.end => f.violation(
                "I1",
                format!(
                    "VA {} (volume {}): our finalizer removed at {} before the Unpublish ended at {}",
                    inst.name,
                    inst.handle,
                    secs(removed),
                    secs(u.end)
                ),
            ),
            (Some(_), Some(_)) => {}
            // The API server removed the VA at once, finalizer and all (a
            // delete whose answer has no deletionTimestamp): nothing of ours
            // to order. Seen when the delete raced our finalizer's addition.
            (Some(_), None) if deleted_at_once(h, inst) => f.skipped.push((
                "I1".into(),
                format!(
                    "VA {} (uid {}): deleted at once by the API server with our finalizer on; no removal of ours to order",
                    inst.name, inst.uid
                ),
            )),
            // No write that removed our finalizer: the order cannot be checked.
            (Some(u), None) if apiserver_killed(h, u.start, u.end + 60 * SECOND) => f.skipped.push((
                "I1".into(),
                format!(
                    "VA {}: no audit event removing our finalizer (an API server kill after its Unpublish may have lost it)",
                    inst.name
                ),
            )),
            (Some(u), None) => f.violation(
                "I1",
                format!(
                    "VA {} (uid {}, volume {}) is gone but the audit log has no write removing our finalizer (Unpublish ended {}): the order cannot be proven",
                    inst.name,
                    inst.uid,
                    inst.handle,
                    secs(u.end)
                ),
            ),
        }
    }
}
pub fn i2(h: &History, f: &mut Findings) {
    for va in &h.live_vas {
        if va["metadata"]["deletionTimestamp"].is_string() && has_ours(va) {
            f.violations.push((
                "I2".into(),
                format!(
                    "VA {} deleting since {} still has our finalizer (finalizers {}, status {})",
                    va["metadata"]["name"],
                    va["metadata"]["deletionTimestamp"],
                    va["metadata"]["finalizers"],
                    va["status"]
                ),
            ));
        }
    }
    let referenced: BTreeSet<&str> = h
        .live_vas
        .iter()
        .filter_map(|va| va["spec"]["source"]["persistentVolumeName"].as_str())
        .collect();
    for pv in &h.pvs {
        let name = pv["metadata"]["name"].as_str().unwrap_or_default();
        if pv["metadata"]["deletionTimestamp"].is_string()
            && has_ours(pv)
            && !referenced.contains(name)
        {
            f.violations.push((
                "I2".into(),
                format!(
                    "PV {name} deleting, no VA references it, still has our finalizer ({})",
                    pv["metadata"]["finalizers"]
                ),
            ));
        }
    }
}

/// A live VA's volume handle and node: from the workload's instance of it
/// (same name and uid), else from the VA's spec and its PV.
fn volume_and_node(h: &History, va: &Value) -> Option<(String, String)> {
    let name = va["metadata"]["name"].as_str().unwrap_or_default();
    let uid = va["metadata"]["uid"].as_str().unwrap_or_default();
    if let Some(inst) = h.instances.iter().find(|i| i.name == name && i.uid == uid) {
        return Some((inst.handle.clone(), inst.node.clone()));
    }
    let pv = va["spec"]["source"]["persistentVolumeName"].as_str()?;
    let handle = h.pvs.iter().find(|p| p["metadata"]["name"] == pv)?["spec"]["csi"]["volumeHandle"]
        .as_str()?;
    let node = va["spec"]["nodeName"].as_str()?;
    Some((handle.to_string(), node.to_string()))
}

pub fn i3(h: &History, f: &mut Findings) {
    // A driver that lost its state is repaired by a reconcile pass: without
    // whole passes after draining, a difference proves nothing either way.
    if let Some(why) = &h.after.reconcile_error {
        f.violation(
            "I3",
            format!("three whole reconcile passes after draining not seen: {why}"),
        );
    }
    let mut driver: BTreeSet<(String, String)> = BTreeSet::new();
    if let Some(table) = h.published.as_object() {
        for (volume, nodes) in table {
            for node in nodes.as_array().into_iter().flatten() {
                driver.insert((
                    volume.clone(),
                    node.as_str().unwrap_or_default().to_string(),
                ));
            }
        }
    }
    let mut expected: BTreeSet<(String, String)> = BTreeSet::new();
    for va in &h.live_vas {
        if va["status"]["attached"] != true {
            continue;
        }
        // Its volume and node: the workload's record, or the objects' own
        // for a VA the workload does not know (created while the answer
        // and the follow-up GET were both lost; it is live all the same).
        let Some((handle, node)) = volume_and_node(h, va) else {
            continue;
        };
        // The node ID it was last published to (CSINode may have been re-registered since).
        let node_id = h
            .calls
            .iter()
            .filter(|c| {
                c.method == "ControllerPublishVolume"
                    && c.code == "OK"
                    && c.volume == handle
                    && node_of_id(&c.node).as_deref() == Some(node.as_str())
            })
            .max_by_key(|c| c.end)
            .map(|c| c.node.clone())
            .unwrap_or_else(|| format!("{node}-id"));
        expected.insert((handle, node_id));
    }
    let stripped = stripped(h);
    for extra in driver.difference(&expected) {
        // An orphan the suite made and its Node still uses: kept by
        // --unpublish-orphans, rightly (the other orphans it made must be gone).
        let kept = stripped.iter().find(|s| {
            s.in_use && s.volume == extra.0 && node_of_id(&extra.1).as_deref() == Some(&s.node)
        });
        if let Some(s) = kept {
            f.exempt.push((
                "I3".into(),
                format!(
                    "{extra:?}: an orphan made by the suite (fault #{}, VA {}), kept: its Node lists it in status.volumesInUse",
                    s.fault, s.name
                ),
            ));
            continue;
        }
        f.violations.push((
            "I3".into(),
            format!("driver has {extra:?} published, no live attached VA for it"),
        ));
    }
    for missing in expected.difference(&driver) {
        f.violations.push((
            "I3".into(),
            format!(
                "a live VA is attached=true for {missing:?}, the driver does not have it published"
            ),
        ));
    }
}

pub fn i4(h: &History, f: &mut Findings) {
    let mut calls: Vec<&Call> = h.calls.iter().collect();
    calls.sort_by_key(|c| c.start);
    // Overlaps between different callers (sweep, keeping the latest-ending call per caller).
    let mut open: BTreeMap<usize, &Call> = BTreeMap::new();
    let mut overlaps = 0;
    for call in &calls {
        for (caller, other) in &open {
            if *caller != call.caller && other.caller_end() > call.start {
                overlaps += 1;
                if overlaps <= 20 {
                    f.violation(
                        "I4",
                        format!(
                            "replica-{} {} {} {} [{} .. {}] overlaps replica-{} {} {} {} [{} .. {}]{}",
                            other.caller, other.method, other.volume, other.node, secs(other.start), secs(other.caller_end()),
                            call.caller, call.method, call.volume, call.node, secs(call.start), secs(call.caller_end()),
                            if other.abandoned.is_some() { " (first call abandoned by its caller)" } else { "" }
                        ),
                    );
                }
            }
        }
        let keep = open
            .get(&call.caller)
            .is_none_or(|o| o.caller_end() < call.caller_end());
        if keep {
            open.insert(call.caller, call);
        }
    }
    if overlaps > 20 {
        f.violation(
            "I4",
            format!("{overlaps} overlapping call pairs in all (first 20 shown)"),
        );
    }
    let terms = terms(&h.audit, &h.lease);
    let mut outside = 0;
    for call in &calls {
        let identity = format!("replica-{}", call.caller);
        if terms
            .iter()
            .any(|t| t.identity == identity && t.holds(call))
        {
            continue;
        }
        // The window's known limit (`src/leader/`): a call past its window
        // check when its caller was frozen, received as it resumed. No flag
        // closes it (no driver reads a fencing token), so it is measured and
        // shown, not hidden: exempt when received within a second of the
        // SIGSTOP's end, counted with its lateness. Another replica acting
        // meanwhile is still the overlap check's violation above.
        if let Some(resumed) = resumed_before(h, call) {
            f.exempt.push((
                "I4".into(),
                format!(
                    "replica-{} {} {} received {} ms after its SIGSTOP ended, outside its leadership (the window's known limit)",
                    call.caller,
                    call.method,
                    call.volume,
                    (call.start - resumed) / 1_000_000
                ),
            ));
            continue;
        }
        outside += 1;
        if outside <= 20 {
            let near = terms
                .iter()
                .rfind(|t| t.identity == identity && t.acquired <= call.start)
                .map(|t| {
                    format!(
                        "its last term: acquired {}, window opens {}, last renewal {}: calls start by {} and end by {}",
                        secs(t.acquired),
                        secs(t.opens),
                        secs(t.last_renewal),
                        secs(t.calls_until()),
                        secs(t.until())
                    )
                })
                .unwrap_or_else(|| "no term of it started before".into());
            f.violation(
                "I4",
                format!(
                    "replica-{} {} {} [{} .. {}] outside its leadership ({near})",
                    call.caller,
                    call.method,
                    call.volume,
                    secs(call.start),
                    secs(call.caller_end())
                ),
            );
        }
    }
    if outside > 20 {
        f.violation(
            "I4",
            format!("{outside} calls outside their caller's leadership in all (first 20 shown)"),
        );
    }
}

/// When `call`'s caller resumed from a SIGSTOP (a fault window noting
/// `replica-<n> stopped`) that began before the call and ended at most a
/// second before it started.
fn resumed_before(h: &History, call: &Call) -> Option<i128> {
    let stopped = format!("replica-{} stopped ", call.caller);
    h.windows
        .iter()
        .filter(|w| !w.skipped && w.note.starts_with(&stopped))
        .find(|w| w.start <= call.start && call.start <= w.end + SECOND)
        .map(|w| w.end)
}

/// I5: once healed, a leader attaches a new VA quickly, everything drains, the lanes empty.
pub fn i5(h: &History, f: &mut Findings) {
    let a = &h.after;
    let bound = crate::world::TIMEOUT * 2 + Duration::from_secs(1);
    if a.leader.is_none() {
        f.violation("I5", "no leader 30 s after the faults stopped".into());
    }
    if a.probe_error.is_some() || a.probe_took > bound {
        f.violation(
            "I5",
            format!(
                "new VA {:?} after the faults: attached after {:?} (bound {bound:?}): {:?}; leader {:?}",
                a.probe, a.probe_took, a.probe_error, a.leader
            ),
        );
    }
    if !a.pending.is_empty() {
        f.violation(
            "I5",
            format!("not drained 60 s after the faults: {}", a.pending),
        );
    }
    match (&a.leader, &a.leader_metrics) {
        (Some(l), None) => f.violation(
            "I5",
            format!("leader replica-{l} serves no /metrics: its lanes cannot be checked"),
        ),
        (Some(l), Some(metrics)) => {
            for line in metrics
                .lines()
                .filter(|l| l.starts_with("csi_attacher_lane_depth{"))
            {
                if !line.ends_with(" 0") {
                    f.violation("I5", format!("leader replica-{l} lane not empty: {line}"));
                }
            }
        }
        (None, _) => {}
    }
}

/// Why a replica exits 1, as its last `"exiting" err=...` line says, and the
/// faults that explain it, with how long after a fault's end it may come.
const EXIT1_REASONS: &[(&str, &[&str], i128)] = &[
    (
        "Stopped leading",
        &[
            "apiserver-sigkill",
            "apiserver-sigstop",
            "etcd-stall",
            "watch-expiry-410",
            "leader-partition",
            "proxy-delay",
            "proxy-reset",
            "lost-responses",
            "apf-429",
            "lease-deleted",
            "lease-stolen",
            "leader-sigstop-past-lease",
            "fd-limit-and-idle-flood",
            // Its connections vanish: the Lease renewal fails on the dead
            // connection (I11 counts the exit as noticing).
            "watch-half-open",
        ],
        5 * SECOND,
    ),
    (
        "Lost connection to CSI driver",
        &["driver-restart", "driver-restart-empty"],
        10 * SECOND,
    ),
    // A replica frozen (or its driver restarted) while it starts: its
    // driver probe's deadline passes meanwhile and it exits 1, as upstream's
    // would (the kubelet restarts it). Seen in a loaded CI-size run: the
    // suite had just restarted replica-1 after a SIGKILL when the next fault
    // froze it for 4.3 s.
    (
        "CSI driver startup failed",
        &[
            "leader-sigstop-past-lease",
            "driver-restart",
            "driver-restart-empty",
        ],
        5 * SECOND,
    ),
];

/// The reason replica `r` logged for exiting, from the 5 s before `at`.
fn exit_reason(h: &History, r: usize, at: i128) -> Option<&str> {
    let name = format!("replica-{r} log");
    let (_, log) = h.logs.iter().find(|(n, _)| *n == name)?;
    log.lines()
        .filter(|l| l.contains("\"exiting\" err="))
        .rfind(|l| klog_time(l, at).is_some_and(|t| t <= at && t >= at - 5 * SECOND))
}

/// Most API requests a standby may make in one second during an outage.
/// Measured: a standby GETs the Lease about twice a second and keeps its
/// watches; the CI run's peak during outages was 11 in one second (requests
/// queued behind a stopped API server land together). The bound is about 3×
/// that; a hot loop makes hundreds (the old bound, 100, was the client's burst).
pub const STANDBY_REQUESTS_PER_SECOND: u32 = 30;

pub fn i6(h: &History, f: &mut Findings) {
    for (name, log) in h
        .logs
        .iter()
        .filter(|(n, _)| !n.starts_with("kube-apiserver"))
    {
        for line in log.lines().filter(|l| l.contains("panicked at")) {
            f.violation("I6", format!("{name}: {line}"));
        }
    }
    // A log flood is a hot loop: more than 1,000 lines in one second of a replica's log.
    for (name, log) in h.logs.iter().filter(|(n, _)| n.starts_with("replica-")) {
        let mut per_second: BTreeMap<&str, (u32, &str)> = BTreeMap::new();
        for line in log.lines() {
            if let Some(second) = line.get(6..14) {
                let entry = per_second.entry(second).or_insert((0, line));
                entry.0 += 1;
            }
        }
        if let Some((second, (n, first))) = per_second.iter().max_by_key(|(_, (n, _))| *n) {
            if *n > 1000 {
                f.violation(
                    "I6",
                    format!(
                        "{name}: {n} lines in the second {second} (a hot loop); first: {}",
                        first.get(..200).unwrap_or(first)
                    ),
                );
            }
        }
    }
    let mut explained = 0;
    for exit in &h.exits {
        let by_us = exit.sent.is_some() && exit.signal == exit.sent;
        // An exit 1 needs its reason logged and a fault that causes it then.
        let why = match exit.code {
            Some(0) => None,
            Some(1) if exit.sent.is_some() => None,
            Some(1) => match exit_reason(h, exit.replica, exit.at) {
                None => Some("no reason logged".to_string()),
                Some(line) => {
                    let cause = EXIT1_REASONS
                        .iter()
                        .find(|(reason, _, _)| line.contains(reason));
                    let fault = cause.and_then(|(_, kinds, after)| {
                        h.windows.iter().find(|w| {
                            kinds.contains(&w.kind.as_str())
                                && exit.at >= w.start - SECOND
                                && exit.at <= w.end + after
                        })
                    });
                    match fault {
                        Some(_) => None,
                        None => Some(format!(
                            "no fault explains its reason: {}",
                            line.get(..200).unwrap_or(line)
                        )),
                    }
                }
            },
            _ if by_us => None,
            _ => Some("not a signal the suite sent".to_string()),
        };
        match why {
            None if exit.code == Some(1) => explained += 1,
            None => {}
            Some(why) => f.violation(
                "I6",
                format!(
                    "replica-{} ended with code {:?} signal {:?} at {} (signal sent by the suite: {:?}): {why}",
                    exit.replica,
                    exit.code,
                    exit.signal,
                    secs(exit.at),
                    exit.sent,
                ),
            ),
        }
    }
    f.measured
        .push(("exits 1 explained by a fault".into(), explained.to_string()));
    // Request rate of standbys during outages (429s, rejections, stops, Lease faults): per second.
    let terms = terms(&h.audit, &h.lease);
    let mut peak = 0;
    for window in h.windows.iter().filter(|w| {
        matches!(
            w.kind.as_str(),
            "apf-429"
                | "write-rejection-vap"
                | "apiserver-sigstop"
                | "etcd-stall"
                | "lease-stolen"
                | "lease-deleted"
        )
    }) {
        for r in 0..h.replicas {
            let identity = format!("replica-{r}");
            let user = format!("chaos-{identity}");
            // Leading at any time the count covers (the window and the second
            // after it): a replica that takes the Lease as the outage ends does
            // the work that waited, and is no standby.
            let leading = terms.iter().any(|t| {
                t.identity == identity
                    && t.acquired < window.end + SECOND
                    && t.until() > window.start
            });
            if leading {
                continue;
            }
            let mut buckets: BTreeMap<i128, u32> = BTreeMap::new();
            for e in h
                .audit
                .iter()
                .filter(|e| e["user"]["username"] == user.as_str())
            {
                let at = received(e);
                if at >= window.start && at <= window.end + SECOND {
                    *buckets.entry(at / SECOND).or_default() += 1;
                }
            }
            if let Some((second, n)) = buckets.iter().max_by_key(|b| *b.1) {
                peak = peak.max(*n);
                if *n > STANDBY_REQUESTS_PER_SECOND {
                    f.violation(
                        "I6",
                        format!(
                            "standby {identity} made {n} API requests in the second {} during {} (bound {STANDBY_REQUESTS_PER_SECOND})",
                            secs(second * SECOND),
                            window.kind
                        ),
                    );
                }
            }
        }
    }
    f.measured.push((
        "standby peak API requests in one second during outages".into(),
        format!("{peak} (bound {STANDBY_REQUESTS_PER_SECOND})"),
    ));
}

pub fn i7(h: &History, f: &mut Findings) {
    for (name, log) in h.logs.iter().chain(h.metrics.iter()) {
        if let Some(line) = log.lines().find(|l| l.contains(&h.canary)) {
            f.violation("I7", format!("canary in {name}: {line}"));
        }
    }
    if h.events_text.contains(&h.canary) {
        f.violation("I7", "canary in an Event".into());
    }
    for va in &h.live_vas {
        if va["status"].to_string().contains(&h.canary) {
            f.violation(
                "I7",
                format!("canary in the status of VA {}", va["metadata"]["name"]),
            );
        }
    }
}

/// I8: leadership terms do not interleave: every driver call of a term has
/// ended (for its caller) before the first call of any later term starts, and
/// no call of a term starts after a later term's first call. Calls outside
/// every term are I4's.
pub fn i8(h: &History, f: &mut Findings) {
    let terms = terms(&h.audit, &h.lease);
    let mut calls: Vec<(usize, &Call)> = h
        .calls
        .iter()
        .filter_map(|c| {
            let identity = format!("replica-{}", c.caller);
            terms
                .iter()
                .position(|t| t.identity == identity && t.holds(c))
                .map(|e| (e, c))
        })
        .collect();
    calls.sort_by_key(|(_, c)| c.start);
    let mut latest: Option<(usize, &Call)> = None;
    let mut ends: BTreeMap<usize, &Call> = BTreeMap::new();
    let mut found = 0;
    for (term, call) in calls {
        let mut bad = Vec::new();
        if let Some((later, first)) = latest.filter(|(e, _)| *e > term) {
            bad.push(format!(
                "starts after term {later}'s call {} {} (replica-{}) started at {}",
                first.method,
                first.volume,
                first.caller,
                secs(first.start)
            ));
        }
        if let Some((earlier, other)) = ends
            .range(..term)
            .find(|(_, o)| o.caller_end() > call.start)
        {
            bad.push(format!(
                "starts while term {earlier}'s call {} {} (replica-{}, until {}) still runs",
                other.method,
                other.volume,
                other.caller,
                secs(other.caller_end())
            ));
        }
        if !bad.is_empty() {
            found += 1;
            if found <= 20 {
                f.violation(
                    "I8",
                    format!(
                        "term {term} ({}): {} {} at {} {}",
                        terms[term].identity,
                        call.method,
                        call.volume,
                        secs(call.start),
                        bad.join("; ")
                    ),
                );
            }
        }
        if latest.is_none_or(|(e, _)| term > e) {
            latest = Some((term, call));
        }
        if ends
            .get(&term)
            .is_none_or(|o| o.caller_end() < call.caller_end())
        {
            ends.insert(term, call);
        }
    }
    if found > 20 {
        f.violation(
            "I8",
            format!("{found} interleaved calls in all (first 20 shown)"),
        );
    }
}

/// The `attached=true` status writes replicas made, each with the instance
/// it was for (`None`: a VA the workload does not know) and when the API
/// server received it.
fn attached_writes(h: &History) -> impl Iterator<Item = (&Value, Option<&Instance>, i128)> {
    h.audit
        .iter()
        .filter(|e| {
            e["objectRef"]["resource"] == "volumeattachments"
                && e["objectRef"]["subresource"] == "status"
                && e["user"]["username"]
                    .as_str()
                    .is_some_and(|u| u.starts_with("chaos-replica-"))
                && ok(e)
                && e["requestObject"]["status"]["attached"] == true
        })
        .map(|e| {
            let name = e["objectRef"]["name"].as_str().unwrap_or_default();
            let uid = e["responseObject"]["metadata"]["uid"]
                .as_str()
                .unwrap_or_default();
            let inst = h.instances.iter().find(|i| i.name == name && i.uid == uid);
            (e, inst, received(e))
        })
}

/// An OK Publish of `inst`'s volume to a node ID of its node.
fn to_its_node(inst: &Instance) -> impl Fn(&&Call) -> bool + '_ {
    move |c| {
        c.volume == inst.handle
            && c.code == "OK"
            && node_of_id(&c.node).as_deref() == Some(inst.node.as_str())
    }
}

/// The last OK Publish of `inst`'s volume to its node that ended by `at`.
fn published_before<'a>(h: &'a History, inst: &Instance, at: i128) -> Option<&'a Call> {
    h.calls
        .iter()
        .filter(to_its_node(inst))
        .filter(|c| c.method == "ControllerPublishVolume" && c.end <= at)
        .max_by_key(|c| c.end)
}

/// I9: a replica writes `attached=true` only after an OK Publish of the VA's
/// volume to (a node ID of) its node ended, with no OK Unpublish of it since.
pub fn i9(h: &History, f: &mut Findings) {
    let mut unknown = 0;
    for (e, inst, at) in attached_writes(h) {
        let Some(inst) = inst else {
            unknown += 1;
            continue;
        };
        let published = published_before(h, inst, at);
        let undone = published.and_then(|p| {
            h.calls.iter().filter(to_its_node(inst)).find(|c| {
                c.method == "ControllerUnpublishVolume"
                    && c.node == p.node
                    && c.start >= p.end
                    && c.end <= at
            })
        });
        let problem = match (published, undone) {
            (None, _) => "no OK Publish of its volume to its node ended before".to_string(),
            (Some(p), Some(u)) => format!(
                "the Publish that ended {} was undone by an Unpublish that ended {}",
                secs(p.end),
                secs(u.end)
            ),
            (Some(_), None) => continue,
        };
        f.violation(
            "I9",
            format!(
                "{} wrote attached=true on VA {} (volume {}, node {}) at {}: {problem}",
                e["user"]["username"].as_str().unwrap_or_default(),
                inst.name,
                inst.handle,
                inst.node,
                secs(at)
            ),
        );
    }
    if unknown > 0 {
        f.skipped.push((
            "I9".into(),
            format!("{unknown} attached=true writes on VAs the workload does not know"),
        ));
    }
}

/// I12: no driver call unpublishes a (volume, node ID) that a live,
/// attached VA holds: from a replica's `attached=true` write on a VA until
/// the suite asks to delete it, no Unpublish that reached the driver starts
/// for the node ID of the OK Publish it was attached through, until its node
/// re-registered with another ID (a `csinode-reregistered` fault: the VA is
/// where the new ID is, and its own re-publish unpublishes the old one
/// before it publishes the new) or a later OK Publish moved it.
pub fn i12(h: &History, f: &mut Findings) {
    for (_, inst, at) in attached_writes(h) {
        let Some(held) = inst.and_then(|inst| Some((inst, published_before(h, inst, at)?))) else {
            continue; // I9's
        };
        let (inst, held) = held;
        let moved = h
            .calls
            .iter()
            .filter(to_its_node(inst))
            .filter(|c| c.method == "ControllerPublishVolume" && c.node != held.node && c.end > at)
            .map(|c| c.end)
            .min();
        let reregistered = format!("{} re-registered as ", inst.node);
        let reregistered = h
            .windows
            .iter()
            .filter(|w| !w.skipped && w.note.starts_with(&reregistered) && w.start > at)
            .map(|w| w.start)
            .min();
        let until = [inst.deleted, moved, reregistered]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(i128::MAX);
        for c in h.calls.iter().filter(|c| {
            c.method == "ControllerUnpublishVolume"
                && c.volume == inst.handle
                && c.node == held.node
                && at < c.start
                && c.start < until
        }) {
            f.violation(
                "I12",
                format!(
                    "replica-{} unpublished volume {} from {} at {} ({}), where VA {} (attached at {}) holds it",
                    c.caller,
                    c.volume,
                    c.node,
                    secs(c.start),
                    c.code,
                    inst.name,
                    secs(at)
                ),
            );
        }
    }
}

/// A VA whose finalizer the suite stripped on purpose (a
/// `finalizer-stripped-*` fault), as its note names it.
#[derive(Debug, Clone)]
pub struct Stripped {
    /// The fault's index in the run.
    pub fault: usize,
    pub name: String,
    pub uid: String,
    pub volume: String,
    pub node: String,
    /// Its Node lists the volume in `status.volumesInUse` from the fault's start on.
    pub in_use: bool,
    /// Stripped and removed at once (no detach).
    pub removed: bool,
    pub start: i128,
    pub end: i128,
}

/// Parses a `finalizer-stripped-*` fault's note: `stripped VA <name>
/// uid=<uid> volume=<handle> node=<node> in-use=<yes|no> removed-at-once=<yes|no> ...`.
pub fn parse_stripped(fault: usize, w: &Window) -> Option<Stripped> {
    if !w.kind.starts_with("finalizer-stripped") {
        return None;
    }
    let rest = w.note.strip_prefix("stripped VA ")?;
    let mut words = rest.split_whitespace();
    let name = words.next()?.to_string();
    let field = |key: &str| {
        rest.split_whitespace()
            .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
            .map(|v| v.trim_end_matches(';').to_string())
    };
    Some(Stripped {
        fault,
        name,
        uid: field("uid")?,
        volume: field("volume")?,
        node: field("node")?,
        in_use: field("in-use")? == "yes",
        removed: field("removed-at-once")? == "yes",
        start: w.start,
        end: w.end,
    })
}

/// Every VA the suite stripped of our finalizer: a fault whose strip took,
/// counted as injected or not (a VA the strip removed while the workload's
/// delete came first: the fault's own delete found nothing; one whose delete
/// was refused, then deleted by the workload: gone without a detach all the
/// same). A strip that did not take says "could not strip VA".
pub fn stripped(h: &History) -> Vec<Stripped> {
    h.windows
        .iter()
        .enumerate()
        .filter_map(|(i, w)| parse_stripped(i, w))
        .collect()
}

/// A time span, [from, to).
type Span = (i128, i128);

/// When the ledger has each (volume, node ID) published: from an OK
/// Publish's end to the OK Unpublish's end (completion order per driver
/// process, as [`replay`]), or to the start of a `driver-restart-empty`.
pub fn published_spans(h: &History) -> BTreeMap<(String, String), Vec<Span>> {
    let mut restarts: Vec<&Window> = h
        .windows
        .iter()
        .filter(|w| w.kind.starts_with("driver-restart") && !w.skipped)
        .collect();
    restarts.sort_by_key(|w| w.start);
    let mut calls: Vec<&Call> = h.calls.iter().filter(|c| c.code == "OK").collect();
    calls.sort_by_key(|c| (c.incarnation, c.end));
    let mut open: BTreeMap<(String, String), i128> = BTreeMap::new();
    let mut out: BTreeMap<(String, String), Vec<Span>> = BTreeMap::new();
    let close_all = |open: &mut BTreeMap<(String, String), i128>,
                     out: &mut BTreeMap<(String, String), Vec<Span>>,
                     at: i128| {
        for (pair, from) in std::mem::take(open) {
            out.entry(pair).or_default().push((from, at));
        }
    };
    let mut incarnation = 0;
    for c in calls {
        while incarnation < c.incarnation {
            incarnation += 1;
            if let Some(w) = restarts
                .get(incarnation as usize - 1)
                .filter(|w| w.kind == "driver-restart-empty")
            {
                close_all(&mut open, &mut out, w.start);
            }
        }
        let key = (c.volume.clone(), c.node.clone());
        match c.method.as_str() {
            "ControllerPublishVolume" => {
                open.entry(key).or_insert(c.end);
            }
            "ControllerUnpublishVolume" => {
                if let Some(from) = open.remove(&key) {
                    out.entry(key).or_default().push((from, c.end));
                }
            }
            _ => {}
        }
    }
    let last = h.calls.iter().map(|c| c.incarnation).max().unwrap_or(0);
    if let Some(w) = restarts
        .iter()
        .skip(last as usize)
        .find(|w| w.kind == "driver-restart-empty")
    {
        close_all(&mut open, &mut out, w.start);
    }
    close_all(&mut open, &mut out, i128::MAX);
    out
}

/// When VA `inst` left the API server: the first answer showing it removed
/// (a delete answered without a deletionTimestamp, or a write answered
/// deleting with no finalizer left). `None`: not seen (live, or the event lost).
fn removed_at(writes: &BTreeMap<&str, Vec<&Value>>, inst: &Instance) -> Option<i128> {
    writes
        .get(inst.name.as_str())
        .into_iter()
        .flatten()
        .filter(|e| {
            e["objectRef"]["subresource"].is_null()
                && ok(e)
                && e["responseObject"]["metadata"]["uid"] == inst.uid.as_str()
        })
        .copied()
        .filter(|e| {
            let meta = &e["responseObject"]["metadata"];
            let deleting = meta["deletionTimestamp"].is_string();
            let finalizers = meta["finalizers"].as_array().map_or(0, Vec::len);
            (e["verb"] == "delete" && !deleting) || (deleting && finalizers == 0)
        })
        .map(received)
        .min()
}

/// When a VA of the driver could name each (volume, node): from its
/// creation to its removal (forever when the removal is not seen), by the
/// node it is for and, while a `node-id-edited` fault had edited it, the
/// node of the edited ID. A superset of what the attacher counts as claimed
/// (its VAs by CSINode and recorded node ID), so I13 never asks for a report
/// of a pair the attacher may rightly see as claimed.
fn claims(h: &History) -> BTreeMap<(String, String), Vec<Span>> {
    let mut out: BTreeMap<(String, String), Vec<Span>> = BTreeMap::new();
    let mut writes: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for e in h
        .audit
        .iter()
        .filter(|e| e["objectRef"]["resource"] == "volumeattachments")
    {
        if let Some(name) = e["objectRef"]["name"].as_str() {
            writes.entry(name).or_default().push(e);
        }
    }
    let mut gone = BTreeMap::new();
    for inst in &h.instances {
        let until = removed_at(&writes, inst).unwrap_or(i128::MAX);
        gone.insert((inst.name.as_str(), inst.uid.as_str()), until);
        out.entry((inst.handle.clone(), inst.node.clone()))
            .or_default()
            .push((inst.created, until));
    }
    for va in &h.live_vas {
        let name = va["metadata"]["name"].as_str().unwrap_or_default();
        let uid = va["metadata"]["uid"].as_str().unwrap_or_default();
        if gone.contains_key(&(name, uid)) {
            continue;
        }
        if let Some(pair) = volume_and_node(h, va) {
            out.entry(pair).or_default().push((i128::MIN, i128::MAX));
        }
    }
    for w in h.windows.iter().filter(|w| w.kind == "node-id-edited") {
        let Some(rest) = w.note.strip_prefix("edited VA ") else {
            continue;
        };
        let name = rest.split('\'').next().unwrap_or_default();
        let Some(edited) = rest
            .split_once(" to ")
            .and_then(|(_, r)| r.split(',').next())
            .and_then(node_of_id)
        else {
            continue;
        };
        for inst in h.instances.iter().filter(|i| {
            i.name == name
                && i.created <= w.end
                && gone[&(i.name.as_str(), i.uid.as_str())] > w.start
        }) {
            let until = if w.note.contains("deleted during the hold") {
                gone[&(inst.name.as_str(), inst.uid.as_str())]
            } else {
                w.end
            };
            out.entry((inst.handle.clone(), edited.clone()))
                .or_default()
                .push((w.start, until.max(w.end)));
        }
    }
    out
}

/// A (volume, node ID) the driver had published while no VA could claim it.
#[derive(Debug, Clone)]
pub struct OrphanSpan {
    pub volume: String,
    pub node_id: String,
    pub from: i128,
    pub to: i128,
}

/// Every span in which the ledger has a pair published and no VA claims it.
pub fn orphan_spans(h: &History) -> Vec<OrphanSpan> {
    let claims = claims(h);
    let mut out = Vec::new();
    for ((volume, node_id), spans) in published_spans(h) {
        let node = node_of_id(&node_id).unwrap_or_default();
        let mut claimed: Vec<Span> = claims
            .get(&(volume.clone(), node))
            .cloned()
            .unwrap_or_default();
        claimed.sort();
        for (from, to) in spans {
            // [from, to) minus the claimed spans.
            let mut at = from;
            for &(c_from, c_to) in &claimed {
                if c_to <= at || c_from >= to {
                    continue;
                }
                if c_from > at {
                    out.push(OrphanSpan {
                        volume: volume.clone(),
                        node_id: node_id.clone(),
                        from: at,
                        to: c_from,
                    });
                }
                at = at.max(c_to);
            }
            if at < to {
                out.push(OrphanSpan {
                    volume: volume.clone(),
                    node_id: node_id.clone(),
                    from: at,
                    to,
                });
            }
        }
    }
    out
}

/// The attacher's orphan warning (`src/controller/reconcile/orphans.rs`).
pub const ORPHAN_SAID: &str = "Volume published to a node with no VolumeAttachment";

/// Reconcile passes a pair stays unclaimed before the attacher reports it
/// (its grace, `GRACE_PASSES`, is two passes after the one that first sees it).
pub const ORPHAN_PASSES: usize = 3;

/// The reconcile passes of each replica process: its OK ListVolumes calls
/// (one per pass: the attacher lists without a page limit), each with its
/// start, in order; a pass the replica logged as failed
/// (`Failed to reconcile`) does not count, as the attacher does not count it.
fn passes(h: &History) -> BTreeMap<(usize, usize), Vec<i128>> {
    let mut lists: Vec<&Call> = h
        .calls
        .iter()
        .filter(|c| c.method == "ListVolumes" && c.code == "OK")
        .collect();
    lists.sort_by_key(|c| c.start);
    let mut out: BTreeMap<(usize, usize), Vec<i128>> = BTreeMap::new();
    for c in &lists {
        // Which process of its replica: one more after each exit.
        let generation = h
            .exits
            .iter()
            .filter(|x| x.replica == c.caller && x.at < c.start)
            .count();
        out.entry((c.caller, generation)).or_default().push(c.start);
    }
    for ((replica, _), starts) in out.iter_mut() {
        let name = format!("replica-{replica} log");
        let failed: Vec<i128> = h
            .logs
            .iter()
            .filter(|(n, _)| *n == name)
            .flat_map(|(_, log)| log.lines())
            .filter(|l| l.contains("Failed to reconcile"))
            .filter_map(|l| klog_time(l, starts[0]))
            .collect();
        let all = starts.clone();
        starts.retain(|start| {
            let next = all
                .iter()
                .find(|s| *s > start)
                .copied()
                .unwrap_or(i128::MAX);
            !failed.iter().any(|t| start <= t && *t < next)
        });
    }
    out
}

/// When a replica said `volume` on `node_id` was an orphan, in [from, to].
fn orphan_said(
    h: &History,
    volume: &str,
    node_id: &str,
    from: i128,
    to: i128,
) -> Option<(String, i128)> {
    let volume_field = format!("volume=\"{volume}\"");
    h.logs
        .iter()
        .filter(|(n, _)| n.starts_with("replica-"))
        .flat_map(|(n, log)| log.lines().map(move |l| (n, l)))
        .filter(|(_, l)| {
            l.contains(ORPHAN_SAID) && l.contains(&volume_field) && l.contains(node_id)
        })
        .filter_map(|(n, l)| Some((n.clone(), klog_time(l, from)?)))
        .filter(|(_, t)| from <= *t && *t <= to)
        .min_by_key(|(_, t)| *t)
}

/// I13: every orphan publication (a pair the ledger has published while no
/// VA could claim it) that lasts through [`ORPHAN_PASSES`] reconcile passes
/// of one replica process is reported (its warning line) before that
/// process's next pass: within three reconcile periods, counted in passes,
/// not in wall-clock time. A new leader, or a restarted one, starts counting
/// again (the attacher keeps the count in memory).
pub fn i13(h: &History, f: &mut Findings) {
    let passes = passes(h);
    let (mut due, mut reported) = (0, 0);
    for o in orphan_spans(h) {
        // The process that saw it through its passes first.
        let seen = passes
            .iter()
            .filter_map(|(process, starts)| {
                let within: Vec<i128> = starts
                    .iter()
                    .copied()
                    .filter(|s| o.from <= *s && *s < o.to)
                    .collect();
                let third = *within.get(ORPHAN_PASSES - 1)?;
                let next = starts.iter().copied().find(|s| *s > third);
                let exit = h
                    .exits
                    .iter()
                    .filter(|x| x.replica == process.0 && x.at > third)
                    .map(|x| x.at)
                    .min();
                let by = [next, exit]
                    .into_iter()
                    .flatten()
                    .min()
                    .unwrap_or(i128::MAX);
                Some((third, by, process.0, within))
            })
            .min_by_key(|(third, ..)| *third);
        let Some((third, by, replica, within)) = seen else {
            continue; // not due: no process saw it through its grace
        };
        due += 1;
        match orphan_said(h, &o.volume, &o.node_id, o.from, by) {
            Some(_) => reported += 1,
            None => f.violation(
                "I13",
                format!(
                    "orphan ({}, {}) since {} (until {}) not reported by replica-{} by {}: its passes from then started at {}; the third at {}",
                    o.volume,
                    o.node_id,
                    secs(o.from),
                    if o.to == i128::MAX { "the end".into() } else { secs(o.to) },
                    replica,
                    if by == i128::MAX { "the end".into() } else { secs(by) },
                    within.iter().take(4).map(|t| secs(*t)).collect::<Vec<_>>().join(", "),
                    secs(third),
                ),
            ),
        }
    }
    f.measured.push((
        "orphan publications due a report (I13) / reported in time".into(),
        format!("{due} / {reported}"),
    ));
}

/// I14: no Unpublish reaches the driver for an orphan (a pair no VA
/// claims) whose Node lists its volume in `status.volumesInUse` (only the
/// suite's orphan faults set it, from their start to the end of the run):
/// `--unpublish-orphans` must leave a volume a kubelet uses alone.
pub fn i14(h: &History, f: &mut Findings) {
    let stripped = stripped(h);
    let spans = orphan_spans(h);
    for c in h
        .calls
        .iter()
        .filter(|c| c.method == "ControllerUnpublishVolume")
    {
        let in_use = stripped.iter().find(|s| {
            s.in_use
                && s.volume == c.volume
                && node_of_id(&c.node).as_deref() == Some(s.node.as_str())
                && s.start <= c.start
        });
        let Some(s) = in_use else { continue };
        let orphan = spans.iter().any(|o| {
            o.volume == c.volume && o.node_id == c.node && o.from <= c.start && c.start < o.to
        });
        if orphan {
            f.violation(
                "I14",
                format!(
                    "replica-{} unpublished orphan ({}, {}) at {} ({}), while Node {} lists it in status.volumesInUse (fault #{})",
                    c.caller, c.volume, c.node, secs(c.start), c.code, s.node, s.fault
                ),
            );
        }
    }
}

/// The driver's published table after replaying the ledger: OK Publish and
/// Unpublish in completion order, restarts that dropped the state (the
/// `driver-restart-empty` faults, in order, are the incarnations that start
/// empty).
pub fn replay(h: &History) -> BTreeSet<(String, String)> {
    let mut restarts: Vec<&Window> = h
        .windows
        .iter()
        .filter(|w| w.kind.starts_with("driver-restart") && !w.skipped)
        .collect();
    restarts.sort_by_key(|w| w.start);
    let mut calls: Vec<&Call> = h.calls.iter().filter(|c| c.code == "OK").collect();
    calls.sort_by_key(|c| (c.incarnation, c.end));
    let mut state = BTreeSet::new();
    let mut incarnation = 0;
    for c in calls {
        while incarnation < c.incarnation {
            incarnation += 1;
            let empty = restarts
                .get(incarnation as usize - 1)
                .is_some_and(|w| w.kind == "driver-restart-empty");
            if empty {
                state.clear();
            }
        }
        let key = (c.volume.clone(), c.node.clone());
        match c.method.as_str() {
            "ControllerPublishVolume" => {
                state.insert(key);
            }
            "ControllerUnpublishVolume" => {
                state.remove(&key);
            }
            _ => {}
        }
    }
    let last = h.calls.iter().map(|c| c.incarnation).max().unwrap_or(0);
    for w in restarts.iter().skip(last as usize) {
        if w.kind == "driver-restart-empty" {
            state.clear();
        }
    }
    state
}

/// The driver's published table as (volume, node ID) pairs.
pub fn published(h: &History) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (volume, nodes) in h.published.as_object().into_iter().flatten() {
        for node in nodes.as_array().into_iter().flatten() {
            out.insert((
                volume.clone(),
                node.as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    out
}

/// I10: the ledger's replay equals the driver's final state.
pub fn i10(h: &History, f: &mut Findings) {
    let replayed = replay(h);
    let actual = published(h);
    for extra in actual.difference(&replayed) {
        f.violation(
            "I10",
            format!("driver has {extra:?} published; the ledger's replay does not"),
        );
    }
    for missing in replayed.difference(&actual) {
        f.violation(
            "I10",
            format!("the ledger's replay has {missing:?} published; the driver does not"),
        );
    }
}

/// How soon a replica must notice that its connections are dead.
pub const HALF_OPEN_NOTICED: i128 = 60 * SECOND;

/// Whether a `watch-half-open` fault found none of the replica's connections
/// open (its note counts the connections that vanished).
fn no_connection_vanished(note: &str) -> bool {
    note.contains("(0 of them)")
}

/// I11: a replica whose connections vanished without a FIN or RST (the
/// `watch-half-open` fault) notices within [`HALF_OPEN_NOTICED`]: its log says
/// a watch failed, or its process exits (leadership lost on a dead Lease
/// connection: the watches' connections go with it). TCP keepalive on API-server connections is what notices;
/// a watch's own silence bound (90 s) would be too late.
pub fn i11(h: &History, f: &mut Findings) {
    for w in h.windows.iter().filter(|w| w.kind == "watch-half-open") {
        if no_connection_vanished(&w.note) {
            // Nothing to notice (skipped by `evidence`).
            continue;
        }
        let Some(replica) = target(&w.note) else {
            f.skipped
                .push(("I11".into(), format!("no replica named in {:?}", w.note)));
            continue;
        };
        let name = format!("replica-{replica}");
        let log_name = format!("{name} log");
        let within = |t: &i128| *t >= w.start && *t <= w.start + HALF_OPEN_NOTICED;
        let watch_failed = h
            .logs
            .iter()
            .filter(|(n, _)| *n == log_name)
            .flat_map(|(_, log)| log.lines())
            .filter(|l| l.contains("watch failed"))
            .filter_map(|l| klog_time(l, w.start))
            .filter(within)
            .min();
        // A process that exits (its Lease renewal failed on a dead
        // connection first: leadership lost) leaves no dead connection
        // behind either; its successor's are new.
        let exited = h
            .exits
            .iter()
            .filter(|x| x.replica == replica)
            .map(|x| x.at)
            .filter(within)
            .min();
        let noticed = match (watch_failed, exited) {
            (Some(t), Some(x)) if x < t => Some((x, "its process exited")),
            (Some(t), _) => Some((t, "a watch failed")),
            (None, Some(x)) => Some((x, "its process exited")),
            (None, None) => None,
        };
        if let Some((t, how)) = noticed {
            f.measured.push((
                format!("{name}: half-open connections noticed after"),
                format!("{:.1} s ({how})", (t - w.start) as f64 / SECOND as f64),
            ));
        } else {
            f.violation(
                "I11",
                format!(
                    "{name}'s connections vanished at {} and within {} s no watch of it failed nor did it exit",
                    format_time(w.start),
                    HALF_OPEN_NOTICED / SECOND
                ),
            );
        }
    }
}

/// A klog line's time (`W1127 08:54:28.123456 ...`; the attacher stamps klog headers in UTC,
/// `src/logging.rs`), in the year of `reference`.
pub fn klog_time(line: &str, reference: i128) -> Option<i128> {
    let (mmdd, hms) = (line.get(1..5)?, line.get(6..21)?);
    let year = format_time(reference).get(..4)?.to_string();
    parse_time(&format!(
        "{year}-{}-{}T{hms}Z",
        mmdd.get(..2)?,
        mmdd.get(2..)?
    ))
}

/// The count a proxy fault's note gives for `what` (`(12 delayed)`), else 0.
fn counted(note: &str, what: &str) -> usize {
    let Some(end) = note.rfind(&format!(" {what})")) else {
        return 0;
    };
    let start = note[..end].rfind('(').map_or(0, |p| p + 1);
    note[start..end].parse().unwrap_or(0)
}

/// The replica named in a fault's note (`replica-N ...`, `SIGKILL replica-N ...`).
fn target(note: &str) -> Option<usize> {
    let rest = &note[note.find("replica-")? + "replica-".len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Most faults skipped (at injection or for want of evidence) before a run fails.
pub const MAX_SKIPPED_PERCENT: usize = 5;

/// What shows that the fault `w` took effect (`Ok`), or why nothing does (`Err`).
pub fn fault_evidence(
    h: &History,
    terms: &[Term],
    orphans: &[OrphanSpan],
    w: &Window,
) -> Result<String, String> {
    let replica_events = |from: i128, to: i128| {
        h.audit.iter().filter(move |e| {
            e["user"]["username"]
                .as_str()
                .is_some_and(|u| u.starts_with("chaos-replica-"))
                && (from..=to).contains(&received(e))
        })
    };
    let calls_in = |from: i128, to: i128| {
        h.calls
            .iter()
            .filter(move |c| c.method != "ListVolumes" && (from..=to).contains(&c.start))
    };
    let note = w.note.as_str();
    let need = |cond: bool, why: &str| if cond { Ok(()) } else { Err(why.to_string()) };
    let leading = |r: usize| {
        let identity = format!("replica-{r}");
        let lead = terms
            .iter()
            .any(|t| t.identity == identity && t.acquired <= w.start && w.start <= t.until());
        need(lead, &format!("replica-{r} was not leading when it began"))
    };
    match w.kind.as_str() {
        "apiserver-sigkill" | "driver-restart" | "driver-restart-empty" => {
            need(note.contains("Ok(())"), "the restart failed")?;
            Ok("restarted".into())
        }
        "watch-expiry-410" => {
            need(
                note.contains("compacted at Ok(") && note.contains("restarted: Ok(())"),
                "compaction or restart failed",
            )?;
            // A watch that resumes from a compacted revision gets its 410 as an
            // ERROR event inside a 200 stream: the audit log never shows it,
            // the replica's log does ("watch failed; retrying").
            let seen = h
                .logs
                .iter()
                .filter(|(n, _)| n.starts_with("replica-"))
                .flat_map(|(n, log)| log.lines().map(move |l| (n, l)))
                .find(|(_, l)| {
                    l.contains("watch failed")
                        && (l.contains("410") || l.contains("too old") || l.contains("Expired"))
                        && klog_time(l, w.start)
                            .is_some_and(|t| t >= w.start && t <= w.end + 15 * SECOND)
                });
            match seen {
                Some((name, line)) => Ok(format!("{name}: {}", line.get(..160).unwrap_or(line))),
                None => Err("no replica logged a 410 (expired watch) after it".into()),
            }
        }
        "apf-429" => {
            need(
                note.contains("create None"),
                "the FlowSchema was not created",
            )?;
            let n = replica_events(w.start, w.end + SECOND)
                .filter(|e| e["responseStatus"]["code"] == 429)
                .count();
            need(n > 0, "no 429 answered to a replica during it")?;
            Ok(format!("{n} × 429"))
        }
        "write-rejection-vap" => {
            need(note.contains("create None"), "the binding was not created")?;
            let n = replica_events(w.start, w.end + SECOND)
                .filter(|e| matches!(e["responseStatus"]["code"].as_i64(), Some(422 | 403)))
                .count();
            need(n > 0, "no write of a replica rejected during it")?;
            Ok(format!("{n} writes rejected"))
        }
        "apiserver-sigstop" => {
            // Stopped, the API server receives nothing: a silence in the
            // audit log inside the window, and requests again after it.
            let mut times: Vec<i128> = h
                .audit
                .iter()
                .map(received)
                .filter(|t| (w.start..=w.end + 5 * SECOND).contains(t))
                .collect();
            times.sort();
            let after = times.iter().find(|t| **t >= w.end - SECOND / 10).copied();
            let silent_from = times
                .iter()
                .rfind(|t| **t < w.end - SECOND / 10)
                .copied()
                .unwrap_or(w.start);
            let stopped = w.end - w.start;
            let silence = after.map_or(0, |a| a - silent_from);
            need(
                after.is_some() && silence * 10 >= stopped * 8,
                "no silence in the audit log as long as the stop",
            )?;
            Ok(format!(
                "no request received for {} ms of the {} ms stop",
                silence / 1_000_000,
                stopped / 1_000_000
            ))
        }
        "etcd-stall" => {
            // A request received while etcd was stopped and answered only
            // once it ran again.
            let waited = h
                .audit
                .iter()
                .filter(|e| (w.start..w.end).contains(&received(e)))
                .filter_map(|e| {
                    let answered = e["stageTimestamp"].as_str().and_then(parse_time)?;
                    (answered >= w.end - SECOND / 5 && answered - received(e) >= SECOND / 2)
                        .then(|| answered - received(e))
                })
                .max();
            let waited = waited.ok_or("no request waited for etcd (audit log)")?;
            Ok(format!(
                "a request waited {} ms for etcd",
                waited / 1_000_000
            ))
        }
        "proxy-delay" => {
            let n = counted(note, "delayed");
            need(n > 0, "the proxies delayed no chunk")?;
            Ok(format!("{n} chunks delayed"))
        }
        "proxy-reset" => {
            let n = counted(note, "reset");
            need(n > 0, "the proxy reset or refused no connection")?;
            Ok(format!("{n} connections reset or refused"))
        }
        "lost-responses" => {
            let r = target(note).ok_or("no target")?;
            leading(r)?;
            let n = counted(note, "lost");
            need(n > 0, "no reply lost")?;
            Ok(format!("replica-{r}: {n} replies lost"))
        }
        "leader-partition" | "leader-sigstop-past-lease" => {
            let r = target(note).ok_or("no target")?;
            leading(r)?;
            if w.kind == "leader-partition" {
                need(counted(note, "held") > 0, "the proxy held nothing")?;
            }
            // Its leadership went: another replica took the Lease, or it
            // exited (Stopped leading) as it found its lease gone.
            let identity = format!("replica-{r}");
            let took = terms.iter().find(|t| {
                t.identity != identity && (w.start..=w.end + 2 * SECOND).contains(&t.acquired)
            });
            let exited = h
                .exits
                .iter()
                .find(|x| x.replica == r && (w.start..=w.end + 5 * SECOND).contains(&x.at));
            match (took, exited) {
                (Some(t), _) => Ok(format!(
                    "replica-{r} led; {} took the Lease at {}",
                    t.identity,
                    secs(t.acquired)
                )),
                (None, Some(x)) => Ok(format!("replica-{r} led and exited at {}", secs(x.at))),
                (None, None) => Err(format!(
                    "replica-{r} led, and neither lost the Lease nor exited"
                )),
            }
        }
        kind if kind.starts_with("finalizer-stripped") => {
            let i = h
                .windows
                .iter()
                .position(|x| std::ptr::eq(x, w))
                .unwrap_or(0);
            let s = parse_stripped(i, w).ok_or("no VA named")?;
            need(s.removed, "the VA was not removed at once")?;
            let orphan = orphans.iter().find(|o| {
                o.volume == s.volume
                    && node_of_id(&o.node_id).as_deref() == Some(s.node.as_str())
                    && (s.start..=s.end + SECOND).contains(&o.from)
            });
            let o =
                orphan.ok_or("no orphan publication made (the driver had no publication left)")?;
            Ok(format!(
                "orphan ({}, {}) from {}",
                o.volume,
                o.node_id,
                secs(o.from)
            ))
        }
        "kill-before-publish"
        | "kill-after-publish"
        | "kill-before-unpublish"
        | "kill-after-unpublish" => {
            let r = target(note).ok_or("no target")?;
            let killed = h.exits.iter().any(|x| {
                x.replica == r
                    && x.sent == Some(libc::SIGKILL)
                    && x.at >= w.start
                    && x.at <= w.end + 3 * SECOND
            });
            need(killed, &format!("no SIGKILL exit of replica-{r} recorded"))?;
            let method = if w.kind.ends_with("unpublish") {
                "ControllerUnpublishVolume"
            } else {
                "ControllerPublishVolume"
            };
            if w.kind.starts_with("kill-before") {
                // Aimed before the answer: the caller died with the call in flight.
                let call = h
                    .calls
                    .iter()
                    .filter(|c| c.caller == r && c.method == method)
                    .filter(|c| c.start >= w.start && c.start <= w.end)
                    .max_by_key(|c| c.start)
                    .ok_or("the call it was aimed at is not in the ledger")?;
                need(
                    call.abandoned.is_some(),
                    "the call was answered before the kill landed",
                )?;
                Ok(format!(
                    "{method} {} abandoned by its killed caller",
                    call.volume
                ))
            } else {
                // Aimed after the OK answer, before the status write.
                let call = h
                    .calls
                    .iter()
                    .filter(|c| c.caller == r && c.method == method && c.code == "OK")
                    .filter(|c| c.end >= w.start && c.end <= w.end)
                    .max_by_key(|c| c.end)
                    .ok_or("the call it was aimed at is not in the ledger")?;
                let names: BTreeSet<&str> = h
                    .instances
                    .iter()
                    .filter(|i| i.handle == call.volume)
                    .map(|i| i.name.as_str())
                    .collect();
                let user = format!("chaos-replica-{r}");
                let written = h.audit.iter().any(|e| {
                    e["user"]["username"] == user.as_str()
                        && e["objectRef"]["resource"] == "volumeattachments"
                        && e["objectRef"]["name"]
                            .as_str()
                            .is_some_and(|n| names.contains(n))
                        && (call.end..=w.end).contains(&received(e))
                        && ok(e)
                });
                need(!written, "the status write landed before the kill")?;
                Ok(format!(
                    "killed after {method} {} answered OK, before its write",
                    call.volume
                ))
            }
        }
        "sigterm-while-driver-hangs" => {
            let r = target(note).ok_or("no target")?;
            let hung = calls_in(w.start, w.end)
                .any(|c| c.caller == r && c.method == "ControllerPublishVolume");
            need(hung, "the hung Publish is not in the ledger")?;
            Ok(format!("replica-{r} got SIGTERM with a Publish hanging"))
        }
        "driver-failing" => {
            let code = note.split(' ').next().unwrap_or_default();
            let n = calls_in(w.start, w.end).filter(|c| c.code == code).count();
            need(n > 0, &format!("no call failed with {code} during it"))?;
            Ok(format!("{n} calls failed with {code}"))
        }
        "driver-slow" | "driver-hang" | "driver-late-publish" => {
            let method = if w.kind == "driver-late-publish" {
                Some("ControllerPublishVolume")
            } else {
                note.split(' ')
                    .next()
                    .filter(|m| m.starts_with("Controller"))
            };
            let n = calls_in(w.start, w.end)
                .filter(|c| method.is_none_or(|m| c.method == m))
                .count();
            need(n > 0, "no driver call during it")?;
            Ok(format!("{n} calls during it"))
        }
        "lease-deleted" => {
            need(note == "delete: None", "the delete failed")?;
            Ok("deleted".into())
        }
        "lease-stolen" => {
            need(note == "stolen: None", "the write failed")?;
            Ok("stolen".into())
        }
        "csinode-reregistered" => {
            need(note.ends_with(": None"), "the create failed")?;
            Ok("re-registered".into())
        }
        "node-id-edited" => {
            need(note.starts_with("edited VA "), "no VA edited")?;
            Ok(note.to_string())
        }
        "foreign-finalizers" => {
            need(!note.starts_with("0 "), "no foreign finalizer written")?;
            Ok(note.to_string())
        }
        "fd-limit-and-idle-flood" => {
            need(note.contains("(prlimit 0)"), "prlimit failed")?;
            Ok(note.to_string())
        }
        "watch-half-open" => {
            need(
                !no_connection_vanished(note),
                "no connection of the replica was open",
            )?;
            Ok(note.to_string())
        }
        other => Err(format!("no evidence known for {other}")),
    }
}

/// Each fault left its evidence or counts as skipped; more than
/// [`MAX_SKIPPED_PERCENT`] skipped fails the run. A flood that leaves
/// `/healthz` failing is a violation.
pub fn evidence(h: &History, f: &mut Findings) {
    let terms = terms(&h.audit, &h.lease);
    let orphans = orphan_spans(h);
    let mut skipped = 0;
    for (i, w) in h.windows.iter().enumerate() {
        if w.skipped {
            skipped += 1;
            f.skipped
                .push((w.kind.clone(), format!("#{i}: not injected: {}", w.note)));
            continue;
        }
        if let Err(why) = fault_evidence(h, &terms, &orphans, w) {
            skipped += 1;
            f.skipped
                .push((w.kind.clone(), format!("#{i}: no evidence: {why}")));
        }
        if w.kind == "fd-limit-and-idle-flood" && !w.note.contains("/healthz after: Some(200)") {
            f.violation(
                "E",
                format!(
                    "#{i}: /healthz not 200 after the descriptor flood: {}",
                    w.note
                ),
            );
        }
    }
    let total = h.windows.len();
    if skipped * 100 > total * MAX_SKIPPED_PERCENT {
        f.violation(
            "E",
            format!(
                "{skipped} of {total} faults skipped (not injected or no evidence), more than {MAX_SKIPPED_PERCENT} %"
            ),
        );
    }
}
