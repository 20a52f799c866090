//! Which events each watch must deliver, derived from the reference
//! server's "history watch" (all keys, from the start, never canceled).
//!
//! Every store revision above 1 carries at least one event, so once the
//! history watch delivered an event at revision R it holds the complete
//! history up to R. A watch's expected event count up to R then follows
//! from its key range, filters and effective start revision — which lets
//! the driver wait for exactly those events instead of sleeping.

use ephd::proto::etcdserverpb::{watch_create_request::FilterType, WatchCreateRequest};
use ephd::proto::mvccpb::{event::EventType, Event};

use super::ops::in_range;

/// A created watch as the expectation model sees it.
#[derive(Debug, Clone)]
pub struct WatchSpec {
    pub req: WatchCreateRequest,
    /// First revision it reports: `start_revision`, or creation revision + 1.
    pub effective_start: i64,
}

impl WatchSpec {
    /// Whether this watch reports `e`.
    pub fn matches(&self, e: &Event) -> bool {
        let Some(kv) = &e.kv else { return false };
        if kv.mod_revision < self.effective_start {
            return false;
        }
        if !in_range(&kv.key, &self.req.key, &self.req.range_end) {
            return false;
        }
        let filtered = if e.r#type == EventType::Put as i32 {
            FilterType::Noput
        } else {
            FilterType::Nodelete
        };
        !self.req.filters.contains(&(filtered as i32))
    }

    /// How many of `history`'s events up to `rev` this watch reports.
    pub fn expected(&self, history: &[Event], rev: i64) -> usize {
        history
            .iter()
            .filter(|e| e.kv.as_ref().is_some_and(|kv| kv.mod_revision <= rev))
            .filter(|e| self.matches(e))
            .count()
    }
}

/// `PUT key@rev` / `DELETE key@rev`, for readable event listings.
pub fn summary(e: &Event) -> String {
    let kind = if e.r#type == EventType::Put as i32 {
        "PUT"
    } else {
        "DELETE"
    };
    match &e.kv {
        Some(kv) => format!(
            "{kind} {}@{}",
            String::from_utf8_lossy(&kv.key),
            kv.mod_revision
        ),
        None => format!("{kind} <no kv>"),
    }
}
