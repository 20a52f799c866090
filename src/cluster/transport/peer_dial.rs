//! The dialling side of peer TLS: every connection this member opens to
//! another member's https:// peer URL (Raft message lanes, forwarded lease
//! calls, the membership calls of a starting member) is made here, with
//! rustls, rather than with tonic's `ClientTlsConfig`, for two reasons:
//!
//! * `--peer-cert-allowed-cn` / `--peer-cert-allowed-hostname` apply to
//!   the certificate the dialled member serves too, after the usual chain
//!   and host name verification against the peer CA, as etcd applies them
//!   to both ends of a peer connection (etcd 3.4 refuses to dial a member
//!   whose certificate lacks the allowed CN; that member, accepting the
//!   dialler, sees `remote error: tls: bad certificate`). tonic's TLS
//!   settings take no certificate verifier of our own.
//! * The files are read again, at most once per `--tls-reload-interval`
//!   (never with 0) and only when a connection is being opened, so a
//!   rotated peer certificate (or CA bundle) reaches new outgoing
//!   connections without a restart, as the peer listener's reload
//!   (`tls/reload.rs`) does for incoming ones. Connections already open
//!   keep the session they negotiated. Files that do not load leave the
//!   previous settings in place, with a WARN.
//!
//! Plaintext peers (`http://` URLs) are dialled by tonic as before: none
//! of this runs for them.

use crate::config::{PeerAllowed, PeerTls};
use parking_lot::Mutex;
use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_rustls::rustls::{
    self, CertificateError, ClientConfig, DigitallySignedStruct, Error, RootCertStore,
    SignatureScheme,
};
use tokio_rustls::TlsConnector;
use tonic::codegen::http::Uri;
use tonic::transport::{Channel, Endpoint};

/// The ALPN protocol gRPC runs on.
const ALPN_H2: &[u8] = b"h2";

/// How often a WARN that stays the same repeats: a refused peer is dialled
/// again every few hundred milliseconds.
const REPEAT_WARNING: Duration = Duration::from_secs(10);

/// The peer TLS settings of outgoing connections, kept up to date with the
/// files.
pub(in crate::cluster) struct Dialer {
    peer: PeerTls,
    /// How often the files are read again (zero: never).
    reload: Duration,
    state: Mutex<State>,
}

/// What the current settings were built from, and when the files were
/// last read.
struct State {
    config: Arc<ClientConfig>,
    loaded: Contents,
    checked: Instant,
    /// The last load error and when it was logged.
    failure: Option<(String, Instant)>,
}

/// The bytes of the peer TLS files as last read.
#[derive(PartialEq, Eq)]
struct Contents {
    ca: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl Dialer {
    /// Reads the files of `peer`; fails when they do not load (at startup
    /// there is nothing to fall back on).
    pub(in crate::cluster) fn load(peer: &PeerTls, reload: Duration) -> Result<Dialer, String> {
        let loaded = read(peer)?;
        let config = build(peer, &loaded)?;
        Ok(Dialer {
            peer: peer.clone(),
            reload,
            state: Mutex::new(State {
                config: Arc::new(config),
                loaded,
                checked: Instant::now(),
                failure: None,
            }),
        })
    }

    /// The settings a connection opened now uses: the files are read
    /// again first if `reload` has passed since they last were.
    fn current(&self) -> Arc<ClientConfig> {
        let mut s = self.state.lock();
        if self.reload.is_zero() || s.checked.elapsed() < self.reload {
            return s.config.clone();
        }
        s.checked = Instant::now();
        // A few small files, read only when a connection is being opened.
        let result = read(&self.peer).and_then(|contents| {
            if contents == s.loaded {
                return Ok(None);
            }
            let config = build(&self.peer, &contents)?;
            Ok(Some((contents, config)))
        });
        match result {
            Ok(None) => {
                if s.failure.take().is_some() {
                    tracing::info!("the peer TLS files are loadable again; nothing changed");
                }
            }
            Ok(Some((contents, config))) => {
                s.config = Arc::new(config);
                s.loaded = contents;
                s.failure = None;
                tracing::info!(
                    "reloaded peer TLS certificates for outgoing peer connections (files changed); new connections use them"
                );
            }
            Err(error) => {
                let now = Instant::now();
                let repeat = match &s.failure {
                    Some((last, at)) => *last != error || now.duration_since(*at) >= REPEAT_WARNING,
                    None => true,
                };
                if repeat {
                    tracing::warn!(
                        error = %error,
                        "cannot reload peer TLS certificates for outgoing peer connections; keeping the previous ones"
                    );
                    s.failure = Some((error, now));
                }
            }
        }
        s.config.clone()
    }
}

/// Peer TLS for a member's outgoing connections (plaintext without it):
/// Raft messages, forwarded keep-alives and promotions. Its files are read
/// again at most every `reload` (`--tls-reload-interval`; never with zero)
/// when a connection is opened, so a rotated peer certificate reaches new
/// outgoing connections without a restart (`Dialer`). Clones share
/// the files read.
#[derive(Clone, Default)]
pub struct PeerDialer(Option<Arc<Dialer>>);

impl std::fmt::Debug for PeerDialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "PeerDialer(tls)"
        } else {
            "PeerDialer(plaintext)"
        })
    }
}

impl PeerDialer {
    /// Reads the peer TLS files (when peer TLS is on); fails when a file
    /// cannot be read.
    pub fn load(peer: Option<&PeerTls>, reload: Duration) -> Result<PeerDialer, String> {
        let dialer = peer
            .map(|p| Dialer::load(p, reload).map(Arc::new))
            .transpose()?;
        Ok(PeerDialer(dialer))
    }

    /// The files' dialler, if peer TLS is on.
    pub(in crate::cluster) fn tls(&self) -> Option<Arc<Dialer>> {
        self.0.clone()
    }

    /// A channel to a peer's `url`, connected now, with `timeout` to
    /// connect.
    pub(in crate::cluster) async fn connect(
        &self,
        url: &str,
        timeout: Duration,
    ) -> Result<tonic::transport::Channel, String> {
        connect(self.0.clone(), url, timeout).await
    }

    /// A channel to a peer's `url` that connects on first use.
    pub(in crate::cluster) fn connect_lazy(
        &self,
        url: &str,
        timeout: Duration,
    ) -> Result<tonic::transport::Channel, String> {
        lazy_channel(self.0.clone(), url, timeout)
    }
}

/// A channel to the peer URL `url`, connected now: dialled with `dialer`
/// when it is set and `url` is https:// (by plain tonic otherwise, as
/// before), with `connect_timeout` for the connection (TCP and TLS
/// handshake) and TCP_NODELAY.
pub(in crate::cluster) async fn connect(
    dialer: Option<Arc<Dialer>>,
    url: &str,
    connect_timeout: Duration,
) -> Result<Channel, String> {
    let (endpoint, connector) = endpoint(dialer, url, connect_timeout)?;
    let connected = match connector {
        Some(c) => endpoint.connect_with_connector(c).await,
        None => endpoint.connect().await,
    };
    connected.map_err(|e| format!("cannot connect to {url}: {}", error_chain(&e)))
}

/// [`connect`], but connecting on first use (and again whenever the
/// connection is lost, each time with the dialler's settings of then).
pub(in crate::cluster) fn lazy_channel(
    dialer: Option<Arc<Dialer>>,
    url: &str,
    connect_timeout: Duration,
) -> Result<Channel, String> {
    let (endpoint, connector) = endpoint(dialer, url, connect_timeout)?;
    Ok(match connector {
        Some(c) => endpoint.connect_with_connector_lazy(c),
        None => endpoint.connect_lazy(),
    })
}

/// A connection for a framed lane (`frames.rs`) to the peer URL `url`:
/// TCP with TCP_NODELAY within `connect_timeout`, then for an https:// URL
/// with `dialer` TLS with its current settings, offering the framed lanes'
/// ALPN protocol before `h2`. Also whether the peer may serve framed
/// lanes: false when under TLS it selected another protocol (an older
/// member, or one with them turned off).
pub(in crate::cluster) async fn connect_framed(
    dialer: Option<Arc<Dialer>>,
    url: &str,
    connect_timeout: Duration,
) -> Result<(Box<dyn crate::cluster::transport::frames::PeerIo>, bool), DialError> {
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("invalid peer URL {url}: {e}"))?;
    let https = uri.scheme_str() == Some("https");
    let host = uri
        .host()
        .ok_or_else(|| format!("peer URL {url} has no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let connecting = TcpStream::connect((host.as_str(), port));
    let tcp = match tokio::time::timeout(connect_timeout, connecting).await {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(e)) => {
            return Err(DialError {
                refused: e.kind() == std::io::ErrorKind::ConnectionRefused,
                message: format!("cannot connect to {url}: {e}"),
            })
        }
        Err(_) => return Err(format!("cannot connect to {url} within {connect_timeout:?}").into()),
    };
    tcp.set_nodelay(true)
        .map_err(|e| format!("cannot set TCP_NODELAY on the connection to {url}: {e}"))?;
    let dialer = match (https, dialer) {
        (false, _) => return Ok((Box::new(tcp), true)),
        (true, Some(dialer)) => dialer,
        (true, None) => {
            return Err(format!("peer URL {url} is https:// but peer TLS is not set").into())
        }
    };
    let name =
        ServerName::try_from(host.clone()).map_err(|e| format!("peer host {host:?}: {e}"))?;
    let mut config = (*dialer.current()).clone();
    config.alpn_protocols = vec![
        crate::cluster::transport::frames::ALPN.to_vec(),
        ALPN_H2.to_vec(),
    ];
    let handshake = TlsConnector::from(Arc::new(config)).connect(name, tcp);
    let tls = bounded(
        connect_timeout,
        handshake,
        |e| format!("TLS handshake with {url}: {e}"),
        || format!("no TLS handshake with {url} within {connect_timeout:?}"),
    )
    .await?;
    let offered = tls.get_ref().1.alpn_protocol() == Some(crate::cluster::transport::frames::ALPN);
    Ok((Box::new(tls), offered))
}

/// Why a framed lane could not be dialled.
#[derive(Debug)]
pub(in crate::cluster) struct DialError {
    pub message: String,
    /// The peer's port refused the connection: no process listens there.
    pub refused: bool,
}

impl From<String> for DialError {
    fn from(message: String) -> DialError {
        DialError {
            message,
            refused: false,
        }
    }
}

/// One step of dialling (`step`) within `limit`: its result, its error as
/// `failed` words it, or `late()` when it takes longer.
async fn bounded<T>(
    limit: Duration,
    step: impl std::future::Future<Output = std::io::Result<T>>,
    failed: impl FnOnce(std::io::Error) -> String,
    late: impl FnOnce() -> String,
) -> Result<T, String> {
    match tokio::time::timeout(limit, step).await {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(e)) => Err(failed(e)),
        Err(_) => Err(late()),
    }
}

/// The tonic endpoint for `url` and, for an https:// URL with `dialer`,
/// the connector that does TLS. tonic is then handed the URL as http://:
/// the stream it gets is already TLS (tonic would otherwise insist on its
/// own TLS settings for an https:// URL).
fn endpoint(
    dialer: Option<Arc<Dialer>>,
    url: &str,
    connect_timeout: Duration,
) -> Result<(Endpoint, Option<Connect>), String> {
    let tls = dialer.filter(|_| url.starts_with("https://"));
    let shared = match &tls {
        Some(_) => format!("http://{}", &url["https://".len()..]),
        None => url.to_string(),
    };
    let endpoint = Endpoint::from_shared(shared)
        .map_err(|e| format!("invalid peer URL {url}: {e}"))?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true);
    Ok((endpoint, tls.map(|dialer| Connect { dialer })))
}

/// A source error and its causes, one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// tonic's connector for https:// peers: TCP (with TCP_NODELAY), then TLS
/// with the dialler's current settings. tonic wraps it in its connect
/// timeout.
#[derive(Clone)]
struct Connect {
    dialer: Arc<Dialer>,
}

type Connecting =
    Pin<Box<dyn Future<Output = io::Result<hyper_util::rt::TokioIo<TlsStream<TcpStream>>>> + Send>>;

impl tower::Service<Uri> for Connect {
    type Response = hyper_util::rt::TokioIo<TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Connecting {
        let dialer = self.dialer.clone();
        Box::pin(async move {
            let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidInput, what);
            let host = uri
                .host()
                .ok_or_else(|| invalid(format!("peer URL {uri} has no host")))?;
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri.port_u16().unwrap_or(443);
            let name = ServerName::try_from(host.clone())
                .map_err(|e| invalid(format!("peer host {host:?}: {e}")))?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let tls = TlsConnector::from(dialer.current())
                .connect(name, tcp)
                .await?;
            Ok(hyper_util::rt::TokioIo::new(tls))
        })
    }
}

/// Reads the peer TLS files.
fn read(peer: &PeerTls) -> Result<Contents, String> {
    let read = |p: &Path, flag: &str| {
        std::fs::read(p).map_err(|e| format!("cannot read {flag} {}: {e}", p.display()))
    };
    Ok(Contents {
        ca: read(&peer.ca, "--peer-trusted-ca-file")?,
        cert: read(&peer.cert, "--peer-cert-file")?,
        key: read(&peer.key, "--peer-key-file")?,
    })
}

/// The client settings from `contents`: the peer CA verifies the dialled
/// member (chain and host name, then the allowed name if any), and this
/// member's peer certificate is its client certificate (etcd presents the
/// same one both ways).
fn build(peer: &PeerTls, contents: &Contents) -> Result<ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cas = CertificateDer::pem_slice_iter(&contents.ca)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--peer-trusted-ca-file {}: {e}", peer.ca.display()))?;
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(cas);
    if roots.is_empty() {
        return Err(format!(
            "--peer-trusted-ca-file {} holds no usable CA certificate",
            peer.ca.display()
        ));
    }
    let webpki = WebPkiServerVerifier::builder_with_provider(roots.into(), provider.clone())
        .build()
        .map_err(|e| format!("--peer-trusted-ca-file {}: {e}", peer.ca.display()))?;
    let verifier: Arc<dyn ServerCertVerifier> = match &peer.allowed {
        Some(allowed) => Arc::new(AllowedServer::new(webpki, allowed.clone())),
        None => webpki,
    };
    let chain = CertificateDer::pem_slice_iter(&contents.cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--peer-cert-file {}: {e}", peer.cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "--peer-cert-file {} holds no PEM certificate",
            peer.cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&contents.key)
        .map_err(|e| format!("--peer-key-file {}: {e}", peer.key.display()))?;
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS settings: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(chain, key)
        .map_err(|e| {
            format!(
                "--peer-cert-file {} and --peer-key-file {}: {e}",
                peer.cert.display(),
                peer.key.display()
            )
        })?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(config)
}

/// rustls' server certificate verifier (chain to the peer CA, host name),
/// plus the allowed name (`tls/peer_allowed.rs`).
#[derive(Debug)]
pub(in crate::cluster) struct AllowedServer {
    inner: Arc<WebPkiServerVerifier>,
    allowed: PeerAllowed,
    /// The last refusal logged and when, so a peer dialled again and
    /// again does not flood the log.
    warned: Mutex<Option<(String, Instant)>>,
}

impl AllowedServer {
    /// Wraps `inner` so that it also requires `allowed`.
    pub(in crate::cluster) fn new(
        inner: Arc<WebPkiServerVerifier>,
        allowed: PeerAllowed,
    ) -> AllowedServer {
        AllowedServer {
            inner,
            allowed,
            warned: Mutex::new(None),
        }
    }

    /// Logs why the member at `server` was refused, unless that was just
    /// said.
    fn warn(&self, server: &ServerName<'_>, why: &str) {
        let line = format!("{}: {why}", server.to_str());
        let now = Instant::now();
        let mut warned = self.warned.lock();
        let repeat = match &*warned {
            Some((last, at)) => *last != line || now.duration_since(*at) >= REPEAT_WARNING,
            None => true,
        };
        if repeat {
            tracing::warn!(
                peer = %server.to_str(),
                reason = %why,
                "dialled peer refused: the certificate it serves"
            );
            *warned = Some((line, now));
        }
    }
}

impl ServerCertVerifier for AllowedServer {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let verified = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        match crate::tls::peer_allowed::check(end_entity, &self.allowed) {
            Ok(()) => Ok(verified),
            Err(why) => {
                self.warn(server_name, &why);
                Err(Error::InvalidCertificate(
                    CertificateError::ApplicationVerificationFailure,
                ))
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
#[path = "peer_dial_tests.rs"]
mod tests;
