//! raft-rs logs through `slog`; this drain turns its records into
//! `tracing` events (target `raft`), so they go where every other log line
//! of ephd goes, with the same filter (`--log-level raft=debug`).

use slog::{Drain, Key, Level, Never, OwnedKVList, Record, Serializer, KV};
use std::fmt::{self, Write as _};

/// raft's logger (raft adds the member's `raft_id` to every line itself).
pub(in crate::cluster) fn logger() -> slog::Logger {
    slog::Logger::root(ToTracing, slog::o!())
}

struct ToTracing;

impl Drain for ToTracing {
    type Ok = ();
    type Err = Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), Never> {
        // Raft is chatty at INFO (every vote); those lines are DEBUG here,
        // except elections' outcomes, which an operator wants to see.
        let level = record.level();
        let interesting =
            level.is_at_least(Level::Warning) || record.msg().to_string().contains("became leader");
        if !interesting && !tracing::enabled!(target: "raft", tracing::Level::DEBUG) {
            return Ok(());
        }
        let mut line = Fields(record.msg().to_string());
        let _ = record.kv().serialize(record, &mut line);
        let _ = values.serialize(record, &mut line);
        let line = line.0;
        match level {
            Level::Critical | Level::Error => tracing::error!(target: "raft", "{line}"),
            Level::Warning => tracing::warn!(target: "raft", "{line}"),
            _ if interesting => tracing::info!(target: "raft", "{line}"),
            _ => tracing::debug!(target: "raft", "{line}"),
        }
        Ok(())
    }
}

/// Appends `key=value` pairs to the message.
struct Fields(String);

impl Serializer for Fields {
    fn emit_arguments(&mut self, key: Key, val: &fmt::Arguments<'_>) -> slog::Result {
        let _ = write!(self.0, " {key}={val}");
        Ok(())
    }
}
