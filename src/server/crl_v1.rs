//! Version 1 certificate revocation lists for `--client-crl-file` and
//! `--peer-crl-file`: what `openssl ca -gencrl` writes when its
//! configuration names no `crlnumber` file, and what stock etcd 3.4
//! accepts. rustls' verifier reads only version 2 lists (`revocation.rs`
//! hands it those), so an operator moving from etcd with a version 1 file
//! would otherwise find ephd refusing to start.
//!
//! This module reads the revoked serial numbers of a version 1 list with
//! the bounds-checked DER walker (`crate::der`; anything it cannot walk is
//! an error naming the part, never a panic) and, once rustls has verified
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

use crate::der::{expect, optional, tlv};

/// DER tags a revocation list uses.
const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const BIT_STRING: u8 = 0x03;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;
/// `[0] EXPLICIT Extensions` at the end of a `TBSCertList`.
const EXTENSIONS: u8 = 0xa0;

/// Whether `der` is a version 1 list: its to-be-signed part starts with
/// the signature algorithm (a SEQUENCE) where version 2 has its version
/// (an INTEGER), or with a version INTEGER of 0 (which DER forbids, but
/// which costs nothing to accept).
pub(super) fn is_version_1(der: &[u8]) -> bool {
    let tbs = expect(der, SEQUENCE).and_then(|(list, _)| expect(list, SEQUENCE));
    match tbs.and_then(|(tbs, _)| tlv(tbs)) {
        Some((SEQUENCE, _, _)) => true,
        Some((INTEGER, version, _)) => version == [0],
        _ => false,
    }
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

/// DER tag of an OBJECT IDENTIFIER.
const OID: u8 = 0x06;

/// Whether the list `der` is signed with an algorithm rustls verifies;
/// false for anything else (SHA-1 above all) and for what does not parse.
pub(super) fn signature_verifiable(der: &[u8]) -> bool {
    let algorithm = expect(der, SEQUENCE)
        .and_then(|(list, _)| expect(list, SEQUENCE))
        .and_then(|(_tbs, rest)| expect(rest, SEQUENCE))
        .and_then(|(algorithm, _)| expect(algorithm, OID));
    algorithm.is_some_and(|(oid, _)| VERIFIABLE.contains(&oid))
}

/// The serial numbers a list revokes, and whose they are: a version 1
/// list, or a version 2 one rustls cannot verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct V1List {
    /// The issuer `Name`, the content of its SEQUENCE.
    issuer: Vec<u8>,
    /// The revoked serial numbers, the contents of their INTEGERs.
    serials: HashSet<Vec<u8>>,
}

impl V1List {
    /// Reads a DER version 1 list (RFC 5280 §5.1 without the version 2
    /// parts); the error says which part does not parse.
    pub(super) fn parse(der: &[u8]) -> Result<V1List, String> {
        let bad = |what: &str| format!("not a certificate revocation list ({what} does not parse)");
        let (list, trailing) = expect(der, SEQUENCE).ok_or_else(|| bad("the list"))?;
        if !trailing.is_empty() {
            return Err(bad("what follows the list"));
        }
        let (tbs, rest) = expect(list, SEQUENCE).ok_or_else(|| bad("its signed part"))?;
        let (_algorithm, rest) =
            expect(rest, SEQUENCE).ok_or_else(|| bad("its signature algorithm"))?;
        match expect(rest, BIT_STRING) {
            Some((_signature, [])) => {}
            _ => return Err(bad("its signature")),
        }
        let mut rest = tbs;
        // Version 1 omits it (or spells out 0); version 2 says 1.
        if let Some((INTEGER, [0] | [1], after)) = tlv(rest) {
            rest = after;
        }
        let (_algorithm, rest) = expect(rest, SEQUENCE).ok_or_else(|| bad("its algorithm"))?;
        let (issuer, rest) = expect(rest, SEQUENCE).ok_or_else(|| bad("its issuer"))?;
        let rest = time(rest).ok_or_else(|| bad("its thisUpdate"))?;
        let rest = match tlv(rest) {
            Some((UTC_TIME | GENERALIZED_TIME, _, after)) => after,
            _ => rest,
        };
        let (revoked, rest) = optional(rest, SEQUENCE).ok_or_else(|| bad("its revoked list"))?;
        let (_extensions, rest) =
            optional(rest, EXTENSIONS).ok_or_else(|| bad("its extensions"))?;
        if !rest.is_empty() {
            return Err(bad("what follows its extensions"));
        }
        let mut serials = HashSet::new();
        let mut entries = revoked.unwrap_or_default();
        while !entries.is_empty() {
            let entry = expect(entries, SEQUENCE).ok_or_else(|| bad("a revoked entry"))?;
            entries = entry.1;
            let serial = match expect(entry.0, INTEGER) {
                Some((serial, rest)) if !serial.is_empty() => time(rest).and_then(|rest| {
                    // Entry extensions (a reason code) are not consulted.
                    match optional(rest, SEQUENCE)? {
                        (_, []) => Some(serial),
                        _ => None,
                    }
                }),
                _ => None,
            };
            let serial = serial.ok_or_else(|| bad("a revoked entry"))?;
            serials.insert(serial.to_vec());
        }
        Ok(V1List {
            issuer: issuer.to_vec(),
            serials,
        })
    }

    /// Whether this list revokes the certificate of `serial` that `issuer`
    /// issued (both as [`crate::x509::issuer_and_serial`] reads them).
    pub(super) fn revokes(&self, issuer: &[u8], serial: &[u8]) -> bool {
        self.issuer == issuer && self.serials.contains(serial)
    }

    /// Whether `cert` (DER) is revoked by this list.
    fn revokes_cert(&self, cert: &[u8]) -> bool {
        crate::x509::issuer_and_serial(cert)
            .is_some_and(|(issuer, serial)| self.revokes(issuer, serial))
    }
}

/// Skips a `Time` (UTCTime or GeneralizedTime); `None` if none is next.
fn time(input: &[u8]) -> Option<&[u8]> {
    match tlv(input)? {
        (UTC_TIME | GENERALIZED_TIME, _, rest) => Some(rest),
        _ => None,
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
