//! TLS for the https:// listeners, terminated here with rustls so that the
//! server certificate, its key, the trusted client CAs and the certificate
//! revocation lists (`revocation.rs`) can change while the server runs.
//!
//! tonic's own TLS fixes one configuration when the server is built. Here
//! each accepted connection takes the configuration that is current at that
//! moment ([`Live`]); established connections keep the session they
//! negotiated and never notice a change. A [`Reloader`] swaps in a new
//! configuration when the files' content changes (read every
//! `--tls-reload-interval`) or on SIGHUP. Files that do not load (a
//! half-written certificate, a key that does not match it, a CA bundle
//! without a certificate, a revocation list that does not parse, a missing
//! file) leave the previous configuration
//! in place, with a WARN that repeats while they stay broken.
//!
//! The files' bytes, not their metadata, decide whether anything changed:
//! Kubernetes secret volumes swap a `..data` symlink, other tools rename
//! over the file or rewrite it in place, and comparing content catches all
//! of them without reasoning about inodes and timestamp granularity. The
//! files are a few kilobytes, so reading them every few seconds costs
//! nothing measurable.
//!
//! Every configuration is built afresh, with its own session cache: a
//! client cannot resume a session that was authenticated under the previous
//! CA bundle, so removing a CA takes effect for new connections at once.
//!
//! A trusted CA file (`--trusted-ca-file`, `--peer-trusted-ca-file`) means
//! clients must present a certificate it signed, on either listener, as in
//! etcd, whose TLS servers ask for and verify one whenever a CA is given.
//! `--client-cert-auth` does not change the handshake; it only makes the
//! certificate's CN the user of requests without a token (`auth`).

use super::certificate::{self, Summary};
use super::crl_v1::RevokedV1;
use super::peer_identity::AllowedPeer;
use super::revocation::{self, LogRevoked};
use crate::config::{Config, PeerTls};
use futures::{Stream, StreamExt};
use parking_lot::RwLock;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::rustls::{
    self,
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    server::WebPkiClientVerifier,
    RootCertStore, ServerConfig,
};
use tokio_rustls::{server::TlsStream, TlsAcceptor};

/// The ALPN protocol gRPC clients ask for; grpc-go 1.67+ (kube-apiserver
/// 1.33+) and rustls clients refuse servers that do not select it.
const ALPN_H2: &[u8] = b"h2";
/// The ALPN protocol of HTTP/1.1 clients (curl --http1.1, Python's
/// urllib3): the JSON gateway and /health share the port (src/gateway).
const ALPN_HTTP1: &[u8] = b"http/1.1";

/// How long a TLS handshake may take. A peer that connects and never
/// completes one would otherwise hold its descriptor until it goes away.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the WARN about files that do not load repeats while they stay
/// the same: often enough to be seen, rarely enough not to flood the log.
const REPEAT_WARNING: Duration = Duration::from_secs(60);

/// The configuration new TLS connections are accepted with; cheap to clone
/// (all clones see the same, current configuration).
#[derive(Clone)]
pub(crate) struct Live(Arc<RwLock<Arc<ServerConfig>>>);

impl Live {
    fn current(&self) -> Arc<ServerConfig> {
        self.0.read().clone()
    }
}

/// The files `--cert-file`, `--key-file`, `--trusted-ca-file` and
/// `--client-crl-file` name (or their `--peer-*` counterparts).
#[derive(Debug, Clone)]
struct Files {
    cert: PathBuf,
    key: PathBuf,
    ca: Option<PathBuf>,
    /// Only with `ca`: without a CA no client certificate is asked for.
    crl: Option<PathBuf>,
    /// Peer listeners: what a connecting member's certificate must name
    /// (`peer_identity.rs`).
    allowed: Option<crate::config::PeerAllowed>,
    /// A protocol offered in ALPN before h2 and http/1.1: the peer
    /// listener's framed Raft lanes, when this member uses them.
    first_protocol: Option<&'static [u8]>,
    flags: FlagNames,
}

/// The flags that name the files, for error messages and logs.
#[derive(Debug, Clone, Copy)]
struct FlagNames {
    cert: &'static str,
    key: &'static str,
    ca: &'static str,
    crl: &'static str,
    /// What a successful load logs.
    loaded: &'static str,
}

/// The client listeners' flags.
const CLIENT_FLAGS: FlagNames = FlagNames {
    cert: "--cert-file",
    key: "--key-file",
    ca: "--trusted-ca-file",
    crl: "--client-crl-file",
    loaded: "loaded TLS certificates",
};

/// Cluster mode's peer listener flags.
const PEER_FLAGS: FlagNames = FlagNames {
    cert: "--peer-cert-file",
    key: "--peer-key-file",
    ca: "--peer-trusted-ca-file",
    crl: "--peer-crl-file",
    loaded: "loaded peer TLS certificates",
};

/// The bytes of [`Files`] as last read.
#[derive(Debug, PartialEq, Eq)]
struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Option<Vec<u8>>,
    crl: Option<Vec<u8>>,
}

impl Files {
    fn from_config(config: &Config) -> Result<Files, String> {
        let need = |p: &Option<PathBuf>, flag: &str| {
            p.clone()
                .ok_or_else(|| format!("https:// listen URLs need {flag}"))
        };
        let cert = need(&config.cert_file, "--cert-file")?;
        let key = need(&config.key_file, "--key-file")?;
        if config.client_cert_auth && config.trusted_ca_file.is_none() {
            return Err("--client-cert-auth needs --trusted-ca-file".to_string());
        }
        let mut crl = config
            .client_crl_file
            .clone()
            .filter(|p| !p.as_os_str().is_empty());
        if let (Some(path), None) = (&crl, &config.trusted_ca_file) {
            // etcd takes the flag and never uses it: without a CA it asks
            // clients for no certificate, so there is nothing to revoke.
            // Refusing would turn away an etcd command line that works;
            // saying so keeps the operator from believing in a check.
            tracing::warn!(
                crl = %path.display(),
                "--client-crl-file has no effect without --trusted-ca-file: no client \
                 certificate is asked for, so none is checked against it (as in etcd)"
            );
            crl = None;
        }
        Ok(Files {
            cert,
            key,
            ca: config.trusted_ca_file.clone(),
            crl,
            allowed: None,
            first_protocol: None,
            flags: CLIENT_FLAGS,
        })
    }

    fn from_peer(peer: &PeerTls, first_protocol: Option<&'static [u8]>) -> Files {
        Files {
            cert: peer.cert.clone(),
            key: peer.key.clone(),
            ca: Some(peer.ca.clone()),
            crl: peer.crl.clone(),
            allowed: peer.allowed.clone(),
            first_protocol,
            flags: PEER_FLAGS,
        }
    }

    fn read(&self) -> Result<Contents, String> {
        fn read(p: &Path, flag: &str) -> Result<Vec<u8>, String> {
            std::fs::read(p).map_err(|e| format!("cannot read {flag} {}: {e}", p.display()))
        }
        Ok(Contents {
            cert: read(&self.cert, self.flags.cert)?,
            key: read(&self.key, self.flags.key)?,
            ca: match &self.ca {
                Some(p) => Some(read(p, self.flags.ca)?),
                None => None,
            },
            crl: match &self.crl {
                Some(p) => Some(read(p, self.flags.crl)?),
                None => None,
            },
        })
    }

    /// A server configuration from `contents`, and what to log about it.
    fn build(&self, contents: &Contents) -> Result<(ServerConfig, Loaded), String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = CertificateDer::pem_slice_iter(&contents.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{} {}: {e}", self.flags.cert, self.cert.display()))?;
        let Some(leaf) = chain.first() else {
            return Err(format!(
                "{} {} holds no PEM certificate",
                self.flags.cert,
                self.cert.display()
            ));
        };
        let summary = certificate::summarize(leaf);
        let key = PrivateKeyDer::from_pem_slice(&contents.key)
            .map_err(|e| format!("{} {}: {e}", self.flags.key, self.key.display()))?;
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS settings: {e}"))?;
        let crls = match (&self.crl, &contents.crl) {
            (Some(path), Some(bytes)) => revocation::parse(bytes, self.flags.crl, path)?,
            _ => revocation::Lists::default(),
        };
        let crl_count = crls.len();
        let (builder, trusted_cas) = match (&self.ca, &contents.ca) {
            (Some(path), Some(pem)) => {
                let cas = CertificateDer::pem_slice_iter(pem)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("{} {}: {e}", self.flags.ca, path.display()))?;
                let mut roots = RootCertStore::empty();
                roots.add_parsable_certificates(cas);
                if roots.is_empty() {
                    return Err(format!(
                        "{} {} holds no usable CA certificate",
                        self.flags.ca,
                        path.display()
                    ));
                }
                let trusted = roots.len();
                // With a CA a client certificate is required, whatever
                // --client-cert-auth says: etcd's listeners ask for and
                // verify one whenever a CA is given, and serving clients
                // without one would open a server etcd keeps closed.
                let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider);
                // A certificate no list speaks for (its issuer published
                // none) is served, as etcd serves every serial its list
                // does not name.
                let verifier = if crls.v2.is_empty() {
                    verifier
                } else {
                    verifier
                        .with_crls(crls.v2)
                        .allow_unknown_revocation_status()
                };
                let verifier = verifier.build().map_err(|e| match (&e, &self.crl) {
                    (rustls::server::VerifierBuilderError::InvalidCrl(_), Some(crl)) => {
                        format!("{} {}: {e}", self.flags.crl, crl.display())
                    }
                    _ => format!("{} {}: {e}", self.flags.ca, path.display()),
                })?;
                // Version 1 lists, which rustls does not read, are
                // checked once it has verified the chain.
                let verifier = if crls.v1.is_empty() {
                    verifier
                } else {
                    RevokedV1::wrap(verifier, crls.v1)
                };
                let verifier = if crl_count > 0 {
                    LogRevoked::wrap(verifier, self.flags.crl)
                } else {
                    verifier
                };
                let verifier = match &self.allowed {
                    Some(allowed) => AllowedPeer::wrap(verifier, allowed.clone()),
                    None => verifier,
                };
                (builder.with_client_cert_verifier(verifier), trusted)
            }
            _ => (builder.with_no_client_auth(), 0),
        };
        // Fails when the key does not belong to the certificate, which is
        // what a pair caught between its two writes looks like.
        let mut config = builder.with_single_cert(chain, key).map_err(|e| {
            let why = match e {
                rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                    "the key does not belong to the certificate".to_string()
                }
                e => e.to_string(),
            };
            format!(
                "{} {} with {} {}: {why}",
                self.flags.cert,
                self.cert.display(),
                self.flags.key,
                self.key.display()
            )
        })?;
        config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()];
        if let Some(first) = self.first_protocol {
            // First, since the server's order decides: a member dialling
            // a framed lane also offers h2 (to tell an older member apart).
            config.alpn_protocols.insert(0, first.to_vec());
        }
        Ok((
            config,
            Loaded {
                summary,
                trusted_cas,
                crls: crl_count,
            },
        ))
    }
}

/// What a successful load logs.
struct Loaded {
    summary: Option<Summary>,
    /// CA certificates client certificates are verified against; with any,
    /// a client must present a certificate one of them signed.
    trusted_cas: usize,
    /// Certificate revocation lists in force.
    crls: usize,
}

impl Loaded {
    /// What the log says of client certificates: with a trusted CA every
    /// client must present one it signed (as in etcd).
    fn client_certificates(&self) -> &'static str {
        if self.trusted_cas > 0 {
            "required"
        } else {
            "not asked for"
        }
    }

    fn log(&self, what: &str) {
        let (subject, serial, not_after) = match &self.summary {
            Some(s) => (s.subject.as_str(), s.serial.as_str(), s.not_after.as_str()),
            None => ("(unreadable)", "(unreadable)", "(unreadable)"),
        };
        let client_certificates = self.client_certificates();
        tracing::info!(
            subject,
            serial,
            not_after,
            trusted_cas = self.trusted_cas,
            client_certificates,
            crls = self.crls,
            "{what}"
        );
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        if let Some(s) = self.summary.as_ref().filter(|s| s.not_after_unix < now) {
            tracing::warn!(
                subject = %s.subject,
                not_after = %s.not_after,
                "the server certificate has expired; clients will refuse it"
            );
        }
    }
}

/// How a reload was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    /// A periodic check: only changed files are loaded.
    Poll,
    /// SIGHUP: the files are loaded even if unchanged.
    Hangup,
}

/// Keeps [`Live`] up to date with the certificate files.
pub(crate) struct Reloader {
    files: Files,
    live: Live,
    /// What the live configuration was built from.
    loaded: Contents,
    /// The last load error and when it was logged.
    failure: Option<(String, Instant)>,
    #[cfg(unix)]
    hangup: Option<tokio::signal::unix::Signal>,
}

impl Reloader {
    /// Loads the files named by `config`. At startup an error is fatal, as
    /// it always was: there is no previous configuration to fall back on.
    pub(crate) fn new(config: &Config) -> Result<Reloader, String> {
        Reloader::load(Files::from_config(config)?)
    }

    /// Loads cluster mode's peer TLS files (`--peer-cert-file` and
    /// friends), for the peer listeners; `first_protocol` is offered in
    /// ALPN before h2 (the framed Raft lanes' protocol).
    pub(crate) fn for_peers(
        peer: &PeerTls,
        first_protocol: Option<&'static [u8]>,
    ) -> Result<Reloader, String> {
        Reloader::load(Files::from_peer(peer, first_protocol))
    }

    fn load(files: Files) -> Result<Reloader, String> {
        let contents = files.read()?;
        let (server, loaded) = files.build(&contents)?;
        loaded.log(files.flags.loaded);
        Ok(Reloader {
            files,
            live: Live(Arc::new(RwLock::new(Arc::new(server)))),
            loaded: contents,
            failure: None,
            #[cfg(unix)]
            hangup: None,
        })
    }

    /// Reloads on SIGHUP from now on. Called before the listeners accept
    /// anything, so that a SIGHUP sent once the server answers never meets
    /// the default action (ending the process). Only servers with https://
    /// listeners take SIGHUP over; others keep the default.
    pub(crate) fn listen_for_hangup(&mut self) {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            match signal(SignalKind::hangup()) {
                Ok(s) => self.hangup = Some(s),
                Err(e) => tracing::warn!(error = %e, "cannot reload TLS certificates on SIGHUP"),
            }
        }
    }

    /// The configuration new connections use.
    pub(crate) fn live(&self) -> Live {
        self.live.clone()
    }

    /// Checks the files every `interval` (never if it is zero) and on
    /// SIGHUP, until `stop` says the server is stopping.
    pub(crate) async fn run(mut self, interval: Duration, mut stop: watch::Receiver<bool>) {
        let mut ticks = (!interval.is_zero()).then(|| {
            let mut t = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        loop {
            let trigger = tokio::select! {
                _ = stop.wait_for(|stopped| *stopped) => return,
                _ = tick(&mut ticks) => Trigger::Poll,
                Some(()) = self.hangup() => Trigger::Hangup,
            };
            // Reading and parsing a few small files; no need to leave the
            // async worker for it.
            self.reload(trigger);
        }
    }

    /// The next SIGHUP; never, without a handler.
    async fn hangup(&mut self) -> Option<()> {
        #[cfg(unix)]
        if let Some(s) = self.hangup.as_mut() {
            return s.recv().await;
        }
        std::future::pending().await
    }

    /// Loads the files if they changed (or always, on SIGHUP) and swaps
    /// the new configuration in; on failure keeps the old one and warns.
    /// Returns whether a new configuration went live.
    fn reload(&mut self, trigger: Trigger) -> bool {
        let result = self.files.read().and_then(|contents| {
            if trigger == Trigger::Poll && contents == self.loaded {
                return Ok(None);
            }
            let built = self.files.build(&contents)?;
            Ok(Some((contents, built)))
        });
        match result {
            Ok(None) => {
                // Back to what is live (say, a rotation that was undone).
                if self.failure.take().is_some() {
                    tracing::info!("the TLS files are loadable again; nothing changed");
                }
                false
            }
            Ok(Some((contents, (server, loaded)))) => {
                *self.live.0.write() = Arc::new(server);
                self.loaded = contents;
                self.failure = None;
                loaded.log(match trigger {
                    Trigger::Poll => {
                        "reloaded TLS certificates (files changed); new connections use them"
                    }
                    Trigger::Hangup => {
                        "reloaded TLS certificates (SIGHUP); new connections use them"
                    }
                });
                true
            }
            Err(error) => {
                let now = Instant::now();
                let repeat = match &self.failure {
                    Some((last, at)) => *last != error || now.duration_since(*at) >= REPEAT_WARNING,
                    None => true,
                };
                if repeat || trigger == Trigger::Hangup {
                    tracing::warn!(
                        error = %error,
                        "cannot reload TLS certificates; keeping the previous ones for new connections until the files load (certificate and matching key)"
                    );
                    self.failure = Some((error, now));
                }
                false
            }
        }
    }
}

/// The next tick; never, when polling is off.
async fn tick(ticks: &mut Option<tokio::time::Interval>) {
    match ticks {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// The TLS connections made over `tcp`'s connections, each handshaken with
/// the configuration current when it was accepted. Handshakes run in their
/// own tasks, so a slow or silent peer never holds up the others; one that
/// fails or times out is dropped (logged at debug, as tonic does).
/// Dropping the stream (when the server stops) cancels handshakes still
/// under way.
pub(crate) fn incoming<S>(
    tcp: S,
    live: Live,
) -> impl Stream<Item = io::Result<TlsStream<TcpStream>>> + Send
where
    S: Stream<Item = io::Result<TcpStream>> + Send + 'static,
{
    handshaken(tcp, live, HANDSHAKE_TIMEOUT)
}

/// [`incoming`] with the handshake timeout given (tests shorten it).
fn handshaken<S>(
    tcp: S,
    live: Live,
    timeout: Duration,
) -> impl Stream<Item = io::Result<TlsStream<TcpStream>>> + Send
where
    S: Stream<Item = io::Result<TcpStream>> + Send + 'static,
{
    let tcp = Box::pin(tcp);
    futures::stream::unfold(
        (tcp, JoinSet::<Option<TlsStream<TcpStream>>>::new(), live),
        move |(mut tcp, mut handshakes, live)| async move {
            loop {
                tokio::select! {
                    accepted = tcp.next() => match accepted {
                        Some(Ok(stream)) => {
                            let acceptor = TlsAcceptor::from(live.current());
                            handshakes.spawn(async move {
                                let peer = stream.peer_addr().ok();
                                match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
                                    Ok(Ok(tls)) => Some(tls),
                                    Ok(Err(e)) => {
                                        tracing::debug!(?peer, error = %e, "TLS handshake failed");
                                        None
                                    }
                                    Err(_) => {
                                        tracing::debug!(?peer, "TLS handshake timed out");
                                        None
                                    }
                                }
                            });
                        }
                        Some(Err(e)) => return Some((Err(e), (tcp, handshakes, live))),
                        None => return None,
                    },
                    Some(done) = handshakes.join_next() => {
                        if let Ok(Some(tls)) = done {
                            return Some((Ok(tls), (tcp, handshakes, live)));
                        }
                    }
                }
            }
        },
    )
}

#[cfg(test)]
#[path = "reload_tests.rs"]
mod tests;
