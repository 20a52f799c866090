//! Requests waiting for the Raft or apply thread's answer, by number.

use parking_lot::Mutex;
use std::collections::HashMap;
use tokio::sync::oneshot;

/// Requests waiting for what Raft answers them (the result of applying
/// their proposal, or a read index), by number.
pub(in crate::cluster) struct Waiters<T>(Mutex<HashMap<u64, oneshot::Sender<T>>>);

impl<T> Default for Waiters<T> {
    fn default() -> Self {
        Waiters(Mutex::new(HashMap::new()))
    }
}

impl<T> Waiters<T> {
    /// Drops every waiter (their requests get no answer: the node stops).
    pub(in crate::cluster) fn clear(&self) {
        self.0.lock().clear();
    }

    /// Registers a waiter for `number`; it is removed again when the
    /// returned guard drops (the request is done, timed out, or its client
    /// went away), so the map cannot grow with answers that never come.
    pub(in crate::cluster) fn wait(&self, number: u64) -> (oneshot::Receiver<T>, Pending<'_, T>) {
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

    /// Whether a request still waits under `number`.
    pub(in crate::cluster) fn is_waiting(&self, number: u64) -> bool {
        self.0.lock().contains_key(&number)
    }

    pub(in crate::cluster) fn finish(&self, number: u64, answer: T) {
        if let Some(w) = self.0.lock().remove(&number) {
            let _ = w.send(answer);
        }
    }

    /// Answers every waiter of `answers` (emptied), in order: the apply
    /// thread's answers to one batch of entries, found in one lock and
    /// woken back to back, rather than a lock and a wake-up between every
    /// two applies.
    pub(in crate::cluster) fn finish_all(&self, answers: &mut Vec<(u64, T)>) {
        if answers.is_empty() {
            return;
        }
        let mut found = Vec::with_capacity(answers.len());
        {
            let mut map = self.0.lock();
            for (number, answer) in answers.drain(..) {
                if let Some(w) = map.remove(&number) {
                    found.push((w, answer));
                }
            }
        }
        for (w, answer) in found {
            let _ = w.send(answer);
        }
    }
}

/// See [`Waiters::wait`].
pub(in crate::cluster) struct Pending<'a, T> {
    waiters: &'a Waiters<T>,
    number: u64,
}

impl<T> Drop for Pending<'_, T> {
    fn drop(&mut self) {
        self.waiters.0.lock().remove(&self.number);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_all_answers_each_waiter_its_own_result_and_skips_the_gone() {
        let w = Waiters::<u32>::default();
        let (mut a, _pa) = w.wait(1);
        let (mut b, _pb) = w.wait(2);
        {
            // A request that gave up: its guard removed it.
            let _ = w.wait(3);
        }
        let mut answers = vec![(2, 20), (3, 30), (1, 10), (9, 90)];
        w.finish_all(&mut answers);
        assert!(answers.is_empty());
        assert_eq!(a.try_recv().unwrap(), 10);
        assert_eq!(b.try_recv().unwrap(), 20);
        assert!(w.0.lock().is_empty(), "answered waiters are removed");
    }
}
