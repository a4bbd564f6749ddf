//! The failing-VA gauge through the worker loop: a VA failing, retried with a
//! growing backoff, succeeding; a failing VA deleted; leadership lost.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher::Event;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::Code;

use super::*;
use crate::controller::context::Ctx;
use crate::controller::model::CachedVa;
use crate::controller::queue::{Backoff, WorkQueue};
use crate::controller::sync::va_worker;
use crate::controller::sync::ErrorPolicy;
use crate::controller::testing::{self, view, World};
use crate::leader::{Leadership, Window};
use crate::metrics::Metrics;

/// upstream's defaults: 1 s doubling to 5 minutes.
const BACKOFF: Backoff = Backoff {
    start: Duration::from_secs(1),
    max: Duration::from_secs(300),
};

/// The gauge's value for `lane`, as served.
fn gauge(ctx: &Ctx, lane: &str) -> i64 {
    ctx.flow_metrics.failing.with_label_values(&[lane]).get()
}

/// Waits (in paused time, so it costs nothing) until `done`, at most an hour.
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(3600);
    while !done() {
        assert!(Instant::now() < deadline, "not within an hour: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn calls(w: &World, rpc: &str) -> usize {
    w.requests().iter().filter(|r| r.starts_with(rpc)).count()
}

/// Both lanes' workers and the queue's timers on `ctx` and `policy`.
fn start(ctx: &Arc<Ctx>, policy: &Arc<ErrorPolicy>) -> Arc<WorkQueue<Lane>> {
    let queue = Arc::new(WorkQueue::new("test", BACKOFF, None));
    let timers = Arc::clone(&queue);
    tokio::spawn(async move { timers.run_timers().await });
    for &lane in Lane::ALL {
        tokio::spawn(va_worker(
            Arc::clone(ctx),
            Arc::clone(policy),
            Arc::clone(&queue),
            lane,
        ));
    }
    queue
}

/// The VA cache of `w` replaced by one we keep the writer of (to delete from it).
fn writable_cache(
    w: &mut World,
    va: &k8s_openapi::api::storage::v1::VolumeAttachment,
) -> Writer<CachedVa> {
    let (store, mut writer) = reflector::store::<CachedVa>();
    writer.apply_watcher_event(&Event::Init);
    writer.apply_watcher_event(&Event::InitApply(view::<_, CachedVa>(va)));
    writer.apply_watcher_event(&Event::InitDone);
    w.ctx.stores.vas = store;
    writer
}

#[tokio::test(start_paused = true)]
async fn a_va_counts_from_its_first_failure_through_its_retries_until_one_succeeds() {
    let w = World::attachable(testing::va(json!({})), testing::pv(json!({})));
    // Nine failures: the last retries come 128 s and 256 s apart, where the
    // rate of failed calls over a few minutes falls to one or two.
    for _ in 0..9 {
        w.driver.fail("publish", Code::Internal, "disk busy");
    }
    let ctx = Arc::new(clone_ctx(&w.ctx));
    assert_eq!((gauge(&ctx, "attach"), gauge(&ctx, "detach")), (0, 0));
    let policy = clone_policy(&w.policy);
    let queue = start(&ctx, &policy);
    queue.add("va-1", Lane::Attach);
    let mut failed_at = Vec::new();
    let started = Instant::now();
    for n in 1..=9 {
        until(&format!("publish #{n}"), || calls(&w, "Publish") >= n).await;
        until("the failure counted", || {
            policy.failing.count(Lane::Attach) == 1
        })
        .await;
        failed_at.push((Instant::now() - started).as_secs());
        assert_eq!(gauge(&ctx, "attach"), 1, "after failure #{n}");
        assert_eq!(gauge(&ctx, "detach"), 0);
    }
    assert_eq!(
        failed_at,
        [0, 1, 3, 7, 15, 31, 63, 127, 255],
        "the backoff grew"
    );
    // Between the 9th failure and the retry 256 s later it still counts.
    tokio::time::sleep(Duration::from_secs(250)).await;
    assert_eq!(calls(&w, "Publish"), 9);
    assert_eq!(gauge(&ctx, "attach"), 1);
    until("the 10th attempt succeeds", || gauge(&ctx, "attach") == 0).await;
    assert_eq!(calls(&w, "Publish"), 10);
    assert_eq!((Instant::now() - started).as_secs(), 511);
}

/// A second context over the same fakes and caches (the test keeps it to read
/// the journal; the workers own the first).
fn clone_ctx(ctx: &Ctx) -> Ctx {
    Ctx {
        driver_name: ctx.driver_name.clone(),
        finalizer: ctx.finalizer.clone(),
        capabilities: ctx.capabilities,
        default_fs_type: ctx.default_fs_type.clone(),
        api: Arc::clone(&ctx.api),
        stores: ctx.stores.clone(),
        driver: ctx.driver.clone(),
        node_gone_detached: false,
        flow_metrics: Arc::clone(&ctx.flow_metrics),
    }
}

/// A second policy over the same failing set (no Events, no pacer).
fn clone_policy(policy: &ErrorPolicy) -> Arc<ErrorPolicy> {
    Arc::new(ErrorPolicy {
        error_codes: policy.error_codes,
        failing: Arc::clone(&policy.failing),
        events: None,
        pacer: None,
    })
}

#[tokio::test(start_paused = true)]
async fn a_failing_va_that_is_deleted_stops_counting_at_once() {
    // Being deleted: the detach lane; Unpublish keeps failing.
    let deleting = testing::deleting_va(json!({}));
    let mut w = World::attachable(deleting.clone(), testing::pv(json!({})));
    let mut writer = writable_cache(&mut w, &deleting);
    for _ in 0..20 {
        w.driver.fail("unpublish", Code::Unavailable, "cloud down");
    }
    let ctx = Arc::new(clone_ctx(&w.ctx));
    let policy = clone_policy(&w.policy);
    let queue = start(&ctx, &policy);
    queue.add("va-1", Lane::Detach);
    until("four failed Unpublish calls", || {
        calls(&w, "Unpublish") >= 4
    })
    .await;
    until("counted in the detach lane", || gauge(&ctx, "detach") == 1).await;
    assert_eq!(gauge(&ctx, "attach"), 0);
    // Deleted (its finalizer removed by someone else, say): the watch's delete
    // event, as the VA informer handles it. Its next retry is 8 s away.
    writer.apply_watcher_event(&Event::Delete(view::<_, CachedVa>(&deleting)));
    policy.failing.cleared("va-1");
    assert_eq!(gauge(&ctx, "detach"), 0, "not after the backoff: now");
    // A failure that raced with the deletion is not counted again.
    policy
        .failing
        .failed("va-1", Lane::Detach, || ctx.stores.va("va-1").is_some());
    assert_eq!(gauge(&ctx, "detach"), 0);
    // The retry finds nothing to do, calls nothing.
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(calls(&w, "Unpublish"), 4);
    assert_eq!(gauge(&ctx, "detach"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_va_gone_from_a_re_list_and_a_va_failing_in_the_other_lane_are_counted_right() {
    let metrics = Metrics::new().expect("metrics");
    let failing = FailingVas::new(&metrics.flows.failing);
    let g = |lane: &str| metrics.flows.failing.with_label_values(&[lane]).get();
    failing.failed("a", Lane::Attach, || true);
    failing.failed("a", Lane::Attach, || true);
    failing.failed("b", Lane::Attach, || true);
    failing.failed("gone", Lane::Attach, || false);
    assert_eq!((g("attach"), g("detach")), (2, 0));
    // `b` is deleted and fails its detach: it moves lanes.
    failing.failed("b", Lane::Detach, || true);
    assert_eq!((g("attach"), g("detach")), (1, 1));
    // A re-list without `a` (deleted while the watch was down).
    failing.retain(|name| name != "a");
    assert_eq!((g("attach"), g("detach")), (0, 1));
    failing.cleared("b");
    failing.cleared("b");
    assert_eq!((g("attach"), g("detach")), (0, 0));
    let text = metrics.render();
    for line in [
        "# TYPE csi_attacher_failing_volumeattachments gauge",
        r#"csi_attacher_failing_volumeattachments{lane="attach"} 0"#,
        r#"csi_attacher_failing_volumeattachments{lane="detach"} 0"#,
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
    }
}

#[tokio::test(start_paused = true)]
async fn losing_the_leadership_resets_the_gauge_and_nothing_counts_after() {
    let (window, follows) = watch::channel(Window::Until(
        crate::leader::TokioClock::stamp(Instant::now()) + Duration::from_secs(3600),
    ));
    let w = World::attachable(testing::va(json!({})), testing::pv(json!({})));
    for _ in 0..5 {
        w.driver.fail("publish", Code::Internal, "disk busy");
    }
    let mut ctx = clone_ctx(&w.ctx);
    ctx.driver = ctx.driver.with_leadership(Leadership::following(follows));
    let ctx = Arc::new(ctx);
    let policy = clone_policy(&w.policy);
    tokio::spawn(stop_when(Arc::clone(&policy.failing), {
        let leadership = ctx.driver.leadership().clone();
        async move { leadership.closed().await }
    }));
    let queue = start(&ctx, &policy);
    queue.add("va-1", Lane::Attach);
    until("two failed Publish calls", || calls(&w, "Publish") >= 2).await;
    assert_eq!(gauge(&ctx, "attach"), 1);
    window.send_replace(Window::Closed);
    until("reset on leadership loss", || gauge(&ctx, "attach") == 0).await;
    // A failure after the loss (of an attempt that got past its driver call,
    // say) does not count: the next leader counts its own.
    policy.failing.failed("va-2", Lane::Attach, || true);
    assert_eq!((gauge(&ctx, "attach"), gauge(&ctx, "detach")), (0, 0));
    // The retries go on, not leading (and whatever they fail with), uncounted,
    // and none reaches the driver.
    let (publishes, requests) = (calls(&w, "Publish"), w.requests().len());
    until("more attempts", || w.requests().len() > requests + 2).await;
    assert_eq!(gauge(&ctx, "attach"), 0);
    assert_eq!(calls(&w, "Publish"), publishes, "no Publish after the loss");
}
