//! `--peer-cert-allowed-cn` and `--peer-cert-allowed-hostname`: a member
//! connecting to the peer port must present a certificate that chains to
//! the peer CA (rustls' verifier checks that first) AND names the allowed
//! common name or host name, as etcd checks them. Anything else fails the
//! TLS handshake before a Raft message is read, and the refusal is logged.
//!
//! The check itself (`peer_allowed.rs`) is shared with the dialling side,
//! which applies it to the certificates of the members this one dials
//! (`cluster/transport/peer_dial.rs`), as etcd does.

use crate::config::PeerAllowed;
use crate::metrics::warnings::RateLimit;
use crate::tls::peer_allowed::check;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::{CertificateError, Error};

use super::layered::{layer, ClientCheck};

/// How often a refusal is logged: a refused member dials again several
/// times a second.
const REPEAT_REFUSAL: Duration = Duration::from_secs(10);

/// The allowed name, checked once the verifier below has verified the
/// chain.
#[derive(Debug)]
pub(super) struct AllowedPeer {
    allowed: PeerAllowed,
    /// When this verifier was built: the origin of `refusals`' clock.
    origin: Instant,
    refusals: RateLimit,
}

impl AllowedPeer {
    /// Wraps `inner` so that it also requires `allowed`.
    pub(super) fn wrap(
        inner: Arc<dyn ClientCertVerifier>,
        allowed: PeerAllowed,
    ) -> Arc<dyn ClientCertVerifier> {
        layer(
            inner,
            AllowedPeer {
                allowed,
                origin: Instant::now(),
                refusals: RateLimit::new(REPEAT_REFUSAL),
            },
        )
    }
}

impl ClientCheck for AllowedPeer {
    fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        below: Result<ClientCertVerified, Error>,
    ) -> Result<ClientCertVerified, Error> {
        let verified = below?;
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
}
