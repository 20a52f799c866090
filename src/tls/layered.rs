//! A client certificate check layered on rustls' verifier. ephd adds three
//! to what rustls checks of a connecting client or member: version 1
//! revocation lists (`crl_v1.rs`), the log of revoked certificates
//! (`revocation.rs`) and the allowed CN/host name of peers
//! (`peer_identity.rs`). Each sees the result of the verifier below it and
//! decides the final one; everything else rustls asks a verifier
//! (signatures, hints) goes to the verifier below unchanged.

use std::fmt::Debug;
use std::sync::Arc;
use tokio_rustls::rustls::client::danger::HandshakeSignatureValid;
use tokio_rustls::rustls::pki_types::{CertificateDer, UnixTime};
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::{DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};

/// One check on a client certificate, after the verifier below it.
pub(super) trait ClientCheck: Debug + Send + Sync {
    /// The result for the certificate `end_entity` sent with
    /// `intermediates`, given `below`, the result of the verifier below.
    fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        below: Result<ClientCertVerified, Error>,
    ) -> Result<ClientCertVerified, Error>;
}

/// `check` on top of the verifier `inner`.
#[derive(Debug)]
struct Layered<C> {
    inner: Arc<dyn ClientCertVerifier>,
    check: C,
}

/// Puts `check` on top of `inner`.
pub(super) fn layer<C: ClientCheck + 'static>(
    inner: Arc<dyn ClientCertVerifier>,
    check: C,
) -> Arc<dyn ClientCertVerifier> {
    Arc::new(Layered { inner, check })
}

impl<C: ClientCheck> ClientCertVerifier for Layered<C> {
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
        let below = self
            .inner
            .verify_client_cert(end_entity, intermediates, now);
        self.check.check(end_entity, intermediates, below)
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
