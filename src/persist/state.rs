//! The revision state file `ephd.state`: a few lines of text that say how
//! far revisions may have gone, independent of the snapshots and the clock.
//!
//! ```text
//! ephd-state 1
//! revisions-used-up-to 1712345678901234567
//! revision-continuity true
//! compact-rev-key true
//! written-unix-ms 1712345678901
//! crc32 1a2b3c4d
//! ```
//!
//! The last line is the CRC-32 of every byte before it. The file is
//! replaced atomically, so it is either the old or the new version; a file
//! that does not parse, or whose checksum fails, is damaged.

use super::{write_atomically, ReadError};
use std::fs;
use std::io::{self, Write};
use std::path::Path;

/// The state file's name inside the data directory.
pub const STATE_FILE: &str = "ephd.state";
const HEADER: &str = "ephd-state 1";

/// What the state file records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RevisionState {
    /// No revision above this was issued (reserved ahead: written before
    /// the store's revision passes it).
    pub used_up_to: i64,
    /// Whether the run that wrote it had `--revision-continuity`.
    pub continuity: bool,
    /// Whether kube-apiserver's `compact_rev_key` existed in that run.
    pub compact_rev_key: bool,
}

/// Replaces the state file in `dir` atomically.
pub fn write(dir: &Path, state: &RevisionState, now_unix_ms: i64) -> io::Result<()> {
    let mut text = format!(
        "{HEADER}\nrevisions-used-up-to {}\nrevision-continuity {}\ncompact-rev-key {}\n\
         written-unix-ms {now_unix_ms}\n",
        state.used_up_to, state.continuity, state.compact_rev_key
    );
    text.push_str(&format!("crc32 {:08x}\n", crc32fast::hash(text.as_bytes())));
    write_atomically(dir, STATE_FILE, "ephd.state.tmp", |w| {
        w.write_all(text.as_bytes())?;
        Ok(text.len() as u64)
    })
    .map(|_| ())
}

/// Reads the state file in `dir`; `Ok(None)` when there is none.
pub fn read(dir: &Path) -> Result<Option<RevisionState>, ReadError> {
    let text = match fs::read(dir.join(STATE_FILE)) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ReadError::Io(e)),
    };
    parse(&text).map(Some).map_err(|reason| ReadError::Damaged {
        reason,
        revision: None,
    })
}

fn parse(text: &[u8]) -> Result<RevisionState, String> {
    let text = std::str::from_utf8(text).map_err(|_| "not text".to_string())?;
    let body_end = text
        .trim_end_matches('\n')
        .rfind('\n')
        .map(|i| i + 1)
        .ok_or("too short")?;
    let (body, last) = text.split_at(body_end);
    let crc = last
        .trim_end()
        .strip_prefix("crc32 ")
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or("no checksum line")?;
    if crc != crc32fast::hash(body.as_bytes()) {
        return Err("checksum does not match".into());
    }
    let mut lines = body.lines();
    if lines.next() != Some(HEADER) {
        return Err("not an ephd state file".into());
    }
    let (mut used, mut continuity, mut compact) = (None, None, None);
    for line in lines {
        let (key, value) = line.split_once(' ').ok_or("malformed line")?;
        let bad = || format!("bad value {value:?} for {key}");
        match key {
            "revisions-used-up-to" => used = Some(value.parse::<i64>().map_err(|_| bad())?),
            "revision-continuity" => continuity = Some(value.parse::<bool>().map_err(|_| bad())?),
            "compact-rev-key" => compact = Some(value.parse::<bool>().map_err(|_| bad())?),
            "written-unix-ms" => {}
            other => return Err(format!("unknown line {other:?}")),
        }
    }
    Ok(RevisionState {
        used_up_to: used.ok_or("no revisions-used-up-to line")?,
        continuity: continuity.ok_or("no revision-continuity line")?,
        compact_rev_key: compact.ok_or("no compact-rev-key line")?,
    })
}
