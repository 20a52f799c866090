//! The channels into the Raft and apply threads: many senders, one
//! receiving thread, optionally bounded.
//!
//! Why not `crossbeam_channel` (used before): a blocking receive there
//! spins and then calls `sched_yield` several times before it parks. On a
//! machine whose cores are all busy (members sharing cores, a benchmark
//! client beside them) those yields are context switches that do nothing:
//! they were 5 % of a leader's CPU at peak load and 11 % at half of it.
//! Here a receiver with nothing to do parks at once on a condition
//! variable, and a sender signals only when the receiver is parked, so a
//! busy receiver costs its senders no system call.
//!
//! The receiver takes everything queued in one lock (a swap of the whole
//! queue into its own buffer), so a thread woken for one input finds the
//! others that came meanwhile without contending with the senders per
//! item. The bound applies to what waits in the shared queue.
//!
//! The error types are `crossbeam_channel`'s, so callers match on them as
//! before.

pub(in crate::cluster) use crossbeam_channel::{SendError, TrySendError};
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

struct State<T> {
    items: VecDeque<T>,
    /// Live senders; the receiver sees the channel disconnected at 0.
    senders: usize,
    /// The receiver is gone: sends fail.
    closed: bool,
    /// The receiver is parked, waiting for an item.
    parked: bool,
    /// Senders parked, waiting for room.
    full_waiters: usize,
    /// [`Sender::wake`] rang while no [`Bell`] waited: the next wait
    /// returns at once.
    rung: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    /// The receiver waits here for an item.
    ready: Condvar,
    /// Senders of a full bounded channel wait here for room.
    room: Condvar,
    cap: usize,
}

/// The sending side; cloned for every sender.
pub(in crate::cluster) struct Sender<T>(Arc<Shared<T>>);

/// The receiving side, owned by one thread.
pub(in crate::cluster) struct Receiver<T> {
    shared: Arc<Shared<T>>,
    /// Items taken from the shared queue, not handed out yet.
    taken: VecDeque<T>,
}

/// A channel that holds at most `cap` items not yet taken by the receiver.
pub(in crate::cluster) fn bounded<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
    channel(cap.max(1))
}

/// A channel without a bound.
pub(in crate::cluster) fn unbounded<T>() -> (Sender<T>, Receiver<T>) {
    channel(usize::MAX)
}

fn channel<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            items: VecDeque::new(),
            senders: 1,
            closed: false,
            parked: false,
            full_waiters: 0,
            rung: false,
        }),
        ready: Condvar::new(),
        room: Condvar::new(),
        cap,
    });
    (
        Sender(shared.clone()),
        Receiver {
            shared,
            taken: VecDeque::new(),
        },
    )
}

impl<T> Sender<T> {
    /// Queues `item` unless the channel is full or the receiver is gone.
    pub(in crate::cluster) fn try_send(&self, item: T) -> Result<(), TrySendError<T>> {
        self.try_push(item, true)
    }

    /// Queues `item`, waiting for room in a full channel; fails only when
    /// the receiver is gone.
    pub(in crate::cluster) fn send(&self, item: T) -> Result<(), SendError<T>> {
        let mut s = self.0.state.lock();
        loop {
            if s.closed {
                return Err(SendError(item));
            }
            if s.items.len() < self.0.cap {
                self.push(s, item);
                return Ok(());
            }
            s.full_waiters += 1;
            self.0.room.wait(&mut s);
            s.full_waiters -= 1;
        }
    }

    /// [`Sender::try_send`] without waking a parked receiver: for a
    /// sender that takes the item itself right after, or leaves it to
    /// whoever is taking items now (the Raft loop's combining,
    /// `raft_loop.rs`).
    pub(in crate::cluster) fn try_send_quiet(&self, item: T) -> Result<(), TrySendError<T>> {
        self.try_push(item, false)
    }

    fn try_push(&self, item: T, wake: bool) -> Result<(), TrySendError<T>> {
        let mut s = self.0.state.lock();
        if s.closed {
            return Err(TrySendError::Disconnected(item));
        }
        if s.items.len() >= self.0.cap {
            return Err(TrySendError::Full(item));
        }
        if wake {
            self.push(s, item);
        } else {
            s.items.push_back(item);
        }
        Ok(())
    }

    /// Whether items wait in the shared queue, not yet taken.
    pub(in crate::cluster) fn has_queued(&self) -> bool {
        !self.0.state.lock().items.is_empty()
    }

    /// Wakes the receiver if it is parked; a [`Bell`] not waiting yet
    /// returns at once from its next wait.
    pub(in crate::cluster) fn wake(&self) {
        ring(&self.0);
    }

    fn push(&self, mut s: MutexGuard<'_, State<T>>, item: T) {
        s.items.push_back(item);
        let wake = s.parked;
        s.parked = false;
        drop(s);
        if wake {
            self.0.ready.notify_one();
        }
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.0.state.lock().senders += 1;
        Sender(self.0.clone())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut s = self.0.state.lock();
        s.senders -= 1;
        if s.senders == 0 && s.parked {
            s.parked = false;
            drop(s);
            self.0.ready.notify_one();
        }
    }
}

/// Lets a thread wait for items of a channel whose [`Receiver`] it does
/// not hold (it lives behind a lock, see `raft_loop.rs`).
pub(in crate::cluster) struct Bell<T>(Arc<Shared<T>>);

impl<T> Bell<T> {
    /// [`Sender::wake`], from the receiving side: for a thread that took
    /// items itself and leaves the rest to the waiting thread.
    pub(in crate::cluster) fn ring(&self) {
        ring(&self.0);
    }

    /// Whether items wait in the shared queue, not yet taken.
    pub(in crate::cluster) fn has_queued(&self) -> bool {
        !self.0.state.lock().items.is_empty()
    }

    /// Parks until an item is queued (and a waking send or
    /// [`Sender::wake`] rings), every sender is gone, or `deadline`; at
    /// once when items already wait or a wake rang since the last wait.
    /// False when every sender is gone.
    pub(in crate::cluster) fn wait_until(&self, deadline: Instant) -> bool {
        let mut s = self.0.state.lock();
        if std::mem::take(&mut s.rung) {
            return s.senders > 0;
        }
        if s.items.is_empty() && s.senders > 0 {
            s.parked = true;
            let _ = self.0.ready.wait_until(&mut s, deadline);
            s.parked = false;
        }
        s.senders > 0
    }
}

/// Wakes the receiver of `shared` if it is parked, or makes the next
/// [`Bell`] wait return at once.
fn ring<T>(shared: &Shared<T>) {
    let mut s = shared.state.lock();
    let wake = s.parked;
    s.parked = false;
    s.rung = !wake;
    drop(s);
    if wake {
        shared.ready.notify_one();
    }
}

impl<T> Receiver<T> {
    /// A [`Bell`] of this channel.
    pub(in crate::cluster) fn bell(&self) -> Bell<T> {
        Bell(self.shared.clone())
    }

    /// Whether items taken from the shared queue wait here.
    pub(in crate::cluster) fn has_taken(&self) -> bool {
        !self.taken.is_empty()
    }

    /// The next item without taking it, if one is queued.
    pub(in crate::cluster) fn peek(&mut self) -> Option<&T> {
        if self.taken.is_empty() {
            self.take_all();
        }
        self.taken.front()
    }

    /// The next item, if one is queued.
    pub(in crate::cluster) fn try_recv(&mut self) -> Option<T> {
        if self.taken.is_empty() {
            self.take_all();
        }
        self.taken.pop_front()
    }

    /// The next item, waiting for one; `None` once every sender is gone
    /// and nothing is left.
    pub(in crate::cluster) fn recv(&mut self) -> Option<T> {
        if let Some(item) = self.taken.pop_front() {
            return Some(item);
        }
        let mut s = self.shared.state.lock();
        while s.items.is_empty() {
            if s.senders == 0 {
                return None;
            }
            s.parked = true;
            self.shared.ready.wait(&mut s);
        }
        take_all(&self.shared, s, &mut self.taken);
        self.taken.pop_front()
    }

    /// Moves everything queued into `taken`, in one lock.
    fn take_all(&mut self) {
        let s = self.shared.state.lock();
        if !s.items.is_empty() {
            take_all(&self.shared, s, &mut self.taken);
        }
    }
}

/// Swaps the shared queue (locked in `s`) into `taken`, and lets senders
/// waiting for room go.
fn take_all<T>(shared: &Shared<T>, mut s: MutexGuard<'_, State<T>>, taken: &mut VecDeque<T>) {
    std::mem::swap(&mut s.items, taken);
    let room = s.full_waiters > 0;
    drop(s);
    if room {
        shared.room.notify_all();
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut s = self.shared.state.lock();
        s.closed = true;
        let items = std::mem::take(&mut s.items);
        drop(s);
        self.shared.room.notify_all();
        // Dropped outside the lock: an item's drop may send again.
        drop(items);
    }
}

impl<T> Iterator for Receiver<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        self.recv()
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
