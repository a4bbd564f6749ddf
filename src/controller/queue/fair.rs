//! Fair dispatch across nodes inside a lane, and per-node limits (the rules
//! and their reasons: `docs/contract.md`, "Scheduling driver calls").
//!
//! A key's *group* is the node its work is for (empty for keys with no node,
//! such as PVs). [`FairFifo`]: within a lane each group's waiting keys form a
//! FIFO and the groups take turns; the next turn goes to the group with the
//! fewest keys in flight in the lane among the next [`WINDOW`] open groups
//! in turn (the window bounds the work under the queue's lock when thousands
//! of nodes wait); urgent keys go before every group.
//!
//! [`Groups`] counts the keys in flight per group and closes a group while
//! it is at the per-node cap (all lanes together), *held* in a lane (closed
//! until an instant, then one key at a time until released), or *gathering*
//! in a lane (closed until an instant, moved later while keys keep coming, up
//! to a latest). A placement may carry a *limit* of its group's keys in
//! flight in the lane (the node's `allocatable.count`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

use tokio::time::Instant;

/// How many open groups, in turn order, a pick compares.
pub const WINDOW: usize = 64;

/// The node (or other group) a key's work is for; empty for none.
pub type Group = Arc<str>;

/// Where a key waits in its lane (default: no group, not urgent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    pub group: Group,
    /// Served before every group (still within the group's limits).
    pub urgent: bool,
    /// At most this many of the group's keys in flight in the lane (`None`:
    /// no limit); the latest placement of a group's key sets it.
    pub limit: Option<usize>,
}

#[cfg(test)]
impl Placement {
    /// In `group`, not urgent, no limit.
    pub fn node(group: &str) -> Self {
        Self {
            group: Arc::from(group),
            urgent: false,
            limit: None,
        }
    }
}

/// Tells the queue where a key waits, given its lane index. Called with the
/// queue's lock held: it must not call the queue.
pub type Placer = Box<dyn Fn(&str, usize) -> Placement + Send + Sync>;

/// One lane's waiting keys: an urgent FIFO, then a FIFO per group served in
/// turn. Entries may be stale (the key left the lane, or was taken through
/// another entry): [`FairFifo::pop`] asks the caller which entries are live
/// and drops the rest.
#[derive(Default)]
pub struct FairFifo {
    urgent: VecDeque<(String, Group)>,
    groups: HashMap<Group, VecDeque<String>>,
    /// Groups with entries, in the order they take turns.
    turns: VecDeque<Group>,
    /// Groups' limits of keys in flight (from their keys' latest
    /// non-urgent placement), while they wait in the turns.
    limits: HashMap<Group, usize>,
}

impl FairFifo {
    /// Queues `key` at the end of its group (or of the urgent FIFO); a
    /// non-urgent placement sets its group's limit.
    pub fn push(&mut self, key: String, placement: Placement) {
        if placement.urgent {
            self.urgent.push_back((key, placement.group));
            return;
        }
        match placement.limit.filter(|_| !placement.group.is_empty()) {
            Some(limit) => self
                .limits
                .insert(Arc::clone(&placement.group), limit.max(1)),
            None => self.limits.remove(&placement.group),
        };
        match self.groups.get_mut(&placement.group) {
            Some(keys) => keys.push_back(key),
            None => {
                self.groups
                    .insert(Arc::clone(&placement.group), VecDeque::from([key]));
                self.turns.push_back(placement.group);
            }
        }
    }

    /// Takes the next key: the first live urgent entry whose group is open,
    /// else the head of the open group with the fewest keys in flight among
    /// the next [`WINDOW`] open groups in turn, the first in turn among
    /// equals (it then goes to the back of the turns).
    /// `live(key)`: the entry still waits in this lane; `open(group)`: the
    /// group's keys in flight in this lane when it may start one more,
    /// `None` when it may not; a group at its limit may not either.
    pub fn pop(
        &mut self,
        mut live: impl FnMut(&str) -> bool,
        mut open: impl FnMut(&Group) -> Option<usize>,
    ) -> Option<String> {
        let limits = &self.limits;
        let mut open = |group: &Group| {
            open(group).filter(|busy| limits.get(group).is_none_or(|limit| busy < limit))
        };
        let mut i = 0;
        while let Some((key, group)) = self.urgent.get(i) {
            if !live(key) {
                self.urgent.remove(i);
            } else if open(group).is_some() {
                return self.urgent.remove(i).map(|(key, _)| key);
            } else {
                i += 1;
            }
        }
        // Groups that left the turns (their limits go after the loop).
        let mut gone = Vec::new();
        // (position in the turns, keys in flight) of the pick so far.
        let mut pick: Option<(usize, usize)> = None;
        let mut compared = 0;
        let mut i = 0;
        while let Some(group) = self.turns.get(i) {
            if compared == WINDOW {
                break;
            }
            if let Some(keys) = self.groups.get_mut(group) {
                while keys.front().is_some_and(|k| !live(k)) {
                    keys.pop_front();
                }
                if !keys.is_empty() {
                    if let Some(busy) = open(group) {
                        compared += 1;
                        if pick.is_none_or(|(_, least)| busy < least) {
                            pick = Some((i, busy));
                            if busy == 0 {
                                break;
                            }
                        }
                    }
                    i += 1;
                    continue;
                }
            }
            // No live entry left: the group leaves the turns.
            if let Some(group) = self.turns.remove(i) {
                self.groups.remove(&group);
                gone.push(group);
            }
        }
        for group in gone {
            self.limits.remove(&group);
        }
        let group = self.turns.remove(pick?.0)?;
        let keys = self.groups.get_mut(&group)?;
        let key = keys.pop_front();
        if keys.is_empty() {
            self.groups.remove(&group);
            self.limits.remove(&group);
        } else {
            self.turns.push_back(group);
        }
        key
    }

    /// Whether a live entry of `group` (`live(key)`, as for [`FairFifo::pop`])
    /// waits in this lane.
    pub fn waits(&self, group: &Group, mut live: impl FnMut(&str) -> bool) -> bool {
        self.groups
            .get(group)
            .is_some_and(|keys| keys.iter().any(|k| live(k)))
            || self.urgent.iter().any(|(k, g)| g == group && live(k))
    }
}

/// Keys in flight per group, the per-node cap, the holds and the gathers,
/// across the lanes of one queue.
#[derive(Default)]
pub struct Groups {
    /// Keys in flight per (lane, group).
    in_flight: HashMap<(usize, Group), usize>,
    /// Keys in flight per group, all lanes.
    total: HashMap<Group, usize>,
    /// Held groups per lane: closed until the instant, then one key at a
    /// time until released.
    holds: HashMap<(usize, Group), Instant>,
    /// Gathering groups per lane: closed until the first instant, then
    /// open; the second is the latest a gather may be drawn out to.
    gathers: HashMap<(usize, Group), (Instant, Instant)>,
    /// When holds and gathers end, for the timer that wakes the workers.
    hold_ends: BinaryHeap<Reverse<Instant>>,
    /// At most this many keys of one group in flight (all lanes).
    cap: Option<usize>,
}

impl Groups {
    /// At most `cap` keys of one group in flight (`None`: no cap).
    pub fn set_cap(&mut self, cap: Option<usize>) {
        self.cap = cap.filter(|c| *c > 0);
    }

    /// Whether `group` may start one more key in `lane` at `now`.
    pub fn open(&self, lane: usize, group: &Group, now: Instant) -> bool {
        if group.is_empty() {
            return true;
        }
        let at_cap = self
            .cap
            .is_some_and(|cap| self.total.get(group).copied().unwrap_or(0) >= cap);
        let held = self
            .holds
            .get(&(lane, Arc::clone(group)))
            .is_some_and(|until| now < *until || self.in_lane(lane, group) > 0);
        !at_cap && !self.gathering(lane, group, now) && !held
    }

    /// A key of `group` started in `lane`.
    pub fn started(&mut self, lane: usize, group: &Group) {
        if group.is_empty() {
            return;
        }
        *self.in_flight.entry((lane, Arc::clone(group))).or_default() += 1;
        *self.total.entry(Arc::clone(group)).or_default() += 1;
    }

    /// A key of `group` finished in `lane`.
    pub fn finished(&mut self, lane: usize, group: &Group) {
        if group.is_empty() {
            return;
        }
        decrement(&mut self.in_flight, (lane, Arc::clone(group)));
        decrement(&mut self.total, Arc::clone(group));
    }

    /// What [`FairFifo::pop`] asks of a group: its keys in flight in `lane`
    /// when it may start one more at `now`, `None` when it may not.
    pub fn open_with_load(&self, lane: usize, group: &Group, now: Instant) -> Option<usize> {
        self.open(lane, group, now)
            .then(|| self.in_lane(lane, group))
    }

    /// Keys of `group` in flight in `lane`.
    pub fn in_lane(&self, lane: usize, group: &Group) -> usize {
        self.in_flight
            .get(&(lane, Arc::clone(group)))
            .copied()
            .unwrap_or(0)
    }

    /// Holds `group` in `lane` until `until` (a later end of an existing
    /// hold is kept).
    pub fn hold(&mut self, lane: usize, group: &Group, until: Instant) {
        if group.is_empty() {
            return;
        }
        let end = self.holds.entry((lane, Arc::clone(group))).or_insert(until);
        *end = (*end).max(until);
        self.hold_ends.push(Reverse(*end));
    }

    /// Ends the hold of `group` in `lane`; whether there was one.
    pub fn release(&mut self, lane: usize, group: &Group) -> bool {
        self.holds.remove(&(lane, Arc::clone(group))).is_some()
    }

    /// Closes `group` in `lane` until `until`, then opens it as before (a
    /// gather: its keys queued meanwhile start together); [`Groups::draw_out`]
    /// may move the end up to `latest`.
    pub fn gather(&mut self, lane: usize, group: &Group, until: Instant, latest: Instant) {
        if group.is_empty() {
            return;
        }
        self.gathers
            .insert((lane, Arc::clone(group)), (until, latest.max(until)));
        self.hold_ends.push(Reverse(until));
    }

    /// Moves the end of `group`'s gather in `lane` to `until`, or to the
    /// latest the gather allows if sooner (an earlier end is not kept).
    pub fn draw_out(&mut self, lane: usize, group: &Group, until: Instant) {
        if let Some((end, latest)) = self.gathers.get_mut(&(lane, Arc::clone(group))) {
            let to = until.min(*latest);
            if to > *end {
                *end = to;
                self.hold_ends.push(Reverse(to));
            }
        }
    }

    /// Whether `group` gathers in `lane` at `now`.
    pub fn gathering(&self, lane: usize, group: &Group, now: Instant) -> bool {
        self.gathers
            .get(&(lane, Arc::clone(group)))
            .is_some_and(|(until, _)| now < *until)
    }

    /// Forgets the hold and gather ends up to `now`; whether any passed
    /// (workers may find an open group now).
    pub fn holds_ended(&mut self, now: Instant) -> bool {
        self.gathers.retain(|_, (until, _)| *until > now);
        let mut ended = false;
        while self.hold_ends.peek().is_some_and(|Reverse(t)| *t <= now) {
            self.hold_ends.pop();
            ended = true;
        }
        ended
    }

    /// The next hold or gather end still to come.
    pub fn next_hold_end(&self) -> Option<Instant> {
        self.hold_ends.peek().map(|Reverse(t)| *t)
    }
}

/// Takes one from `key`'s count, dropping the entry at 0.
fn decrement<K: Eq + std::hash::Hash>(counts: &mut HashMap<K, usize>, key: K) {
    if let Some(n) = counts.get_mut(&key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            counts.remove(&key);
        }
    }
}

#[cfg(test)]
impl Groups {
    /// Keys of `group` in flight, all lanes.
    pub fn in_flight(&self, group: &str) -> usize {
        self.total.get(group).copied().unwrap_or(0)
    }

    /// Whether `group` is held in `lane`.
    pub fn held(&self, lane: usize, group: &str) -> bool {
        self.holds.contains_key(&(lane, Arc::from(group)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::time::Duration;

    fn drain(fifo: &mut FairFifo, open: impl Fn(&Group) -> bool) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(key) = fifo.pop(|_| true, |g| open(g).then_some(0)) {
            out.push(key);
        }
        out
    }

    #[test]
    fn groups_take_turns_and_keep_their_own_order() {
        let mut fifo = FairFifo::default();
        for i in 0..4 {
            fifo.push(format!("big-{i}"), Placement::node("big"));
        }
        fifo.push("a-0".into(), Placement::node("a"));
        fifo.push("b-0".into(), Placement::node("b"));
        fifo.push("a-1".into(), Placement::node("a"));
        assert_eq!(
            drain(&mut fifo, |_| true),
            ["big-0", "a-0", "b-0", "big-1", "a-1", "big-2", "big-3"]
        );
    }

    #[test]
    fn the_group_with_the_fewest_keys_in_flight_goes_first() {
        let mut fifo = FairFifo::default();
        for i in 0..3 {
            fifo.push(format!("big-{i}"), Placement::node("big"));
        }
        // big's first two took both workers; then small's key came.
        let mut in_flight: HashMap<String, usize> = HashMap::new();
        let take = |fifo: &mut FairFifo, in_flight: &mut HashMap<String, usize>| {
            let key = fifo.pop(
                |_| true,
                |g| Some(in_flight.get(&**g).copied().unwrap_or(0)),
            );
            if let Some(key) = &key {
                let group = key.split('-').next().unwrap_or_default().to_string();
                *in_flight.entry(group).or_default() += 1;
            }
            key
        };
        assert_eq!(take(&mut fifo, &mut in_flight).as_deref(), Some("big-0"));
        assert_eq!(take(&mut fifo, &mut in_flight).as_deref(), Some("big-1"));
        fifo.push("small-0".into(), Placement::node("small"));
        // big is first in turn, but has two in flight: small goes first.
        assert_eq!(take(&mut fifo, &mut in_flight).as_deref(), Some("small-0"));
        assert_eq!(take(&mut fifo, &mut in_flight).as_deref(), Some("big-2"));
        assert_eq!(take(&mut fifo, &mut in_flight), None);
        assert!(fifo.groups.is_empty() && fifo.turns.is_empty());
    }

    #[test]
    fn a_pick_compares_a_window_of_open_groups() {
        let mut fifo = FairFifo::default();
        // WINDOW + 16 groups in turn; all but the last have a key in flight.
        let n = WINDOW + 16;
        for g in 0..n {
            fifo.push(format!("n{g}-0"), Placement::node(&format!("n{g}")));
        }
        let idle = format!("n{}", n - 1);
        let busy = |g: &Group| Some(usize::from(**g != *idle));
        // The idle group is past the window: the first in turn goes.
        assert_eq!(fifo.pop(|_| true, busy).as_deref(), Some("n0-0"));
        // Closed groups do not count against the window.
        let closed_first = |g: &Group| {
            let index: usize = g[1..].parse().unwrap_or(0);
            (index >= 16).then(|| usize::from(**g != *idle))
        };
        assert_eq!(
            fifo.pop(|_| true, closed_first).as_deref(),
            Some(format!("{idle}-0").as_str())
        );
    }

    #[test]
    fn a_group_at_its_limit_waits_while_the_others_go() {
        let mut fifo = FairFifo::default();
        let limited = || Placement {
            limit: Some(2),
            ..Placement::node("big")
        };
        for i in 0..4 {
            fifo.push(format!("big-{i}"), limited());
        }
        fifo.push("small-0".into(), Placement::node("small"));
        let mut busy: HashMap<Group, usize> = HashMap::new();
        let pop = |fifo: &mut FairFifo, busy: &mut HashMap<Group, usize>| {
            let key = fifo.pop(|_| true, |g| Some(busy.get(g).copied().unwrap_or(0)))?;
            let group: Group = Arc::from(key.split_once('-').map_or("", |(g, _)| g));
            *busy.entry(group).or_default() += 1;
            Some(key)
        };
        let started: Vec<String> = std::iter::from_fn(|| pop(&mut fifo, &mut busy)).collect();
        assert_eq!(started, ["big-0", "small-0", "big-1"], "big stops at 2");
        // One of big's keys finishes: one more starts.
        *busy.entry(Arc::from("big")).or_default() -= 1;
        assert_eq!(pop(&mut fifo, &mut busy).as_deref(), Some("big-2"));
        assert_eq!(pop(&mut fifo, &mut busy), None);
        // A later placement of the group without a limit lifts it.
        fifo.push("big-4".into(), Placement::node("big"));
        assert_eq!(pop(&mut fifo, &mut busy).as_deref(), Some("big-3"));
        // A limit of 0 still lets one key at a time through.
        let mut fifo = FairFifo::default();
        let none_left = Placement {
            limit: Some(0),
            ..Placement::node("full")
        };
        fifo.push("full-0".into(), none_left.clone());
        fifo.push("full-1".into(), none_left);
        let mut busy = HashMap::new();
        assert_eq!(pop(&mut fifo, &mut busy).as_deref(), Some("full-0"));
        assert_eq!(pop(&mut fifo, &mut busy), None);
    }

    #[test]
    fn urgent_keys_go_first_and_closed_groups_are_skipped_not_lost() {
        let mut fifo = FairFifo::default();
        fifo.push("a-0".into(), Placement::node("a"));
        fifo.push("b-0".into(), Placement::node("b"));
        let failed = Placement {
            group: Arc::from("gone"),
            urgent: true,
            limit: None,
        };
        fifo.push("gone-0".into(), failed);
        let closed = |g: &Group| &**g != "a";
        assert_eq!(drain(&mut fifo, closed), ["gone-0", "b-0"]);
        // Group a opens again: its key is still there.
        assert_eq!(drain(&mut fifo, |_| true), ["a-0"]);
    }

    #[test]
    fn stale_entries_are_dropped() {
        let mut fifo = FairFifo::default();
        fifo.push("x".into(), Placement::node("a"));
        fifo.push("y".into(), Placement::node("a"));
        fifo.push("z".into(), Placement::node("b"));
        let stale: HashSet<&str> = HashSet::from(["x", "z"]);
        assert_eq!(
            fifo.pop(|k| !stale.contains(k), |_| Some(0)).as_deref(),
            Some("y")
        );
        assert_eq!(fifo.pop(|k| !stale.contains(k), |_| Some(0)), None);
        assert!(fifo.groups.is_empty() && fifo.turns.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_cap_counts_every_lane_and_a_hold_admits_one_key_after_it_ends() {
        let now = Instant::now();
        let node: Group = Arc::from("n");
        let mut groups = Groups::default();
        groups.set_cap(Some(2));
        groups.started(0, &node);
        assert!(groups.open(0, &node, now) && groups.open(1, &node, now));
        groups.started(1, &node);
        assert!(!groups.open(0, &node, now), "attach + detach reach the cap");
        groups.finished(1, &node);
        assert!(groups.open(0, &node, now));
        // Held in lane 0 for 5 s: closed there, open in lane 1.
        groups.hold(0, &node, now + Duration::from_secs(5));
        assert!(!groups.open(0, &node, now) && groups.open(1, &node, now));
        // After the end: one key at a time in that lane.
        let later = now + Duration::from_secs(5);
        assert!(
            !groups.open(0, &node, later),
            "one of the lane's keys still runs"
        );
        groups.finished(0, &node);
        assert!(groups.open(0, &node, later));
        groups.started(0, &node);
        assert!(!groups.open(0, &node, later));
        groups.release(0, &node);
        assert!(groups.open(0, &node, later));
        // Keys with no group are never held or capped.
        let none: Group = Arc::from("");
        groups.hold(0, &none, later + Duration::from_secs(9));
        assert!(groups.open(0, &none, later));
        assert!(groups.holds_ended(later) && !groups.holds_ended(later));
    }
}
