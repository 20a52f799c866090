//! Raw HTTP/2 for the faults no well-behaved client sends: gRPC frames with
//! garbage, lying length prefixes or a compression flag, requests left in
//! flight on a connection that is then reset, and bytes that are not
//! HTTP/2 at all. Written straight on the `h2` crate so nothing between the
//! soak and the wire tidies the request up.

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, Method, Request};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tonic::Code;

/// A gRPC message frame: `flag`, the `claimed` length, then `payload`
/// (which may be shorter or longer than claimed).
pub fn frame(flag: u8, claimed: u32, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + payload.len());
    b.put_u8(flag);
    b.put_u32(claimed);
    b.extend_from_slice(payload);
    b.freeze()
}

/// A well-formed frame of `msg`.
pub fn message<M: prost::Message>(msg: &M) -> Bytes {
    let body = msg.encode_to_vec();
    frame(0, body.len() as u32, &body)
}

/// One HTTP/2 connection whose socket can be reset instead of closed.
pub struct Raw {
    send: h2::client::SendRequest<Bytes>,
    conn: JoinHandle<()>,
}

/// How a raw call ended.
#[derive(Debug)]
pub struct Reply {
    /// The gRPC status (`None` when the reply had none: a reset stream or a
    /// lost connection, described in `message`).
    pub code: Option<Code>,
    /// The status message, or what went wrong.
    pub message: String,
}

impl Raw {
    /// Connects; with `abortive`, closing the connection sends a TCP RST
    /// (`SO_LINGER` 0) instead of a FIN. `window` is the HTTP/2 receive
    /// window (small ones make the server's sends block).
    pub async fn connect(addr: SocketAddr, abortive: bool, window: u32) -> Result<Raw, String> {
        let tcp = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
            .await
            .map_err(|_| format!("connecting to {addr} timed out"))?
            .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        if abortive {
            tcp.set_zero_linger().map_err(|e| e.to_string())?;
        }
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let (send, conn) = tokio::time::timeout(
            Duration::from_secs(5),
            h2::client::Builder::new()
                .initial_window_size(window)
                .initial_connection_window_size(window)
                .enable_push(false)
                .handshake::<_, Bytes>(tcp),
        )
        .await
        .map_err(|_| "HTTP/2 handshake timed out".to_string())?
        .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Raw { send, conn })
    }

    /// Starts a POST to `path` with `body`, ending the request stream when
    /// `end`; returns the response future and the request stream.
    pub async fn start(
        &mut self,
        path: &str,
        body: Bytes,
        end: bool,
    ) -> Result<(h2::client::ResponseFuture, h2::SendStream<Bytes>), String> {
        let mut send = self.send.clone().ready().await.map_err(|e| e.to_string())?;
        let req = Request::builder()
            .method(Method::POST)
            .uri(format!("http://soak{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .map_err(|e| e.to_string())?;
        let (resp, mut stream) = send.send_request(req, false).map_err(|e| e.to_string())?;
        stream.reserve_capacity(body.len());
        stream.send_data(body, end).map_err(|e| e.to_string())?;
        Ok((resp, stream))
    }

    /// A whole unary call: sends `body` to `path` and reads the reply.
    pub async fn unary(&mut self, path: &str, body: Bytes, timeout: Duration) -> Reply {
        let call = async {
            let (resp, _stream) = self.start(path, body, true).await?;
            Ok::<Reply, String>(read_reply(resp).await)
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Reply {
                code: None,
                message: e,
            },
            Err(_) => Reply {
                code: None,
                message: format!("no reply within {timeout:?}"),
            },
        }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // Dropping the connection drops the socket: RST when abortive.
        self.conn.abort();
    }
}

fn status(headers: &HeaderMap) -> Option<(Code, String)> {
    let s = tonic::Status::from_header_map(headers)?;
    Some((s.code(), s.message().to_string()))
}

/// Reads a reply to the end: headers, body, trailers.
pub async fn read_reply(resp: h2::client::ResponseFuture) -> Reply {
    let resp = match resp.await {
        Ok(r) => r,
        Err(e) => {
            return Reply {
                code: None,
                message: format!("stream failed: {e}"),
            }
        }
    };
    let (parts, mut body) = resp.into_parts();
    if let Some((code, message)) = status(&parts.headers) {
        return Reply {
            code: Some(code),
            message,
        };
    }
    while let Some(chunk) = body.data().await {
        match chunk {
            Ok(c) => {
                let _ = body.flow_control().release_capacity(c.len());
            }
            Err(e) => {
                return Reply {
                    code: None,
                    message: format!("body failed: {e}"),
                }
            }
        }
    }
    match body.trailers().await {
        Ok(Some(t)) => match status(&t) {
            Some((code, message)) => Reply {
                code: Some(code),
                message,
            },
            None => Reply {
                code: None,
                message: "trailers without grpc-status".into(),
            },
        },
        Ok(None) => Reply {
            code: None,
            message: format!("no trailers (HTTP {})", parts.status),
        },
        Err(e) => Reply {
            code: None,
            message: format!("trailers failed: {e}"),
        },
    }
}

/// Writes `bytes` on a fresh TCP connection (no HTTP/2, or a broken one)
/// and waits up to `wait` for the server to close it. True when it did.
pub async fn garbage_is_refused(
    addr: SocketAddr,
    bytes: &[u8],
    wait: Duration,
) -> Result<bool, String> {
    let mut tcp = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| format!("connect: {e}"))?;
    let _ = tcp.write_all(bytes).await;
    let mut buf = vec![0u8; 4096];
    let closed = async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    };
    Ok(tokio::time::timeout(wait, closed).await.is_ok())
}
