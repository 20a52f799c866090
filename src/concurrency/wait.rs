//! Waiting on the store: the watch hub's cursor over the change log, woken
//! by every commit, for the recipes' "wait until this key is deleted" and
//! for following a leader key.

use super::recipe_error::RecipeError;
use crate::error::Error;
use crate::mvcc::{Event, Store};
use crate::watch::{Output, WatchSpec, WatchStream};
use std::collections::VecDeque;
use tokio::sync::watch;

/// Revisions one poll reads from the log at most; a follower of one key
/// only ever keeps the events of that key.
const POLL_REVISIONS: usize = 256;

/// One watcher on the store, read as a sequence of event batches. Built on
/// [`WatchStream`], so it replays from any retained revision and then
/// follows live commits exactly as a client's watch does, and costs nothing
/// while it waits (no task, no buffer: only a cursor).
pub(crate) struct Follow<'a> {
    store: &'a Store,
    stream: WatchStream,
    latest: watch::Receiver<i64>,
    stop: watch::Receiver<bool>,
    ready: VecDeque<Event>,
}

impl<'a> Follow<'a> {
    /// Watches `key` (to `range_end`, Range's conventions) from
    /// `start_revision` on. Fails with etcd's compacted error when that
    /// revision is gone, as a client's watch would be canceled.
    pub(crate) fn new(
        store: &'a Store,
        key: bytes::Bytes,
        range_end: bytes::Bytes,
        start_revision: i64,
        stop: watch::Receiver<bool>,
    ) -> Result<Self, RecipeError> {
        // Subscribed before the watcher exists, so no commit is missed.
        let latest = store.log().subscribe();
        let mut stream = WatchStream::new();
        let spec = WatchSpec {
            key,
            range_end,
            start_revision,
            ..Default::default()
        };
        let outs = stream.create(store, spec);
        if outs.iter().any(|o| matches!(o, Output::Compacted { .. })) {
            return Err(Error::Compacted.into());
        }
        Ok(Follow {
            store,
            stream,
            latest,
            stop,
            ready: VecDeque::new(),
        })
    }

    /// The next event, waiting for a commit when none is pending. Ends with
    /// [`RecipeError::ShuttingDown`] when the server stops, and with the
    /// compacted error when compaction overtook the watcher.
    pub(crate) async fn next(&mut self) -> Result<Event, RecipeError> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Ok(e);
            }
            self.latest.borrow_and_update();
            for out in self.stream.poll(self.store, POLL_REVISIONS) {
                match out {
                    Output::Events { events, .. } => self.ready.extend(events),
                    Output::Compacted { .. } => return Err(Error::Compacted.into()),
                    _ => {}
                }
            }
            if !self.ready.is_empty() || self.stream.behind(self.store) {
                continue;
            }
            tokio::select! {
                changed = self.latest.changed() => {
                    if changed.is_err() {
                        return Err(RecipeError::ShuttingDown);
                    }
                }
                _ = stopped(&mut self.stop) => return Err(RecipeError::ShuttingDown),
            }
        }
    }
}

/// Completes once the server is shutting down (the borrow guard is dropped
/// inside, so callers' futures stay `Send`).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}
