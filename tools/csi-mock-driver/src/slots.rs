//! A node's operation slots (`node.max_operations`): a counting semaphore
//! whose waiters are served first come, first served, or, with
//! `node.detach_first`, every waiting detach before any waiting attach (as
//! alibaba-cloud-csi-driver v1.37.1 `pkg/disk/attachdetach_slot.go`
//! `serialADSlot`: `Release` hands the slot to a detach waiting on its
//! `highPriorityChannel` before it frees it for the attaches). A freed slot
//! goes straight to the next waiter, never to a call that arrives later.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

/// The slots of one node.
pub struct NodeSlots {
    detach_first: bool,
    inner: Mutex<Inner>,
}

struct Inner {
    free: usize,
    waiters: VecDeque<Waiter>,
}

struct Waiter {
    detach: bool,
    wake: oneshot::Sender<()>,
}

/// One slot, held until dropped.
pub struct SlotPermit(Arc<NodeSlots>);

impl Drop for SlotPermit {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl NodeSlots {
    pub fn new(slots: usize, detach_first: bool) -> Arc<Self> {
        Arc::new(Self {
            detach_first,
            inner: Mutex::new(Inner {
                free: slots,
                waiters: VecDeque::new(),
            }),
        })
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        // Waiters whose callers went away wait for nothing.
        inner.waiters.retain(|w| !w.wake.is_closed());
        inner
    }

    /// A slot now, if one is free and nobody waits for one.
    pub fn try_acquire(self: &Arc<Self>) -> Option<SlotPermit> {
        let mut inner = self.inner();
        (inner.free > 0 && inner.waiters.is_empty()).then(|| {
            inner.free -= 1;
            SlotPermit(Arc::clone(self))
        })
    }

    /// A slot, once one is free and it is this call's turn.
    pub async fn acquire(self: &Arc<Self>, detach: bool) -> SlotPermit {
        if let Some(permit) = self.try_acquire() {
            return permit;
        }
        let (wake, woken) = oneshot::channel();
        self.inner().waiters.push_back(Waiter { detach, wake });
        let mut waiting = Waiting {
            slots: self,
            woken: Some(woken),
        };
        if let Some(woken) = waiting.woken.as_mut() {
            // The sender lives in the queue until it hands the slot over.
            let _ = woken.await;
        }
        waiting.woken = None;
        SlotPermit(Arc::clone(self))
    }

    /// Hands the slot to the next waiter, or frees it.
    fn release(&self) {
        let mut inner = self.inner();
        loop {
            let next = if self.detach_first {
                inner
                    .waiters
                    .iter()
                    .position(|w| w.detach)
                    .or((!inner.waiters.is_empty()).then_some(0))
            } else {
                (!inner.waiters.is_empty()).then_some(0)
            };
            let Some(waiter) = next.and_then(|i| inner.waiters.remove(i)) else {
                inner.free += 1;
                return;
            };
            if waiter.wake.send(()).is_ok() {
                return;
            }
        }
    }
}

/// A waiter's side; a caller that goes away after it was handed the slot
/// hands it on.
struct Waiting<'a> {
    slots: &'a Arc<NodeSlots>,
    woken: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(mut woken) = self.woken.take() {
            woken.close();
            if woken.try_recv().is_ok() {
                self.slots.release();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The order in which calls waiting for one busy slot get it.
    async fn order(detach_first: bool) -> Vec<&'static str> {
        let slots = NodeSlots::new(1, detach_first);
        let held = slots.acquire(false).await;
        let (done, mut got) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        for (name, detach) in [("attach-1", false), ("detach-1", true), ("attach-2", false)] {
            let (slots, done) = (Arc::clone(&slots), done.clone());
            tasks.push(tokio::spawn(async move {
                let _permit = slots.acquire(detach).await;
                let _ = done.send(name);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }));
            tokio::task::yield_now().await;
        }
        // A waiter that gives up is skipped.
        let quitter = {
            let slots = Arc::clone(&slots);
            tokio::spawn(async move { slots.acquire(true).await })
        };
        tokio::task::yield_now().await;
        quitter.abort();
        let _ = quitter.await;
        drop(held);
        for task in tasks {
            task.await.expect("join");
        }
        drop(done);
        let mut names = Vec::new();
        while let Some(name) = got.recv().await {
            names.push(name);
        }
        assert!(slots.try_acquire().is_some(), "every slot came back");
        names
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_served_in_order_or_detaches_first() {
        assert_eq!(order(false).await, ["attach-1", "detach-1", "attach-2"]);
        assert_eq!(order(true).await, ["detach-1", "attach-1", "attach-2"]);
    }
}
