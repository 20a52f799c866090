//! The TCP stream under one lean-client connection, coalescing its writes
//! so that one poll of the connection costs one `write` however many
//! requests it sends. Kept apart from the gRPC call itself: this is plain
//! I/O, and the subtle part (when a flush may be put off) is easier to
//! check on its own.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Bytes a connection's write buffer takes before a write must go out to
/// the socket even within one poll (back-pressure).
const WRITE_BUF_LIMIT: usize = 64 << 10;

/// The TCP stream under one h2 connection, coalescing its writes.
///
/// h2 writes a DATA frame bigger than 256 bytes straight from the caller's
/// buffer and flushes before it takes the next frame, so with 1 KiB values
/// every request costs its own `writev`, and on loopback each write also
/// pays the receiving side's TCP processing: the largest single item of
/// the client's CPU. Here writes only append to a buffer, and the first
/// flush of a poll of the connection is put off; the connection task then
/// polls the connection once more, right away, and that poll's flush
/// writes everything buffered in one go. So a poll that sends the requests
/// of many client tasks costs one write, as with gRPC's own clients
/// (grpc-go batches frames until its write queue is empty). On the default
/// one-thread runtime, where the client tasks woken by a batch of replies
/// all run before the connection task's next poll, that is about one write
/// per four Puts at 100 clients over 10 connections instead of one per
/// Put. Putting the write off by a wake-up instead (a yield) costs more than
/// it saves on a multi-thread runtime: the threads keep waking each other.
pub(super) struct CoalescingIo {
    tcp: TcpStream,
    /// Bytes accepted from h2 and not yet written, from `written` on.
    buf: Vec<u8>,
    written: usize,
    clock: Arc<FlushClock>,
}

/// What a connection's task and its [`CoalescingIo`] share to put a flush
/// off to the next poll of the connection.
#[derive(Default)]
pub(super) struct FlushClock {
    /// Polls of the connection so far.
    pub(super) polls: AtomicU64,
    /// The poll during which a flush was put off, or 0.
    pub(super) deferred_in: AtomicU64,
}

impl CoalescingIo {
    pub(super) fn new(tcp: TcpStream, clock: Arc<FlushClock>) -> Self {
        CoalescingIo {
            tcp,
            buf: Vec::with_capacity(WRITE_BUF_LIMIT),
            written: 0,
            clock,
        }
    }

    /// Writes out everything buffered.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buf.len() {
            let n = ready!(Pin::new(&mut self.tcp).poll_write(cx, &self.buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.buf.clear();
        self.written = 0;
        self.clock.deferred_in.store(0, Ordering::Relaxed);
        Poll::Ready(Ok(()))
    }

    /// Makes room before taking more bytes: only once the buffer is full
    /// does a write have to reach the socket first.
    fn poll_room(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.buf.len() >= WRITE_BUF_LIMIT {
            return self.poll_drain(cx);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for CoalescingIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for CoalescingIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_room(cx))?;
        self.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_room(cx))?;
        let mut n = 0;
        for b in bufs {
            self.buf.extend_from_slice(b);
            n += b.len();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.written == self.buf.len() {
            return Poll::Ready(Ok(()));
        }
        let now = self.clock.polls.load(Ordering::Relaxed);
        match self.clock.deferred_in.load(Ordering::Relaxed) {
            // Nothing put off yet: more frames may follow in this poll.
            0 => {
                self.clock.deferred_in.store(now, Ordering::Relaxed);
                Poll::Ready(Ok(()))
            }
            // Already put off during this poll.
            poll if poll == now => Poll::Ready(Ok(())),
            // Put off during an earlier poll: this is the batch's write.
            _ => self.poll_drain(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}
