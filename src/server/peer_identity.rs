//! `--peer-cert-allowed-cn` and `--peer-cert-allowed-hostname`: a member
//! connecting to the peer port must present a certificate that chains to
//! the peer CA (rustls' verifier checks that first) AND names the allowed
//! common name or host name, as etcd checks them. Anything else fails the
//! TLS handshake before a Raft message is read, and the refusal is logged.
//!
//! The check itself (`peer_allowed.rs`) is shared with the dialling side,
//! which applies it to the certificates of the members this one dials
//! (`cluster/peer_dial.rs`), as etcd does.

use crate::config::PeerAllowed;
use crate::metrics::warnings::RateLimit;
use crate::peer_allowed::check;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_rustls::rustls::client::danger::HandshakeSignatureValid;
use tokio_rustls::rustls::pki_types::{CertificateDer, UnixTime};
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme,
};

/// How often a refusal is logged: a refused member dials again several
/// times a second.
const REPEAT_REFUSAL: Duration = Duration::from_secs(10);

/// rustls' client certificate verifier, plus the allowed name.
#[derive(Debug)]
pub(super) struct AllowedPeer {
    inner: Arc<dyn ClientCertVerifier>,
    allowed: PeerAllowed,
    /// When this verifier was built: the origin of `refusals`' clock.
    origin: Instant,
    refusals: RateLimit,
}

impl AllowedPeer {
    /// Wraps `inner` so that it also requires `allowed`.
    pub(super) fn wrap(inner: Arc<dyn ClientCertVerifier>, allowed: PeerAllowed) -> Arc<Self> {
        Arc::new(AllowedPeer {
            inner,
            allowed,
            origin: Instant::now(),
            refusals: RateLimit::new(REPEAT_REFUSAL),
        })
    }
}

impl ClientCertVerifier for AllowedPeer {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        match check(end_entity, &self.allowed) {
            Ok(()) => Ok(verified),
            Err(why) => {
                if let Some(suppressed) = self.refusals.admit(self.origin.elapsed()) {
                    tracing::warn!(
                        reason = %why,
                        suppressed,
                        "peer connection refused: its certificate (logged at most every 10 s; \
                         suppressed counts the refusals since the last line)"
                    );
                }
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
