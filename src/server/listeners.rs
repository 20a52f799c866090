//! The server's listening sockets: every URL of a `--listen-*-urls` flag
//! bound before anything is served, and the client URLs advertised from
//! them.

use crate::config::listen_addr;
use std::net::SocketAddr;
use tokio::net::TcpListener;

/// A bound listener and whether it serves TLS.
pub(super) struct Bound {
    pub(super) addr: SocketAddr,
    pub(super) tls: bool,
    pub(super) listener: TcpListener,
}

/// Binds every non-empty URL of `urls` (`http://` or `https://`).
pub(super) async fn bind_all(urls: &[String]) -> Result<Vec<Bound>, String> {
    let mut out = Vec::new();
    for url in urls.iter().filter(|u| !u.trim().is_empty()) {
        let (addr, tls) = listen_addr(url)?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {url}: {e}"))?;
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        out.push(Bound {
            addr: local,
            tls,
            listener,
        });
    }
    Ok(out)
}

/// The client URLs to advertise when none are configured: the listen URLs
/// as written, except that one with port 0 (a free port, as embedded and
/// test servers ask for) names the port actually bound, since clients
/// learn the endpoints from MemberList.
pub(super) fn advertised(listen: &[String], bound: &[Bound]) -> Vec<String> {
    let listen = listen.iter().filter(|u| !u.trim().is_empty());
    listen
        .zip(bound)
        .map(|(url, b)| match listen_addr(url) {
            Ok((addr, tls)) if addr.port() == 0 => {
                format!("{}://{}", if tls { "https" } else { "http" }, b.addr)
            }
            _ => url.clone(),
        })
        .collect()
}
