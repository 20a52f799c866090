//! `--restore-snapshot <file>`: starting from one snapshot file: an etcd
//! database (what `etcdctl snapshot save` writes from ephd or etcd 3.4 to
//! 3.7, or an etcd data dir's `member/snap/db`) or an ephd snapshot (a
//! generation copied out of a `--data-dir`, or a file saved from an older
//! ephd).
//!
//! The rules are those of any restart (`bootstrap.rs`): the file is read
//! all or nothing, and with revision continuity (the default) the store
//! starts above the file's revision plus the restart margin, so a
//! kube-apiserver that saw the saved revisions never sees them again;
//! leases come back with their remaining time less the time since the
//! snapshot was taken. Unlike a damaged generation in a data directory,
//! a damaged file is never skipped: the operator named it, so ephd
//! refuses to start and says what is wrong with it.
//!
//! With `--data-dir` the directory must hold no snapshot generation: which
//! state wins would otherwise be a guess, and a restart that still carries
//! the flag must not silently throw away what the directory learned since.
//! The restored state is written to the directory before serving, so the
//! next start (without the flag) continues from it.

use crate::persist::{self, etcd_db, ReadError, Recovery};
use std::io::Read;
use std::path::Path;

/// Reads `file` for a start, refusing a damaged one, and checks that
/// `data_dir` (if any) holds no snapshot that would compete with it.
pub(super) fn from_file(
    file: &Path,
    data_dir: Option<&Path>,
    wall_ms: i64,
) -> Result<Recovery, String> {
    if let Some(dir) = data_dir {
        let existing =
            persist::list(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        let legacy = dir.join(persist::LEGACY_FILE);
        if let Some(path) = existing
            .first()
            .map(|(_, p)| p.clone())
            .or_else(|| legacy.exists().then_some(legacy))
        {
            return Err(format!(
                "refusing to start: --restore-snapshot {} with a --data-dir that already holds a \
                 snapshot ({}). Start without --restore-snapshot to continue from the data \
                 directory, or point --data-dir at an empty directory to restore the file",
                file.display(),
                path.display()
            ));
        }
    }
    let etcd_format = is_etcd_database(file);
    let read = if etcd_format {
        etcd_db::read(file, wall_ms)
    } else {
        persist::read_file(file, wall_ms)
    };
    let restored = read.map_err(|e| match e {
        ReadError::Damaged { reason, .. } => format!(
            "refusing to start: --restore-snapshot {} cannot be restored: {reason}. Nothing was \
             restored (a snapshot is restored whole or not at all); the file must be what \
             `etcdctl snapshot save` writes (from etcd or ephd), an etcd data dir's \
             member/snap/db, or an ephd --data-dir snapshot",
            file.display()
        ),
        ReadError::Io(e) => format!("cannot read --restore-snapshot {}: {e}", file.display()),
    })?;
    tracing::info!(
        path = %file.display(),
        format = if etcd_format { "etcd database" } else { "ephd snapshot" },
        revision = restored.revision,
        written_unix_ms = restored.written_unix_ms,
        "restoring the snapshot named by --restore-snapshot"
    );
    Ok(Recovery {
        highest_named: restored.revision,
        restored: Some((file.to_path_buf(), restored)),
        damaged: Vec::new(),
    })
}

/// Whether `file` starts as a bbolt database does (else it is read as an
/// ephd snapshot, whose reader says what is wrong with anything else).
fn is_etcd_database(file: &Path) -> bool {
    let mut head = [0u8; 20];
    std::fs::File::open(file)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| etcd_db::has_bbolt_magic(&head))
}
