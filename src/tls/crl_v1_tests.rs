//! The version 1 list reader against lists `openssl ca -gencrl` wrote
//! without a crlnumber file (P-256, valid for a century; the CA keys were
//! thrown away): `crl-v1.pem` revokes nothing; `crl-v1-revoking.pem`, of
//! `crl-v1-ca.crt`, revokes `crl-v1-revoked.crt` (serial 0A1B2C) and
//! serial 80, but not `crl-v1-served.crt` (0A1B2D) of the same CA.

use super::*;
use tokio_rustls::rustls::pki_types::{pem::PemObject, CertificateRevocationListDer};

const EMPTY_PEM: &[u8] = include_bytes!("testdata/crl-v1.pem");
const REVOKING_PEM: &[u8] = include_bytes!("testdata/crl-v1-revoking.pem");
const V2_PEM: &[u8] = include_bytes!("testdata/crl-v2.pem");
const CA: &[u8] = include_bytes!("testdata/crl-v1-ca.crt");
const REVOKED: &[u8] = include_bytes!("testdata/crl-v1-revoked.crt");
const SERVED: &[u8] = include_bytes!("testdata/crl-v1-served.crt");
/// A version 2 list signed with SHA-1 (`openssl ca -gencrl` with a
/// crlnumber file and `default_md = sha1`, RSA 2048, the CA key thrown
/// away), revoking serial 2A: `crl-v2-sha1-revoked.crt`.
const V2_SHA1_PEM: &[u8] = include_bytes!("testdata/crl-v2-sha1.pem");
const V2_SHA1_REVOKED: &[u8] = include_bytes!("testdata/crl-v2-sha1-revoked.crt");
/// A certificate of another CA (`CN=ephd-unit-test-ca`).
const OTHER_CA: &[u8] = include_bytes!("testdata/server-a.crt");

fn der(pem: &[u8]) -> Vec<u8> {
    CertificateRevocationListDer::from_pem_slice(pem)
        .unwrap()
        .as_ref()
        .to_vec()
}

fn cert(pem: &[u8]) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem)
        .unwrap()
        .as_ref()
        .to_vec()
}

#[test]
fn version_1_and_2_lists_are_told_apart() {
    assert!(is_version_1(&der(EMPTY_PEM)));
    assert!(is_version_1(&der(REVOKING_PEM)));
    assert!(!is_version_1(&der(V2_PEM)));
    assert!(!is_version_1(b"garbage"));
    assert!(!is_version_1(&[]));
}

#[test]
fn an_empty_list_names_its_issuer_and_revokes_nothing() {
    let list = V1List::parse(&der(EMPTY_PEM)).unwrap();
    assert!(list.serials.is_empty());
    let other = cert(OTHER_CA);
    let (issuer, _) = crate::tls::certificate::issuer_and_serial(&other).unwrap();
    assert_ne!(list.issuer, issuer, "another CA");
}

#[test]
fn the_listed_serials_of_the_lists_issuer_are_revoked_and_no_others() {
    let list = V1List::parse(&der(REVOKING_PEM)).unwrap();
    let expected: HashSet<Vec<u8>> = [vec![0x0a, 0x1b, 0x2c], vec![0x00, 0x80]].into();
    assert_eq!(list.serials, expected);
    // The list's issuer is its CA's subject.
    let ca = cert(CA);
    let (self_issuer, _) = crate::tls::certificate::issuer_and_serial(&ca).unwrap();
    assert_eq!(list.issuer, self_issuer);

    assert!(list.revokes_cert(&cert(REVOKED)));
    assert!(!list.revokes_cert(&cert(SERVED)), "same CA, not listed");
    // The same serial issued by another CA is not revoked.
    assert!(list.revokes(&self_issuer, &[0x0a, 0x1b, 0x2c]));
    let other = cert(OTHER_CA);
    let (other, _) = crate::tls::certificate::issuer_and_serial(&other).unwrap();
    assert!(!list.revokes(&other, &[0x0a, 0x1b, 0x2c]));
    assert!(
        !list.revokes(&self_issuer, &[0x80]),
        "serials compare as DER"
    );
    assert!(!list.revokes_cert(b"not a certificate"));
}

#[test]
fn garbage_is_an_error_naming_what_does_not_parse() {
    for bad in [&b""[..], b"garbage", b"\x30\x00", b"\x30\x03\x02\x01\x01"] {
        let e = V1List::parse(bad).unwrap_err();
        assert!(e.starts_with("not a certificate revocation list"), "{e}");
    }
    let mut trailing = der(REVOKING_PEM);
    trailing.push(0);
    let e = V1List::parse(&trailing).unwrap_err();
    assert!(e.contains("1 bytes follow the list"), "{e}");
}

#[test]
fn every_truncation_and_every_changed_byte_is_an_error_or_a_list_never_a_panic() {
    let whole = der(REVOKING_PEM);
    for end in 0..whole.len() {
        assert!(V1List::parse(&whole[..end]).is_err(), "cut at {end}");
    }
    let mut parsed = 0;
    for i in 0..whole.len() {
        for b in [0x00, 0x01, 0x30, 0x7f, 0x80, 0x81, 0x84, 0xa0, 0xff] {
            let mut changed = whole.clone();
            changed[i] = b;
            if let Ok(list) = V1List::parse(&changed) {
                assert!(list.serials.len() <= 2, "{list:?}");
                parsed += 1;
            }
        }
    }
    // Changes inside the signature, dates and names still parse.
    assert!(parsed > 0);
}

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
const BIT_STRING: u8 = 0x03;
const OID: u8 = 0x06;
const UTC_TIME: u8 = 0x17;
/// ecdsa-with-SHA256.
const ECDSA_SHA256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02];

/// A DER element (short lengths only: these lists are small).
fn el(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag, u8::try_from(content.len()).unwrap()];
    out.extend(content);
    out
}

/// The DER of an empty issuer name, as a hand-made list has.
fn no_name() -> Vec<u8> {
    el(SEQUENCE, &[])
}

/// A hand-made version 1 list (an empty issuer, an empty signature)
/// whose revoked list holds `entries`.
fn list_of(entries: &[Vec<u8>]) -> Vec<u8> {
    let algorithm = el(SEQUENCE, &el(OID, ECDSA_SHA256));
    let tbs = [
        algorithm.clone(),
        no_name(),
        el(UTC_TIME, b"261201000000Z"),
        el(SEQUENCE, &entries.concat()),
    ]
    .concat();
    let list = [el(SEQUENCE, &tbs), algorithm, el(BIT_STRING, &[0])].concat();
    el(SEQUENCE, &list)
}

#[test]
fn entries_need_a_serial_and_a_date_and_may_carry_extensions() {
    let date = el(UTC_TIME, b"261201000000Z");
    let serial = el(INTEGER, &[5]);
    let good = el(SEQUENCE, &[serial.clone(), date.clone()].concat());
    let with_reason = el(
        SEQUENCE,
        &[el(INTEGER, &[6]), date.clone(), el(SEQUENCE, &[])].concat(),
    );
    let parsed = V1List::parse(&list_of(&[good.clone(), with_reason.clone()])).unwrap();
    assert!(parsed.revokes(&no_name(), &[5]) && parsed.revokes(&no_name(), &[6]));
    assert!(!parsed.revokes(&no_name(), &[7]));
    for bad in [
        el(SEQUENCE, &serial),                                    // no date
        el(SEQUENCE, &date),                                      // no serial
        el(SEQUENCE, &[el(INTEGER, &[]), date.clone()].concat()), // empty serial
        el(INTEGER, &[5]),                                        // not an entry
    ] {
        let e = V1List::parse(&list_of(&[good.clone(), bad.clone()]))
            .expect_err(&format!("{bad:02x?}"));
        assert!(e.starts_with("not a certificate revocation list ("), "{e}");
    }
}

#[test]
fn an_explicit_version_0_is_read_as_version_1() {
    let entry = el(
        SEQUENCE,
        &[el(INTEGER, &[5]), el(UTC_TIME, b"261201000000Z")].concat(),
    );
    let algorithm = el(SEQUENCE, &el(OID, ECDSA_SHA256));
    let tbs = [
        el(INTEGER, &[0]),
        algorithm.clone(),
        no_name(),
        el(UTC_TIME, b"261201000000Z"),
        el(SEQUENCE, &entry),
    ]
    .concat();
    let list = [el(SEQUENCE, &tbs), algorithm, el(BIT_STRING, &[0])].concat();
    let list = el(SEQUENCE, &list);
    assert!(is_version_1(&list));
    assert!(V1List::parse(&list).unwrap().revokes(&no_name(), &[5]));
}

#[test]
fn a_version_2_list_rustls_cannot_verify_is_read_for_its_serials() {
    let sha1 = der(V2_SHA1_PEM);
    assert!(!is_version_1(&sha1));
    assert!(!signature_verifiable(&sha1), "SHA-1");
    assert!(signature_verifiable(&der(V2_PEM)), "ECDSA with SHA-256");
    assert!(!signature_verifiable(b"garbage"));
    let list = V1List::parse(&sha1).expect("a version 2 list reads too");
    assert!(list.revokes_cert(&cert(V2_SHA1_REVOKED)));
    assert!(
        !list.revokes_cert(&cert(REVOKED)),
        "another issuer's serial"
    );
}
