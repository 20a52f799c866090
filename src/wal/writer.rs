//! The log writer: records appended by request workers in memory, written
//! in batches by a thread of its own (group commit), then reported durable
//! to the store.

use super::segment::{self, KIND_EMPTY, KIND_ENTRY, KIND_WRITE};
use crate::config::WalMode;
use crate::mvcc::{Change, Journal};
use parking_lot::{Condvar, Mutex};
use prost::Message;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A segment is closed and a new one started once it holds this much.
pub const SEGMENT_BYTES: u64 = 64 << 20;

/// How long the writer stays awake for the next record after a batch.
const LINGER: Duration = Duration::from_micros(20);

/// Called with the newest revision of each durable batch.
pub type Release = Box<dyn Fn(i64) + Send + Sync>;

/// The write-ahead log of a running server: a [`Journal`] whose records are
/// written by its own thread.
pub struct Wal {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    appended: AtomicU64,
    durable: AtomicU64,
    notify: tokio::sync::watch::Sender<u64>,
    metrics: std::sync::OnceLock<WalMetrics>,
}

/// Where the writer reports to Prometheus.
#[derive(Clone)]
pub struct WalMetrics {
    /// Seconds per batch sync (`fsync` mode).
    pub sync_seconds: prometheus::Histogram,
    /// Bytes written.
    pub written_bytes: prometheus::IntCounter,
}

struct Queue {
    records: Vec<(u64, i64, Vec<u8>)>,
    next: u64,
    closing: bool,
}

impl Wal {
    /// Starts a log in `dir` whose first record will have position `next`,
    /// in a new segment. `release` is called from the writer thread with
    /// the newest revision of every durable batch.
    pub fn start(
        dir: &Path,
        mode: WalMode,
        next: u64,
        boot_id: &str,
        release: Release,
    ) -> std::io::Result<Wal> {
        Wal::start_sized(dir, mode, next, boot_id, release, SEGMENT_BYTES)
    }

    /// [`Wal::start`] with segments of `segment_bytes`.
    pub(super) fn start_sized(
        dir: &Path,
        mode: WalMode,
        next: u64,
        boot_id: &str,
        release: Release,
        segment_bytes: u64,
    ) -> std::io::Result<Wal> {
        std::fs::create_dir_all(dir)?;
        let (file, file_len) = create_segment(dir, next, mode, boot_id)?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                records: Vec::new(),
                next,
                closing: false,
            }),
            wake: Condvar::new(),
            appended: AtomicU64::new(next - 1),
            durable: AtomicU64::new(next - 1),
            notify: tokio::sync::watch::channel(next - 1).0,
            metrics: std::sync::OnceLock::new(),
        });
        let writer = Writer {
            shared: shared.clone(),
            dir: dir.to_path_buf(),
            mode,
            boot_id: boot_id.to_string(),
            file,
            size: 0,
            file_len,
            segment_bytes,
            release,
        };
        let thread = std::thread::Builder::new()
            .name("ephd-wal".into())
            .spawn(move || writer.run())?;
        Ok(Wal {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Writes what is queued, syncs the segment and stops the writer.
    pub fn close(&self) {
        self.shared.queue.lock().closing = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }

    /// Reports every later batch to these metrics.
    pub fn report_to(&self, metrics: WalMetrics) {
        let _ = self.shared.metrics.set(metrics);
    }
}

impl Journal for Wal {
    fn encode(&self, change: Change<'_>) -> Vec<u8> {
        match change {
            Change::Write(txn) => {
                // etcd's own TxnRequest message, encoded once.
                let message = crate::wire::txn(txn.clone());
                let mut out = Vec::with_capacity(1 + message.encoded_len());
                out.push(KIND_WRITE);
                message
                    .encode(&mut out)
                    .expect("a Vec grows to fit the message");
                out
            }
            Change::Entry(entry) => {
                let mut out = vec![KIND_ENTRY];
                out.extend_from_slice(&crate::entry_bytes::encode(0, 0, 0, entry.clone()));
                out
            }
            Change::Empty => vec![KIND_EMPTY],
        }
    }

    fn append(&self, revision: Option<i64>, record: Vec<u8>) -> u64 {
        let mut queue = self.shared.queue.lock();
        let position = queue.next;
        queue.next += 1;
        let was_empty = queue.records.is_empty();
        queue
            .records
            .push((position, revision.unwrap_or(0), record));
        self.shared.appended.store(position, Ordering::Release);
        drop(queue);
        if was_empty {
            self.shared.wake.notify_one();
        }
        position
    }

    fn appended(&self) -> u64 {
        self.shared.appended.load(Ordering::Acquire)
    }

    fn durable(&self) -> u64 {
        self.shared.durable.load(Ordering::Acquire)
    }

    fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.notify.subscribe()
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        self.close();
    }
}

/// A new segment with its header written and synced; and its length.
pub(super) fn create_segment(
    dir: &Path,
    first: u64,
    mode: WalMode,
    boot_id: &str,
) -> std::io::Result<(File, u64)> {
    let path = dir.join(segment::name(first));
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)?;
    let header = segment::header(first, mode, boot_id);
    file.write_all(&header)?;
    file.sync_all()?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok((file, header.len() as u64))
}

struct Writer {
    shared: Arc<Shared>,
    dir: PathBuf,
    mode: WalMode,
    boot_id: String,
    file: File,
    /// Record bytes in the current segment.
    size: u64,
    /// The current segment's length, header included.
    file_len: u64,
    segment_bytes: u64,
    release: Release,
}

impl Writer {
    fn run(mut self) {
        let mut buf = Vec::new();
        let mut written = self.shared.durable.load(Ordering::Acquire);
        loop {
            self.linger(written);
            let batch = {
                let mut queue = self.shared.queue.lock();
                while queue.records.is_empty() && !queue.closing {
                    self.shared.wake.wait(&mut queue);
                }
                if queue.records.is_empty() {
                    break;
                }
                std::mem::take(&mut queue.records)
            };
            buf.clear();
            let first = batch[0].0;
            let mut last = first;
            let mut newest_revision = 0;
            for (position, revision, record) in batch {
                segment::frame(&mut buf, record[0], position, revision, &record[1..]);
                last = position;
                newest_revision = newest_revision.max(revision);
            }
            if self.size > 0 && self.size + buf.len() as u64 > self.segment_bytes {
                self.rotate(first);
            }
            self.persist(&buf);
            self.size += buf.len() as u64;
            self.file_len += buf.len() as u64;
            self.shared.durable.store(last, Ordering::Release);
            written = last;
            if newest_revision > 0 {
                (self.release)(newest_revision);
            }
            self.shared.notify.send_replace(last);
        }
        if let Err(e) = self.file.sync_data() {
            tracing::error!(error = %e, "cannot sync the write-ahead log at shutdown");
        }
    }

    /// Under load the next record comes within microseconds: waiting for
    /// it awake, a moment, spares the appender a wake-up of this thread (a
    /// futex call) for every record; when it does not come, the thread
    /// sleeps until woken.
    fn linger(&self, written: u64) {
        let started = Instant::now();
        let mut spins = 0u32;
        while self.shared.appended.load(Ordering::Acquire) == written {
            if started.elapsed() > LINGER {
                return;
            }
            spins += 1;
            if spins.is_multiple_of(16) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Writes `buf` (and syncs it in `fsync` mode) until it is in.
    fn persist(&mut self, buf: &[u8]) {
        let segment = Segment {
            file: &mut self.file,
            len: self.file_len,
            dir: &self.dir,
        };
        write_until_in(
            segment,
            buf,
            self.mode == WalMode::Fsync,
            self.shared.metrics.get(),
        );
    }

    fn rotate(&mut self, first: u64) {
        if self.mode == WalMode::Fsync {
            let _ = self.file.sync_data();
        }
        loop {
            match create_segment(&self.dir, first, self.mode, &self.boot_id) {
                Ok((file, len)) => {
                    self.file = file;
                    self.size = 0;
                    self.file_len = len;
                    return;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot start a new write-ahead log segment");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
}

/// The open segment being appended to: its file, its length so far, and
/// the log's directory (for messages).
pub(super) struct Segment<'a> {
    pub file: &'a mut File,
    pub len: u64,
    pub dir: &'a Path,
}

/// Appends `buf` to `segment` (syncing it when `sync`), retrying until it
/// is in: nothing is acknowledged meanwhile, so a full or failing disk
/// stalls writes rather than losing them. A failed attempt is cut off
/// the file (a torn record) before the next.
pub(super) fn write_until_in(
    segment: Segment<'_>,
    buf: &[u8],
    sync: bool,
    metrics: Option<&WalMetrics>,
) {
    let Segment { file, len, dir } = segment;
    let mut warned: Option<Instant> = None;
    loop {
        let result = file.write_all(buf).and_then(|()| {
            if !sync {
                return Ok(());
            }
            let started = Instant::now();
            let synced = file.sync_data();
            if let Some(m) = metrics {
                m.sync_seconds.observe(started.elapsed().as_secs_f64());
            }
            synced
        });
        match result {
            Ok(()) => {
                if let Some(m) = metrics {
                    m.written_bytes.inc_by(buf.len() as u64);
                }
                return;
            }
            Err(e) => {
                if warned.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    tracing::error!(
                        dir = %dir.display(),
                        error = %e,
                        "cannot write the write-ahead log; writes wait until it can"
                    );
                    warned = Some(Instant::now());
                }
                std::thread::sleep(Duration::from_millis(100));
                let _ = file.set_len(len);
                let _ = file.seek(SeekFrom::Start(len));
            }
        }
    }
}

/// Removes the segments whose every record is at or below `position`
/// (covered by a snapshot); the newest segment always stays.
pub fn drop_covered(dir: &Path, position: u64) -> std::io::Result<Vec<PathBuf>> {
    let segments = segment::list(dir)?;
    let mut removed = Vec::new();
    for pair in segments.windows(2) {
        let ((_, path), (next_first, _)) = (&pair[0], &pair[1]);
        if *next_first <= position + 1 {
            std::fs::remove_file(path)?;
            removed.push(path.clone());
        }
    }
    Ok(removed)
}
