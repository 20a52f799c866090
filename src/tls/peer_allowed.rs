//! `--peer-cert-allowed-cn` and `--peer-cert-allowed-hostname`: whether a
//! member's peer certificate names what is allowed. Both sides of a peer
//! connection ask it, after the certificate's chain to the peer CA is
//! verified: the peer listener of the certificates of connecting members
//! (`peer_identity.rs`) and the dialling side of the certificates
//! the dialled members serve (`cluster/transport/peer_dial.rs`), as etcd applies
//! the flags to both. One function, so both sides read the flags alike.

use super::certificate::common_name;
use crate::config::PeerAllowed;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

/// Whether `leaf` names what `allowed` asks for; why not otherwise.
pub(crate) fn check(leaf: &CertificateDer<'_>, allowed: &PeerAllowed) -> Result<(), String> {
    match allowed {
        PeerAllowed::Cn(cn) => match common_name(leaf) {
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
