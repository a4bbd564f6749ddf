//! The invariants, checked after a run from the audit log, the driver's ledger
//! and state, the objects, metrics and logs.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::faults::Window;
use crate::workload::Instance;
use crate::world::{Call, Exit, FINALIZER, RENEW_DEADLINE};

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

/// A leadership term of one identity, from the Lease writes in the audit log.
#[derive(Debug, Clone)]
pub struct Term {
    pub identity: String,
    pub acquired: i128,
    pub last_renewal: i128,
}

impl Term {
    pub fn until(&self) -> i128 {
        self.last_renewal + RENEW_DEADLINE.as_nanos() as i128
    }
}

fn received(event: &Value) -> i128 {
    event["requestReceivedTimestamp"]
        .as_str()
        .and_then(parse_time)
        .unwrap_or_default()
}

/// Terms from every successful Lease write (create/update/patch/delete), in time order.
pub fn terms(audit: &[Value], lease: &str) -> Vec<Term> {
    let mut writes: Vec<(i128, Option<String>)> = audit
        .iter()
        .filter(|e| e["objectRef"]["resource"] == "leases" && e["objectRef"]["name"] == lease)
        .filter(|e| {
            matches!(
                e["verb"].as_str(),
                Some("create" | "update" | "patch" | "delete")
            )
        })
        .filter(|e| {
            e["responseStatus"]["code"]
                .as_i64()
                .is_some_and(|c| (200..300).contains(&c))
        })
        .map(|e| {
            let holder = if e["verb"] == "delete" {
                None
            } else {
                e["responseObject"]["spec"]["holderIdentity"]
                    .as_str()
                    .map(str::to_string)
            };
            (received(e), holder)
        })
        .collect();
    writes.sort_by_key(|w| w.0);
    let mut terms: Vec<Term> = Vec::new();
    let mut current: Option<Term> = None;
    for (at, holder) in writes {
        match (&mut current, holder) {
            (Some(term), Some(h)) if term.identity == h => term.last_renewal = at,
            (_, holder) => {
                if let Some(term) = current.take() {
                    terms.push(term);
                }
                current = holder.filter(|h| !h.is_empty()).map(|identity| Term {
                    identity,
                    acquired: at,
                    last_renewal: at,
                });
            }
        }
    }
    terms.extend(current);
    terms
}

pub struct Inputs<'a> {
    pub audit: &'a [Value],
    pub calls: &'a [Call],
    pub instances: &'a [Instance],
    pub live_vas: &'a [Value],
    pub pvs: &'a [Value],
    pub published: &'a Value,
    pub exits: &'a [Exit],
    pub logs: &'a [(String, String)],
    pub events_text: &'a str,
    pub metrics: &'a [(String, String)],
    pub canary: &'a str,
    pub windows: &'a [Window],
    pub replicas: usize,
    pub lease: &'a str,
    pub node_of_id: &'a dyn Fn(&str) -> Option<String>,
}

/// Every violation, as (invariant, evidence).
pub fn check(inp: &Inputs<'_>) -> Vec<(String, String)> {
    let mut v = Vec::new();
    i1(inp, &mut v);
    i2(inp, &mut v);
    i3(inp, &mut v);
    i4(inp, &mut v);
    i6(inp, &mut v);
    i7(inp, &mut v);
    v
}

fn has_ours(obj: &Value) -> bool {
    obj["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
}

fn i1(inp: &Inputs<'_>, v: &mut Vec<(String, String)>) {
    let live: BTreeSet<(&str, &str)> = inp
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
    for e in inp.audit {
        if e["objectRef"]["resource"] == "volumeattachments" {
            if let Some(name) = e["objectRef"]["name"].as_str() {
                va_writes.entry(name).or_default().push(e);
            }
        }
    }
    for inst in inp.instances {
        if inst.deleted.is_none() || live.contains(&(inst.name.as_str(), inst.uid.as_str())) {
            continue; // not deleted, or still deleting (I2's business)
        }
        let node_ok = |id: &str| (inp.node_of_id)(id).as_deref() == Some(inst.node.as_str());
        let publishes: Vec<&Call> = inp
            .calls
            .iter()
            .filter(|c| {
                c.method == "ControllerPublishVolume" && c.volume == inst.handle && node_ok(&c.node)
            })
            .collect();
        let Some(last) = publishes.iter().max_by_key(|c| c.end) else {
            continue; // never published: nothing to undo
        };
        let unpublish = inp
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
        // When our finalizer left: first write on this VA whose response lacks it.
        let removal = va_writes
            .get(inst.name.as_str())
            .into_iter()
            .flatten()
            .filter(|e| {
                e["responseObject"]["metadata"]["uid"] == inst.uid.as_str()
                    && e["responseStatus"]["code"]
                        .as_i64()
                        .is_some_and(|c| (200..300).contains(&c))
                    && e["responseObject"]["metadata"]["deletionTimestamp"].is_string()
                    && !has_ours(&e["responseObject"])
            })
            .map(|e| received(e))
            .min();
        match unpublish {
            None => v.push((
                "I1".into(),
                format!(
                    "VA {} (uid {}, volume {}, node {}, created {}, delete requested {}) is gone; its last Publish (to {} by replica-{}, {} .. {}, {}{}) has no OK Unpublish to that node ID started after it",
                    inst.name, inst.uid, inst.handle, inst.node, secs(inst.created), inst.deleted.map(secs).unwrap_or_default(),
                    last.node, last.caller, secs(last.start), secs(last.end), last.code,
                    if last.abandoned.is_some() { ", abandoned by its caller" } else { "" }
                ),
            )),
            Some(u) => {
                if let Some(removed) = removal {
                    if removed < u.end {
                        v.push((
                            "I1".into(),
                            format!(
                                "VA {} (volume {}): our finalizer removed at {} before the Unpublish ended at {}",
                                inst.name, inst.handle, secs(removed), secs(u.end)
                            ),
                        ));
                    }
                }
            }
        }
    }
}

fn i2(inp: &Inputs<'_>, v: &mut Vec<(String, String)>) {
    for va in inp.live_vas {
        if va["metadata"]["deletionTimestamp"].is_string() && has_ours(va) {
            v.push((
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
    let referenced: BTreeSet<&str> = inp
        .live_vas
        .iter()
        .filter_map(|va| va["spec"]["source"]["persistentVolumeName"].as_str())
        .collect();
    for pv in inp.pvs {
        let name = pv["metadata"]["name"].as_str().unwrap_or_default();
        if pv["metadata"]["deletionTimestamp"].is_string()
            && has_ours(pv)
            && !referenced.contains(name)
        {
            v.push((
                "I2".into(),
                format!(
                    "PV {name} deleting, no VA references it, still has our finalizer ({})",
                    pv["metadata"]["finalizers"]
                ),
            ));
        }
    }
}

fn i3(inp: &Inputs<'_>, v: &mut Vec<(String, String)>) {
    let mut driver: BTreeSet<(String, String)> = BTreeSet::new();
    if let Some(table) = inp.published.as_object() {
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
    for va in inp.live_vas {
        if va["status"]["attached"] != true {
            continue;
        }
        let name = va["metadata"]["name"].as_str().unwrap_or_default();
        let uid = va["metadata"]["uid"].as_str().unwrap_or_default();
        let Some(inst) = inp
            .instances
            .iter()
            .find(|i| i.name == name && i.uid == uid)
        else {
            continue;
        };
        // The node ID it was last published to (CSINode may have been re-registered since).
        let node_id = inp
            .calls
            .iter()
            .filter(|c| {
                c.method == "ControllerPublishVolume"
                    && c.code == "OK"
                    && c.volume == inst.handle
                    && (inp.node_of_id)(&c.node).as_deref() == Some(inst.node.as_str())
            })
            .max_by_key(|c| c.end)
            .map(|c| c.node.clone())
            .unwrap_or_else(|| format!("{}-id", inst.node));
        expected.insert((inst.handle.clone(), node_id));
    }
    for extra in driver.difference(&expected) {
        v.push((
            "I3".into(),
            format!("driver has {extra:?} published, no live attached VA for it"),
        ));
    }
    for missing in expected.difference(&driver) {
        v.push((
            "I3".into(),
            format!(
                "a live VA is attached=true for {missing:?}, the driver does not have it published"
            ),
        ));
    }
}

fn i4(inp: &Inputs<'_>, v: &mut Vec<(String, String)>) {
    let mut calls: Vec<&Call> = inp.calls.iter().collect();
    calls.sort_by_key(|c| c.start);
    // Overlaps between different callers (sweep, keeping the latest-ending call per caller).
    let mut open: BTreeMap<usize, &Call> = BTreeMap::new();
    let mut overlaps = 0;
    for call in &calls {
        for (caller, other) in &open {
            if *caller != call.caller && other.caller_end() > call.start {
                overlaps += 1;
                if overlaps <= 20 {
                    v.push((
                        "I4".into(),
                        format!(
                            "replica-{} {} {} {} [{} .. {}] overlaps replica-{} {} {} {} [{} .. {}]{}",
                            other.caller, other.method, other.volume, other.node, secs(other.start), secs(other.caller_end()),
                            call.caller, call.method, call.volume, call.node, secs(call.start), secs(call.caller_end()),
                            if other.abandoned.is_some() { " (first call abandoned by its caller)" } else { "" }
                        ),
                    ));
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
        v.push((
            "I4".into(),
            format!("{overlaps} overlapping call pairs in all (first 20 shown)"),
        ));
    }
    let terms = terms(inp.audit, inp.lease);
    let mut outside = 0;
    for call in &calls {
        let identity = format!("replica-{}", call.caller);
        let inside = terms.iter().any(|t| {
            t.identity == identity && call.start >= t.acquired && call.caller_end() <= t.until()
        });
        // The documented limit of fencing without a token: the replica was
        // frozen (SIGSTOP) inside its leadership, with a call already past
        // its window check but not yet written to the socket; the driver
        // receives it as the process resumes, and the caller abandons it at
        // once. Reported, not counted: only the margin protects against it,
        // and the overlap check above still holds it to that.
        let frozen_in_flight = inp.windows.iter().any(|w| {
            w.kind == "leader-sigstop-past-lease"
                && w.note.starts_with(&format!("{identity} stopped"))
                && call.start >= w.start
                && call.start <= w.end + 1_000_000_000
                && terms.iter().any(|t| {
                    t.identity == identity && t.acquired <= w.start && w.start <= t.until()
                })
        });
        if !inside && frozen_in_flight {
            eprintln!(
                "chaos: note: replica-{} {} {} received at {}, as the replica resumed from a SIGSTOP taken inside its leadership (the documented fencing limit)",
                call.caller,
                call.method,
                call.volume,
                secs(call.start)
            );
            continue;
        }
        if !inside {
            outside += 1;
            if outside <= 20 {
                let near = terms
                    .iter()
                    .rfind(|t| t.identity == identity && t.acquired <= call.start)
                    .map(|t| {
                        format!(
                            "its last term: acquired {} last renewal {}",
                            secs(t.acquired),
                            secs(t.last_renewal)
                        )
                    })
                    .unwrap_or_else(|| "no term of it started before".into());
                v.push((
                    "I4".into(),
                    format!(
                        "replica-{} {} {} [{} .. {}] outside its leadership ({near})",
                        call.caller,
                        call.method,
                        call.volume,
                        secs(call.start),
                        secs(call.caller_end())
                    ),
                ));
            }
        }
    }
    if outside > 20 {
        v.push((
            "I4".into(),
            format!("{outside} calls outside their caller's leadership in all (first 20 shown)"),
        ));
    }
}

fn i6(inp: &Inputs<'_>, v: &mut Vec<(String, String)>) {
    for (name, log) in inp
        .logs
        .iter()
        .filter(|(n, _)| !n.starts_with("kube-apiserver"))
    {
        for line in log.lines().filter(|l| l.contains("panicked at")) {
            v.push(("I6".into(), format!("{name}: {line}")));
        }
    }
    // A log flood is a hot loop: more than 1,000 lines in one second of a replica's log.
    for (name, log) in inp.logs.iter().filter(|(n, _)| n.starts_with("replica-")) {
        let mut per_second: BTreeMap<&str, (u32, &str)> = BTreeMap::new();
        for line in log.lines() {
            if let Some(second) = line.get(6..14) {
                let entry = per_second.entry(second).or_insert((0, line));
                entry.0 += 1;
            }
        }
        if let Some((second, (n, first))) = per_second.iter().max_by_key(|(_, (n, _))| *n) {
            if *n > 1000 {
                v.push((
                    "I6".into(),
                    format!(
                        "{name}: {n} lines in the second {second} (a hot loop); first: {}",
                        first.get(..200).unwrap_or(first)
                    ),
                ));
            }
        }
    }
    for exit in inp.exits {
        let ours = exit.sent.is_some();
        let ok = matches!(exit.code, Some(0) | Some(1)) || (ours && exit.signal == exit.sent);
        if !ok {
            v.push((
                "I6".into(),
                format!(
                    "replica-{} ended with code {:?} signal {:?} at {} (signal sent by the suite: {:?})",
                    exit.replica, exit.code, exit.signal, secs(exit.at), exit.sent
                ),
            ));
        }
    }
    // Request rate of standbys during outages (429s, rejections, partitions): per second buckets.
    let terms = terms(inp.audit, inp.lease);
    for window in inp.windows.iter().filter(|w| {
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
        for r in 0..inp.replicas {
            let identity = format!("replica-{r}");
            let user = format!("chaos-{identity}");
            let leading = terms.iter().any(|t| {
                t.identity == identity && t.acquired < window.end && t.until() > window.start
            });
            if leading {
                continue;
            }
            let mut buckets: BTreeMap<i128, u32> = BTreeMap::new();
            for e in inp
                .audit
                .iter()
                .filter(|e| e["user"]["username"] == user.as_str())
            {
                let at = received(e);
                if at >= window.start && at <= window.end + 1_000_000_000 {
                    *buckets.entry(at / 1_000_000_000).or_default() += 1;
                }
            }
            if let Some((second, n)) = buckets.iter().max_by_key(|b| *b.1) {
                // A hot loop makes thousands; a replica that was leading a
                // moment ago finishes its in-flight writes (tens) within the
                // client-side limiter (--kube-api-burst=100 here).
                if *n > STANDBY_REQUESTS_PER_SECOND {
                    v.push((
                        "I6".into(),
                        format!(
                            "standby {identity} made {n} API requests in the second {} during {}",
                            secs(second * 1_000_000_000),
                            window.kind
                        ),
                    ));
                }
            }
        }
    }
}

/// Most API requests a standby may make in one second during an outage:
/// the replicas' `--kube-api-burst`.
const STANDBY_REQUESTS_PER_SECOND: u32 = 100;

fn i7(inp: &Inputs<'_>, v: &mut Vec<(String, String)>) {
    for (name, log) in inp.logs.iter().chain(inp.metrics.iter()) {
        if let Some(line) = log.lines().find(|l| l.contains(inp.canary)) {
            v.push(("I7".into(), format!("canary in {name}: {line}")));
        }
    }
    if inp.events_text.contains(inp.canary) {
        v.push(("I7".into(), "canary in an Event".into()));
    }
    for va in inp.live_vas {
        if va["status"].to_string().contains(inp.canary) {
            v.push((
                "I7".into(),
                format!("canary in the status of VA {}", va["metadata"]["name"]),
            ));
        }
    }
}
