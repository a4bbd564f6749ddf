use super::*;
use crate::controller::queue::fair::{Placement, Placer};

const BACKOFF: Backoff = Backoff {
    start: Duration::from_secs(1),
    max: Duration::from_secs(300),
};

/// A VA queue placing `<node>-<n>` on `<node>`, and its pacer (timeout 15 s).
fn paced() -> (Arc<WorkQueue<Lane>>, Pacer) {
    let placer: Placer =
        Box::new(|key, _| Placement::node(key.split_once('-').map_or(key, |(n, _)| n)));
    let q = Arc::new(WorkQueue::new("test", BACKOFF, None).with_placer(placer));
    let timers = Arc::clone(&q);
    tokio::spawn(async move { timers.run_timers().await });
    let pacer = Pacer::new(Arc::clone(&q), BACKOFF, Duration::from_secs(15), None);
    (q, pacer)
}

/// Ten completed operations of 40 s each, then a call of VA `n1-a` that
/// started 15 s ago ending at its deadline.
async fn forty_second_operations_then_a_deadline(pacer: &Pacer) {
    for i in 0..10 {
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs(40)).await;
        pacer.finished(Lane::Attach, &format!("n2-{i}"), "n2", started, None);
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let late = Some((Code::DeadlineExceeded, ""));
    pacer.finished(Lane::Attach, "n1-a", "n1", started, late);
}

#[tokio::test(start_paused = true)]
async fn resource_exhausted_holds_the_node_doubling_until_a_publish_succeeds() {
    let (q, pacer) = paced();
    let now = Instant::now();
    pacer.finished(
        Lane::Attach,
        "n1-a",
        "n1",
        now,
        Some((Code::ResourceExhausted, "")),
    );
    assert!(q.is_held(Lane::Attach, "n1"));
    assert!(
        !q.is_held(Lane::Detach, "n1"),
        "detaches make room: never held"
    );
    assert!(!q.is_held(Lane::Attach, "n2"));
    // Other codes stay the VA's own.
    for code in [
        Code::Aborted,
        Code::FailedPrecondition,
        Code::NotFound,
        Code::Internal,
    ] {
        pacer.finished(Lane::Attach, "n2-a", "n2", now, Some((code, "")));
    }
    assert!(!q.is_held(Lane::Attach, "n2"));
    // Unpublish's ResourceExhausted does not hold attaches.
    pacer.finished(
        Lane::Detach,
        "n3-a",
        "n3",
        now,
        Some((Code::ResourceExhausted, "")),
    );
    assert!(!q.is_held(Lane::Attach, "n3"));
    // The second answer doubles the hold: 1 s, then 2 s.
    q.add("n1-b", Lane::Attach);
    pacer.finished(
        Lane::Attach,
        "n1-a",
        "n1",
        now,
        Some((Code::ResourceExhausted, "")),
    );
    let took = tokio::time::timeout(Duration::from_millis(1900), q.get(Lane::Attach)).await;
    assert!(took.is_err(), "held for 2 s after the second answer");
    let got = q.get(Lane::Attach).await.map(|w| w.key);
    assert_eq!(got.as_deref(), Some("n1-b"));
    assert!(Instant::now() - now >= Duration::from_secs(2));
    // A Publish that succeeds on the node ends the hold.
    pacer.finished(Lane::Attach, "n1-b", "n1", now, None);
    assert!(!q.is_held(Lane::Attach, "n1"));
}

#[tokio::test(start_paused = true)]
async fn only_a_publish_started_after_the_node_was_found_full_ends_its_hold() {
    let (q, pacer) = paced();
    let before = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let exhausted = Some((Code::ResourceExhausted, ""));
    pacer.finished(Lane::Attach, "n1-a", "n1", Instant::now(), exhausted);
    // Attaches that were running when the driver found the node full end
    // well: they took the room, the node stays held.
    for va in ["n1-b", "n1-c"] {
        pacer.finished(Lane::Attach, va, "n1", before, None);
        assert!(q.is_held(Lane::Attach, "n1"), "{va} started before");
    }
    // The next call after the hold succeeds: the node has room again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    pacer.finished(Lane::Attach, "n1-d", "n1", Instant::now(), None);
    assert!(!q.is_held(Lane::Attach, "n1"));
}

#[tokio::test(start_paused = true)]
async fn after_a_deadline_the_retry_keeps_its_backoff_and_the_operation_is_timed_from_its_first_attempt(
) {
    let (_q, pacer) = paced();
    let backoff = Duration::from_secs(1);
    // Completed operations took 40 s; n1-a's call ended at its deadline:
    // its retry keeps the backoff (no wait for the operation to settle).
    forty_second_operations_then_a_deadline(&pacer).await;
    assert_eq!(pacer.retry_delay("n1-a", backoff), backoff);
    // The retry that finds it done closes the doubt, and counts as one
    // operation from the first attempt (the timeout advice's samples): 40 s.
    tokio::time::sleep(Duration::from_secs(25)).await;
    pacer.finished(Lane::Attach, "n1-a", "n1", Instant::now(), None);
    assert_eq!(pacer.retry_delay("n1-a", backoff), backoff);
    let samples = &pacer.lock().samples[0];
    assert_eq!(samples.back(), Some(&Duration::from_secs(40)));
}

#[tokio::test(start_paused = true)]
async fn calls_past_the_timeout_suggest_one_that_fits() {
    let metrics = crate::metrics::Metrics::new().expect("metrics");
    let q = Arc::new(WorkQueue::<Lane>::new("test", BACKOFF, None));
    let pacer = Pacer::new(
        q,
        BACKOFF,
        Duration::from_secs(15),
        Some(metrics.queues.for_pacer()),
    );
    let gauge = r#"csi_attacher_suggested_timeout_seconds{operation="ControllerPublishVolume"}"#;
    // Operations that completed took up to 48 s (retries included).
    for i in 0..20 {
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs(30 + i)).await;
        pacer.finished(Lane::Attach, &format!("v-{i}"), "n", started, None);
    }
    for i in 0..4 {
        let now = Instant::now();
        pacer.finished(
            Lane::Attach,
            &format!("w-{i}"),
            "n",
            now,
            Some((Code::DeadlineExceeded, "")),
        );
    }
    assert!(
        metrics.render().contains(&format!("{gauge} 0")),
        "4 of the last 100 at the deadline: no advice yet"
    );
    let now = Instant::now();
    pacer.finished(
        Lane::Attach,
        "w-4",
        "n",
        now,
        Some((Code::DeadlineExceeded, "")),
    );
    // p99 of 30..49 s is 49 s; × 1.25 = 61.25 → 62 s.
    assert!(
        metrics.render().contains(&format!("{gauge} 62")),
        "{}",
        metrics.render()
    );
}

#[tokio::test(start_paused = true)]
async fn an_operation_in_doubt_the_driver_says_still_runs_is_polled_not_backed_off() {
    let (_q, pacer) = paced();
    let pacer = pacer.with_poll();
    // n1-a's call started 15 s ago and ended at its deadline.
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let late = Some((Code::DeadlineExceeded, ""));
    pacer.finished(Lane::Attach, "n1-a", "n1", started, late);
    let aborted = Some((Code::Aborted, "operation pending for volume"));
    let long = Duration::from_secs(32);
    // In doubt, but the driver has not said it runs: the backoff.
    assert_eq!(pacer.retry_delay("n1-a", long), long);
    tokio::time::sleep(Duration::from_secs(1)).await;
    pacer.finished(Lane::Attach, "n1-a", "n1", Instant::now(), aborted);
    // Now polled after an eighth of the 16 s it has run, never later than
    // its backoff, never sooner than the backoff's start.
    assert_eq!(pacer.retry_delay("n1-a", long), Duration::from_secs(2));
    let short = Duration::from_millis(1500);
    assert_eq!(pacer.retry_delay("n1-a", short), short);
    tokio::time::sleep(Duration::from_secs(64)).await;
    assert_eq!(pacer.retry_delay("n1-a", long), Duration::from_secs(10));
    // A VA not in doubt answered Aborted (another call's operation) keeps
    // its backoff.
    pacer.finished(Lane::Attach, "n1-b", "n1", Instant::now(), aborted);
    assert_eq!(pacer.retry_delay("n1-b", long), long);
    // Success ends the doubt.
    pacer.finished(Lane::Attach, "n1-a", "n1", Instant::now(), None);
    assert_eq!(pacer.retry_delay("n1-a", long), long);
}

#[tokio::test(start_paused = true)]
async fn polling_an_operation_in_doubt_waits_at_least_the_backoffs_start() {
    let (_q, pacer) = paced();
    let pacer = pacer.with_poll();
    let late = Some((Code::DeadlineExceeded, ""));
    pacer.finished(Lane::Detach, "n1-a", "n1", Instant::now(), late);
    let aborted = Some((Code::Aborted, ""));
    pacer.finished(Lane::Detach, "n1-a", "n1", Instant::now(), aborted);
    // Run no time yet: the poll is the backoff's start, 1 s.
    let long = Duration::from_secs(16);
    assert_eq!(pacer.retry_delay("n1-a", long), BACKOFF.start);
}

#[tokio::test(start_paused = true)]
async fn without_poll_pending_after_deadline_an_aborted_retry_keeps_its_backoff() {
    let (_q, pacer) = paced();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let late = Some((Code::DeadlineExceeded, ""));
    pacer.finished(Lane::Attach, "n1-a", "n1", started, late);
    let aborted = Some((Code::Aborted, ""));
    pacer.finished(Lane::Attach, "n1-a", "n1", Instant::now(), aborted);
    let long = Duration::from_secs(32);
    assert_eq!(pacer.retry_delay("n1-a", long), long);
}
