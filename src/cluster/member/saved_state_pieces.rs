//! A saved file (`saved_state.rs`) sent from one member to another in pieces
//! (`ephd.internal.Membership/FetchSaved`): the seed of a whole cluster
//! resuming takes the newest saved state among the waiting members
//! (`newest_saved_state.rs`), and that file can be GiBs, so it never travels as one
//! message.
//!
//! The sender reads the file one piece ahead on a blocking thread; every
//! piece says where it starts and how large the whole file is. The
//! receiver writes the pieces into a new file as they come and trusts no
//! number it is sent: a piece must start where the previous one ended,
//! be at most [`CHUNK`] bytes, and never go past the announced size (the
//! same in every piece, and the size the probe announced); nothing is
//! allocated from the announced size. What it wrote is a candidate only:
//! the caller decodes it whole (`saved::read`, every checksum) before it
//! uses or installs it.

use crate::proto::ephd::internal::SavedChunk;
use futures::{Stream, StreamExt};
use parking_lot::Mutex;
use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tonic::Status;

/// When a piece of a saved file was last handed out to a member fetching
/// it: a waiting member keeps waiting while the seed is fetching its file
/// (`resume.rs`). Clones share the time.
#[derive(Debug, Clone, Default)]
pub struct HandedOut(std::sync::Arc<Mutex<Option<Instant>>>);

impl HandedOut {
    /// Whether a piece was handed out within `window`.
    pub fn within(&self, window: Duration) -> bool {
        self.0.lock().is_some_and(|at| at.elapsed() <= window)
    }

    /// Notes that a piece was handed out now.
    pub(in crate::cluster) fn note(&self) {
        *self.0.lock() = Some(Instant::now());
    }
}

/// The size of one piece: a few MiB, under the 4 MiB a gRPC message may
/// have by default.
pub const CHUNK: usize = 2 << 20;
/// The largest message a receiver decodes: a piece and its framing.
pub const MAX_MESSAGE: usize = CHUNK + 4096;
/// How long a receiver waits for the next piece (there is no deadline for
/// the whole file, whose size is not bounded).
const IDLE: Duration = Duration::from_secs(15);

/// The pieces of a saved file, as a server streams them.
pub type Chunks = futures::stream::BoxStream<'static, Result<SavedChunk, Status>>;

/// Streams the file at `path` in pieces of at most [`CHUNK`] bytes. The
/// size is taken when the file is opened; a file that shrinks meanwhile
/// ends the stream with an error (one that grows is cut at that size, and
/// the receiver's decoding refuses it).
pub fn serve(path: PathBuf, handed_out: HandedOut) -> io::Result<Chunks> {
    let file = File::open(&path)?;
    let total = file.metadata()?.len();
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tokio::task::spawn_blocking(move || {
        let mut file = file;
        let mut offset = 0u64;
        while offset < total {
            let want = (total - offset).min(CHUNK as u64);
            // At most CHUNK bytes, whatever the file says.
            let mut data = Vec::with_capacity(want as usize);
            let piece = match (&mut file).take(want).read_to_end(&mut data) {
                Ok(0) => Err(Status::internal(format!(
                    "{} ended at byte {offset} of {total}",
                    path.display()
                ))),
                Ok(n) => {
                    let piece = SavedChunk {
                        offset,
                        total,
                        data: data.into(),
                    };
                    offset += n as u64;
                    Ok(piece)
                }
                Err(e) => Err(Status::internal(format!(
                    "cannot read {} at byte {offset}: {e}",
                    path.display()
                ))),
            };
            let failed = piece.is_err();
            // The receiver went away: stop reading.
            if tx.blocking_send(piece).is_err() || failed {
                return;
            }
            handed_out.note();
        }
    });
    Ok(tokio_stream::wrappers::ReceiverStream::new(rx).boxed())
}

/// Writes the pieces of `chunks` into a new file at `to` (fsynced at the
/// end) and returns its size, checking every piece as the module docs
/// say; `expect` is the size the sender announced beforehand (0: not
/// known). On an error `to` may hold a part: the caller removes it.
pub async fn receive<S>(mut chunks: S, to: &Path, expect: u64) -> Result<u64, String>
where
    S: Stream<Item = Result<SavedChunk, Status>> + Unpin,
{
    let shown = to.display().to_string();
    let mut file = Some(File::create(to).map_err(|e| format!("cannot create {shown}: {e}"))?);
    let mut received = 0u64;
    let mut total = None;
    loop {
        let next = tokio::time::timeout(IDLE, chunks.next())
            .await
            .map_err(|_| format!("no data for {IDLE:?} after {received} bytes"))?;
        let Some(piece) = next else { break };
        let piece = piece.map_err(|s| {
            format!(
                "the sending member failed after {received} bytes: {}",
                s.message()
            )
        })?;
        check(&piece, received, *total.get_or_insert(piece.total), expect)?;
        received += piece.data.len() as u64;
        let f = file.take().expect("the file is back after every write");
        let (f, written) = tokio::task::spawn_blocking(move || {
            let mut f = f;
            let r = f.write_all(&piece.data);
            (f, r)
        })
        .await
        .map_err(|e| format!("the file writer failed: {e}"))?;
        written.map_err(|e| format!("cannot write {shown}: {e}"))?;
        file = Some(f);
    }
    match total {
        Some(t) if t == received => {}
        Some(t) => return Err(format!("the stream ended after {received} of {t} bytes")),
        None => return Err("the stream ended before any data".to_string()),
    }
    let f = file.take().expect("the file is back after every write");
    tokio::task::spawn_blocking(move || f.sync_all())
        .await
        .map_err(|e| format!("the file writer failed: {e}"))?
        .map_err(|e| format!("cannot sync {shown}: {e}"))?;
    Ok(received)
}

/// One piece against what came before it: `received` bytes so far, the
/// file's size as the first piece said (`total`) and as the probe said
/// (`expect`, 0 when unknown).
fn check(piece: &SavedChunk, received: u64, total: u64, expect: u64) -> Result<(), String> {
    let len = piece.data.len() as u64;
    if piece.total != total {
        return Err(format!(
            "a piece says the file has {} bytes, the first said {total}",
            piece.total
        ));
    }
    if expect != 0 && total != expect {
        return Err(format!(
            "the file has {total} bytes, the member announced {expect}"
        ));
    }
    if piece.offset != received {
        return Err(format!(
            "a piece starts at byte {}, expected {received}",
            piece.offset
        ));
    }
    if len == 0 || len > CHUNK as u64 {
        return Err(format!("a piece of {len} bytes (at most {CHUNK})"));
    }
    if len > total - received {
        return Err(format!(
            "a piece of {len} bytes at byte {received} goes past the file's {total} bytes"
        ));
    }
    Ok(())
}

#[cfg(test)]
#[path = "saved_state_pieces_tests.rs"]
mod tests;
