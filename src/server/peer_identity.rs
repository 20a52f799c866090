//! `--peer-cert-allowed-cn` and `--peer-cert-allowed-hostname`: a member
//! connecting to the peer port must present a certificate that chains to
//! the peer CA (rustls' verifier checks that first) AND names the allowed
//! common name or host name, as etcd checks them. Anything else fails the
//! TLS handshake before a Raft message is read, and the refusal is logged.
//!
//! etcd applies the same check to the certificates of the members it dials;
//! ephd checks connecting members only. Every pair of members talks both
//! ways, each verifying the other's client certificate here, so a member
//! with a certificate that names neither is refused by every other member
//! either way.

use crate::config::PeerAllowed;
use crate::x509;
use std::sync::Arc;
use tokio_rustls::rustls::client::danger::HandshakeSignatureValid;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme,
};

/// rustls' client certificate verifier, plus the allowed name.
#[derive(Debug)]
pub(super) struct AllowedPeer {
    inner: Arc<dyn ClientCertVerifier>,
    allowed: PeerAllowed,
}

impl AllowedPeer {
    /// Wraps `inner` so that it also requires `allowed`.
    pub(super) fn wrap(inner: Arc<dyn ClientCertVerifier>, allowed: PeerAllowed) -> Arc<Self> {
        Arc::new(AllowedPeer { inner, allowed })
    }
}

/// Whether `leaf` names what `allowed` asks for; why not otherwise.
pub(super) fn check(leaf: &CertificateDer<'_>, allowed: &PeerAllowed) -> Result<(), String> {
    match allowed {
        PeerAllowed::Cn(cn) => match x509::common_name(leaf) {
            Some(got) if got == *cn => Ok(()),
            Some(got) => Err(format!(
                "its common name {got:?} is not the allowed {cn:?} (--peer-cert-allowed-cn)"
            )),
            None => Err(format!(
                "it has no common name; {cn:?} is required (--peer-cert-allowed-cn)"
            )),
        },
        PeerAllowed::Hostname(host) => {
            let name = ServerName::try_from(host.as_str())
                .map_err(|e| format!("--peer-cert-allowed-hostname {host:?}: {e}"))?;
            let cert = webpki::EndEntityCert::try_from(leaf)
                .map_err(|e| format!("its certificate does not parse: {e}"))?;
            cert.verify_is_valid_for_subject_name(&name).map_err(|_| {
                format!(
                    "it is not valid for the allowed host name {host:?} \
                     (--peer-cert-allowed-hostname)"
                )
            })
        }
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
                tracing::warn!(reason = %why, "peer connection refused: its certificate");
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
