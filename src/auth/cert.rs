//! The subject common name of a client certificate: with
//! `--client-cert-auth`, etcd takes it as the user of a request that
//! carries no token. The certificate was verified by rustls before any
//! request arrives; this only walks the DER layout of RFC 5280's
//! `TBSCertificate` to its subject, bounds-checked, and gives up (`None`)
//! on anything unexpected.

use crate::der::{expect, tlv};

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const VERSION: u8 = 0xa0;
/// id-at-commonName, 2.5.4.3.
const CN_OID: &[u8] = &[0x55, 0x04, 0x03];

/// The first common name in the subject of the DER certificate `der`.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (cert, _) = expect(der, SEQUENCE)?;
    let (tbs, _) = expect(cert, SEQUENCE)?;
    let mut rest = tbs;
    let (tag, _, after) = tlv(rest)?;
    if tag == VERSION {
        rest = after;
    }
    // serial, signature, issuer, validity, then the subject.
    for _ in 0..4 {
        rest = tlv(rest)?.2;
    }
    let (mut rdns, _) = expect(rest, SEQUENCE)?;
    while !rdns.is_empty() {
        let (mut set, after) = expect(rdns, SET)?;
        rdns = after;
        while !set.is_empty() {
            let (attribute, after) = expect(set, SEQUENCE)?;
            set = after;
            let (oid, value) = expect(attribute, OID)?;
            if oid == CN_OID {
                let (_, value, _) = tlv(value)?;
                return String::from_utf8(value.to_vec()).ok();
            }
        }
    }
    None
}
