//! Requests waiting for the Raft or apply thread's answer, by number.

use parking_lot::Mutex;
use std::collections::HashMap;
use tokio::sync::oneshot;

/// Requests waiting for what Raft answers them (the result of applying
/// their proposal, or a read index), by number.
pub(super) struct Waiters<T>(Mutex<HashMap<u64, oneshot::Sender<T>>>);

impl<T> Default for Waiters<T> {
    fn default() -> Self {
        Waiters(Mutex::new(HashMap::new()))
    }
}

impl<T> Waiters<T> {
    /// Drops every waiter (their requests get no answer: the node stops).
    pub(super) fn clear(&self) {
        self.0.lock().clear();
    }

    /// Registers a waiter for `number`; it is removed again when the
    /// returned guard drops (the request is done, timed out, or its client
    /// went away), so the map cannot grow with answers that never come.
    pub(super) fn wait(&self, number: u64) -> (oneshot::Receiver<T>, Pending<'_, T>) {
        let (tx, rx) = oneshot::channel();
        self.0.lock().insert(number, tx);
        (
            rx,
            Pending {
                waiters: self,
                number,
            },
        )
    }

    pub(super) fn finish(&self, number: u64, answer: T) {
        if let Some(w) = self.0.lock().remove(&number) {
            let _ = w.send(answer);
        }
    }
}

/// See [`Waiters::wait`].
pub(super) struct Pending<'a, T> {
    waiters: &'a Waiters<T>,
    number: u64,
}

impl<T> Drop for Pending<'_, T> {
    fn drop(&mut self) {
        self.waiters.0.lock().remove(&self.number);
    }
}
