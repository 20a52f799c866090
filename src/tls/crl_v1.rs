//! Version 1 certificate revocation lists for `--client-crl-file` and
//! `--peer-crl-file`: what `openssl ca -gencrl` writes when its
//! configuration names no `crlnumber` file, and what stock etcd 3.4
//! accepts. rustls' verifier reads only version 2 lists (`revocation.rs`
//! hands it those), so an operator moving from etcd with a version 1 file
//! would otherwise find ephd refusing to start.
//!
//! This module reads the revoked serial numbers of a version 1 list with
//! `x509-parser` (anything it cannot read is an error saying why, never a
//! panic) and, once rustls has verified
//! the chain, refuses a certificate whose issuer name is the list's issuer
//! and whose serial the list names ([`RevokedV1`]). The refusal is the
//! one rustls gives for a version 2 list (`CertificateError::Revoked`), so
//! it is logged the same way (`revocation::LogRevoked`), on the client and
//! the peer listeners alike, and reloads like every other TLS file.
//!
//! The list's signature is not verified, as etcd does not verify it:
//!
//! * The file is configuration, as trusted as `--trusted-ca-file` next to
//!   it: whoever can write one can write the other. A signature protects a
//!   list fetched from somewhere untrusted, which this is not.
//! * Version 1 lists come from old `openssl ca` set-ups, and many of them
//!   are signed with SHA-1, which rustls' verifier does not accept; a
//!   check would refuse, again, a file etcd uses, the very migration this
//!   module is for.
//!
//! Version 2 lists signed with an algorithm rustls cannot verify (SHA-1,
//! which old `openssl ca` set-ups also use with a `crlnumber` file) are
//! read here too ([`signature_verifiable`]): given to rustls, such a list
//! makes every certificate of its issuer fail, revoked or not, where etcd
//! checks the serials.
//!
//! The list applies only to certificates whose issuer name is the list's
//! issuer (compared as DER, as rustls compares them for version 2 lists),
//! where etcd compares serial numbers alone: a list of another CA revokes
//! nothing of this one, unless the two CAs share a name. As in etcd, the
//! list's validity dates and extensions are not consulted (an expired list
//! still counts), and every certificate the client sends is checked, the
//! intermediates too.

use std::collections::HashSet;
use std::sync::Arc;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::{CertificateError, Error};

use super::layered::{layer, ClientCheck};
use x509_parser::revocation_list::CertificateRevocationList;
use x509_parser::x509::X509Version;

fn parse_list(der: &[u8]) -> Option<CertificateRevocationList<'_>> {
    match x509_parser::parse_x509_crl(der) {
        Ok(([], list)) => Some(list),
        _ => None,
    }
}

/// Whether `der` is a version 1 list: it has no version (or spells out
/// 0, which DER forbids but which costs nothing to accept).
pub(super) fn is_version_1(der: &[u8]) -> bool {
    parse_list(der).is_some_and(|list| matches!(list.version(), None | Some(X509Version(0))))
}

/// Signature algorithms rustls verifies a version 2 list with, as the DER
/// of their OIDs: RSA PKCS#1 with SHA-256/384/512, RSA-PSS, ECDSA with
/// SHA-256/384, Ed25519.
const VERIFIABLE: &[&[u8]] = &[
    &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b],
    &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c],
    &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0d],
    &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0a],
    &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02],
    &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03],
    &[0x2b, 0x65, 0x70],
];

/// Whether the list `der` is signed with an algorithm rustls verifies;
/// false for anything else (SHA-1 above all) and for what does not parse.
pub(super) fn signature_verifiable(der: &[u8]) -> bool {
    parse_list(der)
        .is_some_and(|list| VERIFIABLE.contains(&list.signature_algorithm.algorithm.as_bytes()))
}

/// The serial numbers a list revokes, and whose they are: a version 1
/// list, or a version 2 one rustls cannot verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct V1List {
    /// The issuer `Name`, its DER.
    issuer: Vec<u8>,
    /// The revoked serial numbers, the contents of their INTEGERs.
    serials: HashSet<Vec<u8>>,
}

impl V1List {
    /// Reads a DER revocation list (RFC 5280 §5.1; version 1 lacks the
    /// version 2 parts); the error says what does not parse.
    pub(super) fn parse(der: &[u8]) -> Result<V1List, String> {
        let bad = |why: String| format!("not a certificate revocation list ({why})");
        let (rest, list) = x509_parser::parse_x509_crl(der).map_err(|e| bad(e.to_string()))?;
        if !rest.is_empty() {
            return Err(bad(format!("{} bytes follow the list", rest.len())));
        }
        let mut serials = HashSet::new();
        // Entry extensions (a reason code) are not consulted.
        for revoked in list.iter_revoked_certificates() {
            if revoked.raw_serial().is_empty() {
                // DER has no empty INTEGER; Go's parser refuses it too.
                return Err(bad("a revoked entry has an empty serial number".into()));
            }
            serials.insert(revoked.raw_serial().to_vec());
        }
        Ok(V1List {
            issuer: list.issuer().as_raw().to_vec(),
            serials,
        })
    }

    /// Whether this list revokes the certificate of `serial` that `issuer`
    /// issued (both as [`super::certificate::issuer_and_serial`] reads them).
    pub(super) fn revokes(&self, issuer: &[u8], serial: &[u8]) -> bool {
        self.issuer == issuer && self.serials.contains(serial)
    }

    /// Whether `cert` (DER) is revoked by this list.
    fn revokes_cert(&self, cert: &[u8]) -> bool {
        super::certificate::issuer_and_serial(cert)
            .is_some_and(|(issuer, serial)| self.revokes(&issuer, &serial))
    }
}

/// The version 1 lists, checked after rustls' verifier (`layered.rs`): a
/// certificate that passes the chain checks is refused, as a revoked one,
/// when one of the lists names it or a certificate sent with it.
#[derive(Debug)]
pub(super) struct RevokedV1 {
    lists: Vec<V1List>,
}

impl RevokedV1 {
    /// Wraps `inner` so that it also applies `lists`.
    pub(super) fn wrap(
        inner: Arc<dyn ClientCertVerifier>,
        lists: Vec<V1List>,
    ) -> Arc<dyn ClientCertVerifier> {
        layer(inner, RevokedV1 { lists })
    }
}

impl ClientCheck for RevokedV1 {
    fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        below: Result<ClientCertVerified, Error>,
    ) -> Result<ClientCertVerified, Error> {
        let verified = below?;
        let mut sent =
            std::iter::once(end_entity.as_ref()).chain(intermediates.iter().map(|c| c.as_ref()));
        let revoked = sent.any(|cert| self.lists.iter().any(|list| list.revokes_cert(cert)));
        if revoked {
            return Err(Error::InvalidCertificate(CertificateError::Revoked));
        }
        Ok(verified)
    }
}

#[cfg(test)]
#[path = "crl_v1_tests.rs"]
mod tests;
