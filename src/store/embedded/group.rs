//! Group commit: one thread owns a redb file's writes and takes what
//! callers queue in batches, so that many writes share one fsync.
//!
//! The thread takes the first waiting item, then everything else already
//! queued (up to a bound), and hands the batch to its [`Batcher`]; the
//! batcher answers each item. The queue is bounded: beyond it callers wait
//! (backpressure instead of unbounded memory). Closing drops the queue's
//! sender, lets the thread drain what was accepted and joins it, so that
//! every accepted write is answered before `close` returns.
//!
//! The store's writer ([`super::writer`]) and the embedded audit log
//! ([`crate::audit::embedded`]) both run on it.

use std::sync::Mutex;
use std::thread::JoinHandle;

use tokio::sync::mpsc;

use crate::store::{StoreError, StoreResult};

/// What the group-commit thread does with its batches.
pub(crate) trait Batcher: Send + 'static {
    /// What callers queue (each carries its own reply channel).
    type Item: Send + 'static;
    /// Writes a batch, answering and draining every item of it. Called with
    /// an empty batch when only a [`Waker`] asked.
    fn write(&mut self, batch: &mut Vec<Self::Item>);
    /// Runs once, after the queue is closed and every batch written.
    fn close(&mut self) {}
}

/// An entry of the queue: a caller's item, or a wake-up.
enum Message<T> {
    /// Queued by a caller.
    Item(T),
    /// Queued by a [`Waker`]: the batcher runs even with nothing to write.
    Wake,
}

/// Wakes the group-commit thread from another thread (e.g. when a
/// background job ends), without keeping its queue open: it holds a weak
/// sender, so a closed store's thread still ends.
pub(crate) struct Waker<T>(
    /// Weak: does not keep the queue open.
    mpsc::WeakSender<Message<T>>,
);

impl<T> Waker<T> {
    /// A waker whose thread is gone: waking does nothing.
    #[cfg(test)]
    pub(crate) fn detached() -> Self {
        let (queue, _) = mpsc::channel(1);
        Self(queue.downgrade())
    }

    /// Asks for a [`Batcher::write`] soon; a full queue wakes the thread
    /// anyway, and a closed one needs no waking.
    pub(crate) fn wake(&self) {
        if let Some(queue) = self.0.upgrade() {
            drop(queue.try_send(Message::Wake));
        }
    }
}

/// The queue in front of a group-commit thread, and the thread.
pub(crate) struct GroupCommit<T> {
    /// Names the thread in errors (e.g. "store writer").
    what: &'static str,
    /// Queue to the thread; `None` once closed.
    sender: Mutex<Option<mpsc::Sender<Message<T>>>>,
    /// The thread, joined on close.
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl<T> std::fmt::Debug for GroupCommit<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit")
            .field("what", &self.what)
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static> GroupCommit<T> {
    /// Starts the thread `name` (called `what` in errors) with a queue of
    /// `depth` items and batches of at most `max_batch`, on the batcher
    /// `build` makes (given a [`Waker`] for it).
    pub(crate) fn start<B: Batcher<Item = T>>(
        name: &str,
        what: &'static str,
        depth: usize,
        max_batch: usize,
        build: impl FnOnce(Waker<T>) -> StoreResult<B>,
    ) -> StoreResult<Self> {
        let (sender, receiver) = mpsc::channel(depth);
        let batcher = build(Waker(sender.downgrade()))?;
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || run(batcher, receiver, max_batch))
            .map_err(|e| StoreError::Unavailable(format!("cannot start the {what}: {e}")))?;
        Ok(Self {
            what,
            sender: Mutex::new(Some(sender)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Queues `item`, waiting for room; [`StoreError::Closed`] once closed.
    pub(crate) async fn send(&self, item: T) -> StoreResult<()> {
        let sender = self
            .sender
            .lock()
            .map_err(|_| StoreError::Closed)?
            .clone()
            .ok_or(StoreError::Closed)?;
        sender
            .send(Message::Item(item))
            .await
            .map_err(|_| StoreError::Closed)
    }

    /// Closes the queue and waits until the thread has written every item
    /// it accepted and ended.
    pub(crate) async fn close(&self) -> StoreResult<()> {
        drop(self.sender.lock().map_err(|_| StoreError::Closed)?.take());
        let thread = self.thread.lock().map_err(|_| StoreError::Closed)?.take();
        if let Some(thread) = thread {
            let what = self.what;
            tokio::task::spawn_blocking(move || thread.join())
                .await
                .map_err(|e| StoreError::Unavailable(format!("join {what}: {e}")))?
                .map_err(|_| StoreError::Unavailable(format!("{what} panicked")))?;
        }
        Ok(())
    }
}

/// The thread: batches until every sender is dropped, then closes.
fn run<B: Batcher>(mut batcher: B, mut receiver: mpsc::Receiver<Message<B::Item>>, max: usize) {
    // Bounded: a batcher that takes "everything queued" passes the queue's
    // depth, and memory follows what is queued, not the bound.
    let mut batch = Vec::with_capacity(max.min(1024));
    while let Some(first) = receiver.blocking_recv() {
        let mut taken = 1;
        if let Message::Item(item) = first {
            batch.push(item);
        }
        while taken < max {
            match receiver.try_recv() {
                Ok(Message::Item(item)) => batch.push(item),
                Ok(Message::Wake) => {}
                Err(_) => break,
            }
            taken += 1;
        }
        batcher.write(&mut batch);
        batch.clear();
    }
    batcher.close();
}
