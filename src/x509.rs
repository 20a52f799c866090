//! Just enough X.509 to tell an operator which certificate is being served
//! (its subject, serial number and end of validity) and to read a
//! certificate's common name, from the DER that rustls is handed anyway.
//! The common name is what etcd compares with `--peer-cert-allowed-cn`
//! and takes as the user of a request without a token under
//! `--client-cert-auth`; both read it as Go's `Subject.CommonName` does.
//!
//! rustls and webpki check certificates but do not expose these fields, and
//! a full X.509 parser would be a large dependency for a log line. This
//! reader walks the fixed layout of `TBSCertificate` (RFC 5280 §4.1) with
//! bounds-checked slices and gives up (returns `None`) on anything it does
//! not expect; the certificate has been parsed by webpki before it is
//! summarized, so that only happens for exotic encodings.

use crate::der::{expect, tlv};
use std::fmt::Write as _;

/// What the logs say about a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Summary {
    /// The subject in RFC 4514 form (most specific attribute first), e.g.
    /// `CN=etcd-server,O=example`.
    pub subject: String,
    /// The serial number in hex, as `openssl x509 -serial` prints it.
    pub serial: String,
    /// The end of validity, RFC 3339 in UTC.
    pub not_after: String,
    /// The end of validity in seconds since the Unix epoch.
    pub not_after_unix: i64,
}

/// DER tags this reader uses.
const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const INTEGER: u8 = 0x02;
const OID: u8 = 0x06;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;
/// `[0] EXPLICIT Version` at the start of a v2/v3 `TBSCertificate`.
const VERSION: u8 = 0xa0;

/// Summarizes a DER-encoded certificate, or `None` if its layout is not
/// the one RFC 5280 describes.
pub(crate) fn summarize(der: &[u8]) -> Option<Summary> {
    let (serial, validity, subject) = fields(der)?;
    let (_not_before, validity) = time(validity)?;
    let (not_after, _) = time(validity)?;
    Some(Summary {
        subject: name(subject)?,
        serial: hex(serial.strip_prefix(&[0]).unwrap_or(serial)),
        not_after: not_after.rfc3339(),
        not_after_unix: not_after.unix(),
    })
}

/// The subject's common name (the last CN attribute, as Go's
/// `Subject.CommonName` reads it): what `--peer-cert-allowed-cn` compares
/// and, with `--client-cert-auth`, the user of a request without a token.
pub(crate) fn common_name(der: &[u8]) -> Option<String> {
    let (_, _, mut rdns) = fields(der)?;
    let mut cn = None;
    while !rdns.is_empty() {
        let (mut set, rest) = expect(rdns, SET)?;
        rdns = rest;
        while !set.is_empty() {
            let (attribute, rest) = expect(set, SEQUENCE)?;
            set = rest;
            let (oid, value) = expect(attribute, OID)?;
            let (tag, value, _) = tlv(value)?;
            if oid == [0x55, 0x04, 0x03] {
                cn = Some(attribute_value(tag, value));
            }
        }
    }
    cn
}

/// The issuer `Name` (the content of its SEQUENCE) and the serial number
/// (the content of its INTEGER) of a DER certificate, as a revocation
/// list names them: what a version 1 list is matched against
/// (`server/crl_v1.rs`).
pub(crate) fn issuer_and_serial(der: &[u8]) -> Option<(&[u8], &[u8])> {
    let (serial, issuer, _) = serial_and_issuer(der)?;
    Some((issuer, serial))
}

/// The serial number, validity and subject of a DER certificate.
fn fields(der: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let (serial, _issuer, rest) = serial_and_issuer(der)?;
    let (validity, rest) = expect(rest, SEQUENCE)?;
    let (subject, _) = expect(rest, SEQUENCE)?;
    Some((serial, validity, subject))
}

/// The serial number and issuer of a DER certificate, and the fields of
/// its `TBSCertificate` that follow them.
fn serial_and_issuer(der: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let (cert, _) = expect(der, SEQUENCE)?;
    let (tbs, _) = expect(cert, SEQUENCE)?;
    let mut rest = tbs;
    let (tag, _, after) = tlv(rest)?;
    if tag == VERSION {
        rest = after;
    }
    let (serial, rest) = expect(rest, INTEGER)?;
    let (_signature, rest) = expect(rest, SEQUENCE)?;
    let (issuer, rest) = expect(rest, SEQUENCE)?;
    Some((serial, issuer, rest))
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02X}");
    }
    out
}

/// A `Name` (a sequence of relative distinguished names) in RFC 4514 form.
fn name(mut rdns: &[u8]) -> Option<String> {
    let mut parts = Vec::new();
    while !rdns.is_empty() {
        let (mut set, rest) = expect(rdns, SET)?;
        rdns = rest;
        let mut attributes = Vec::new();
        while !set.is_empty() {
            let (attribute, rest) = expect(set, SEQUENCE)?;
            set = rest;
            let (oid, value) = expect(attribute, OID)?;
            let (tag, value, _) = tlv(value)?;
            attributes.push(format!(
                "{}={}",
                attribute_name(oid)?,
                attribute_value(tag, value)
            ));
        }
        parts.push(attributes.join("+"));
    }
    parts.reverse();
    Some(parts.join(","))
}

/// The short name of a common attribute type, or its dotted OID.
fn attribute_name(oid: &[u8]) -> Option<String> {
    const X520: [u8; 2] = [0x55, 0x04];
    if let Some(&[id]) = oid.strip_prefix(&X520[..]) {
        let short = match id {
            3 => "CN",
            5 => "serialNumber",
            6 => "C",
            7 => "L",
            8 => "ST",
            9 => "STREET",
            10 => "O",
            11 => "OU",
            _ => "",
        };
        if !short.is_empty() {
            return Some(short.to_string());
        }
    }
    dotted(oid)
}

/// An OID's content octets in dotted-decimal form.
fn dotted(oid: &[u8]) -> Option<String> {
    let mut arcs: Vec<u64> = Vec::new();
    let mut value: u64 = 0;
    for &b in oid {
        value = value.checked_mul(128)? | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            if arcs.is_empty() {
                let first = (value / 40).min(2);
                arcs.push(first);
                arcs.push(value - first * 40);
            } else {
                arcs.push(value);
            }
            value = 0;
        }
    }
    if arcs.is_empty() {
        return None;
    }
    Some(
        arcs.iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join("."),
    )
}

/// An attribute value: text for the string types certificates use, else
/// `#` and the hex of its content (RFC 4514 §2.4 uses the whole encoding;
/// the content is enough to tell certificates apart in a log).
fn attribute_value(tag: u8, value: &[u8]) -> String {
    const UTF8: u8 = 0x0c;
    const PRINTABLE: u8 = 0x13;
    const T61: u8 = 0x14;
    const IA5: u8 = 0x16;
    match tag {
        UTF8 | PRINTABLE | T61 | IA5 => {
            let mut out = String::new();
            for c in String::from_utf8_lossy(value).chars() {
                if matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';') {
                    out.push('\\');
                }
                out.push(c);
            }
            out
        }
        _ => format!("#{}", hex(value)),
    }
}

/// A calendar time in UTC, as `Validity` holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Time {
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
}

/// Reads a `Time` (UTCTime or GeneralizedTime, in DER's `...Z` form).
fn time(input: &[u8]) -> Option<(Time, &[u8])> {
    let (tag, text, rest) = tlv(input)?;
    let text = std::str::from_utf8(text).ok()?.strip_suffix('Z')?;
    // Byte slicing below must not split a character.
    if !text.is_ascii() {
        return None;
    }
    let digits = |s: &str| -> Option<u32> {
        if s.bytes().all(|b| b.is_ascii_digit()) {
            s.parse().ok()
        } else {
            None
        }
    };
    let (year, text) = match (tag, text.len()) {
        // RFC 5280 §4.1.2.5.1: two-digit years 50..99 are 19xx.
        (UTC_TIME, 12) => {
            let yy = i64::from(digits(&text[..2])?);
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &text[2..])
        }
        (GENERALIZED_TIME, 14) => (i64::from(digits(&text[..4])?), &text[4..]),
        _ => return None,
    };
    let t = Time {
        year,
        month: digits(&text[0..2])?,
        day: digits(&text[2..4])?,
        hour: digits(&text[4..6])?,
        minute: digits(&text[6..8])?,
        second: digits(&text[8..10])?,
    };
    let valid = (1..=12).contains(&t.month)
        && (1..=31).contains(&t.day)
        && t.hour < 24
        && t.minute < 60
        && t.second < 61;
    valid.then_some((t, rest))
}

impl Time {
    fn rfc3339(&self) -> String {
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }

    /// Seconds since the Unix epoch (the days-from-civil calculation for
    /// the proleptic Gregorian calendar).
    fn unix(&self) -> i64 {
        let (m, d) = (i64::from(self.month), i64::from(self.day));
        let y = if m <= 2 { self.year - 1 } else { self.year };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = era * 146_097 + doe - 719_468;
        days * 86_400
            + i64::from(self.hour) * 3600
            + i64::from(self.minute) * 60
            + i64::from(self.second)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DER element with a definite length.
    fn el(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        if content.len() < 0x80 {
            out.push(content.len() as u8);
        } else {
            let len = (content.len() as u32).to_be_bytes();
            let skip = len.iter().take_while(|&&b| b == 0).count();
            out.push(0x80 | (4 - skip) as u8);
            out.extend_from_slice(&len[skip..]);
        }
        out.extend_from_slice(content);
        out
    }

    fn rdn(oid: &[u8], tag: u8, value: &str) -> Vec<u8> {
        let attribute = [el(OID, oid), el(tag, value.as_bytes())].concat();
        el(SET, &el(SEQUENCE, &attribute))
    }

    /// A certificate with the fields this module reads (the signature and
    /// key parts are placeholders; nothing here checks them).
    fn certificate(serial: &[u8], not_after: Vec<u8>, subject: Vec<u8>) -> Vec<u8> {
        let tbs = [
            el(VERSION, &el(INTEGER, &[2])),
            el(INTEGER, serial),
            el(
                SEQUENCE,
                &el(OID, &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02]),
            ),
            el(SEQUENCE, &rdn(&[0x55, 0x04, 0x03], 0x0c, "issuer")),
            el(
                SEQUENCE,
                &[el(UTC_TIME, b"261201000000Z"), not_after].concat(),
            ),
            el(SEQUENCE, &subject),
            el(SEQUENCE, &[0u8; 200]),
        ]
        .concat();
        el(
            SEQUENCE,
            &[el(SEQUENCE, &tbs), el(SEQUENCE, &[]), el(0x03, &[0])].concat(),
        )
    }

    #[test]
    fn reads_subject_serial_and_expiry() {
        let subject = [
            rdn(&[0x55, 0x04, 0x06], 0x13, "DE"),
            rdn(&[0x55, 0x04, 0x0a], 0x0c, "Example, Inc"),
            rdn(&[0x55, 0x04, 0x03], 0x0c, "ephd-server"),
            rdn(
                &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x01],
                0x16,
                "a@b",
            ),
        ]
        .concat();
        let der = certificate(
            &[0x00, 0x9f, 0x01],
            el(GENERALIZED_TIME, b"20261203020557Z"),
            subject,
        );
        let s = summarize(&der).expect("a well-formed certificate");
        assert_eq!(
            s.subject,
            "1.2.840.113549.1.9.1=a@b,CN=ephd-server,O=Example\\, Inc,C=DE"
        );
        assert_eq!(s.serial, "9F01");
        assert_eq!(s.not_after, "2026-12-03T02:05:57Z");
        // date -u -d 2026-12-03T02:05:57Z +%s
        assert_eq!(s.not_after_unix, 1_796_263_557);
        assert_eq!(common_name(&der).as_deref(), Some("ephd-server"));
    }

    #[test]
    fn the_common_name_is_the_last_cn_and_none_without_one() {
        let two = [
            rdn(&[0x55, 0x04, 0x03], 0x0c, "first"),
            rdn(&[0x55, 0x04, 0x0a], 0x0c, "org"),
            rdn(&[0x55, 0x04, 0x03], 0x13, "second"),
        ]
        .concat();
        let der = certificate(&[1], el(UTC_TIME, b"491231235959Z"), two);
        assert_eq!(common_name(&der).as_deref(), Some("second"));
        let none = rdn(&[0x55, 0x04, 0x0a], 0x0c, "org");
        let der = certificate(&[1], el(UTC_TIME, b"491231235959Z"), none);
        assert_eq!(common_name(&der), None);
        for cut in 0..der.len() {
            assert_eq!(common_name(&der[..cut]), None, "cut at {cut}");
        }
    }

    #[test]
    fn two_digit_years_follow_rfc_5280() {
        let cn = rdn(&[0x55, 0x04, 0x03], 0x0c, "x");
        let late = certificate(&[1], el(UTC_TIME, b"491231235959Z"), cn.clone());
        assert_eq!(summarize(&late).unwrap().not_after, "2049-12-31T23:59:59Z");
        let early = certificate(&[1], el(UTC_TIME, b"700101000000Z"), cn);
        let s = summarize(&early).unwrap();
        assert_eq!(s.not_after, "1970-01-01T00:00:00Z");
        assert_eq!(s.not_after_unix, 0);
    }

    #[test]
    fn gives_up_on_what_it_does_not_expect() {
        let cn = rdn(&[0x55, 0x04, 0x03], 0x0c, "x");
        let der = certificate(&[1], el(UTC_TIME, b"491231235959Z"), cn.clone());
        for cut in 0..der.len() {
            assert_eq!(summarize(&der[..cut]), None, "cut at {cut}");
        }
        assert_eq!(summarize(b"not a certificate"), None);
        let bad_time = certificate(&[1], el(UTC_TIME, b"49123123595Z"), cn);
        assert_eq!(summarize(&bad_time), None);
    }
}
