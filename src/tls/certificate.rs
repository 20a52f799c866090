//! The fields of a certificate ephd reads itself: its subject, serial
//! number and end of validity, to tell an operator which certificate is
//! served or refused; its common name, which etcd compares with
//! `--peer-cert-allowed-cn` and takes as the user of a request without a
//! token under `--client-cert-auth` (read as Go's `Subject.CommonName`);
//! and its issuer and serial, as a revocation list names them.
//!
//! rustls and webpki verify certificates but do not expose these fields;
//! `x509-parser` reads them from the DER rustls is handed. Anything it
//! cannot parse gives `None`.

use std::fmt::Write as _;
use x509_parser::certificate::X509Certificate;
use x509_parser::der_parser::asn1_rs::Tag;
use x509_parser::x509::{AttributeTypeAndValue, X509Name};

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

fn parse(der: &[u8]) -> Option<X509Certificate<'_>> {
    x509_parser::parse_x509_certificate(der)
        .ok()
        .map(|(_, cert)| cert)
}

/// Summarizes a DER-encoded certificate, or `None` if it does not parse.
pub(crate) fn summarize(der: &[u8]) -> Option<Summary> {
    let cert = parse(der)?;
    let serial = cert.raw_serial();
    let not_after = cert.validity().not_after.to_datetime();
    Some(Summary {
        subject: rfc4514(cert.subject()),
        serial: hex(serial.strip_prefix(&[0]).unwrap_or(serial)),
        not_after: format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            not_after.year(),
            u8::from(not_after.month()),
            not_after.day(),
            not_after.hour(),
            not_after.minute(),
            not_after.second()
        ),
        not_after_unix: not_after.unix_timestamp(),
    })
}

/// The subject's common name (the last CN attribute, as Go's
/// `Subject.CommonName` reads it): what `--peer-cert-allowed-cn` compares
/// and, with `--client-cert-auth`, the user of a request without a token.
pub(crate) fn common_name(der: &[u8]) -> Option<String> {
    let cert = parse(der)?;
    let cn = cert.subject().iter_common_name().last()?;
    Some(value(cn))
}

/// The issuer name (its DER) and the serial number (the content of its
/// INTEGER) of a DER certificate: what a revocation list ephd checks
/// itself is matched against (`crl_v1.rs`).
pub(crate) fn issuer_and_serial(der: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let cert = parse(der)?;
    Some((cert.issuer().as_raw().to_vec(), cert.raw_serial().to_vec()))
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02X}");
    }
    out
}

/// A name in RFC 4514 form: its relative names last to first, joined by
/// commas, the attributes of one joined by `+`.
fn rfc4514(name: &X509Name<'_>) -> String {
    let mut parts: Vec<String> = name
        .iter_rdn()
        .map(|rdn| {
            rdn.iter()
                .map(|attribute| format!("{}={}", attribute_name(attribute), value(attribute)))
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    parts.reverse();
    parts.join(",")
}

/// The short name of a common attribute type, or its dotted OID.
fn attribute_name(attribute: &AttributeTypeAndValue<'_>) -> String {
    let oid = attribute.attr_type().to_id_string();
    let short = match oid.as_str() {
        "2.5.4.3" => "CN",
        "2.5.4.5" => "serialNumber",
        "2.5.4.6" => "C",
        "2.5.4.7" => "L",
        "2.5.4.8" => "ST",
        "2.5.4.9" => "STREET",
        "2.5.4.10" => "O",
        "2.5.4.11" => "OU",
        _ => return oid,
    };
    short.to_string()
}

/// An attribute value: text for the string types certificates use
/// (RFC 4514's special characters escaped), else `#` and the hex of its
/// content (RFC 4514 §2.4 uses the whole encoding; the content is enough
/// to tell certificates apart in a log).
fn value(attribute: &AttributeTypeAndValue<'_>) -> String {
    let any = attribute.attr_value();
    match any.tag() {
        Tag::Utf8String | Tag::PrintableString | Tag::T61String | Tag::Ia5String => {
            let mut out = String::new();
            for c in String::from_utf8_lossy(any.data).chars() {
                if matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';') {
                    out.push('\\');
                }
                out.push(c);
            }
            out
        }
        _ => format!("#{}", hex(any.data)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_rustls::rustls::pki_types::{pem::PemObject, CertificateDer};

    /// Self-signed certificates made with `openssl req -x509` (P-256, the
    /// keys thrown away); the expected fields are what
    /// `openssl x509 -noout -subject -serial -enddate` prints.
    fn der(pem: &[u8]) -> Vec<u8> {
        CertificateDer::from_pem_slice(pem)
            .unwrap()
            .as_ref()
            .to_vec()
    }

    #[test]
    fn reads_subject_serial_and_expiry() {
        let der = der(include_bytes!("testdata/subject-attributes.crt"));
        let s = summarize(&der).expect("a well-formed certificate");
        assert_eq!(
            s.subject,
            "1.2.840.113549.1.9.1=a@b,CN=ephd-server,O=Example\\, Inc,C=DE"
        );
        assert_eq!(s.serial, "9F01");
        // GeneralizedTime (after 2049).
        assert_eq!(s.not_after, "2126-11-11T03:20:57Z");
        assert_eq!(s.not_after_unix, 4_950_040_857);
        assert_eq!(common_name(&der).as_deref(), Some("ephd-server"));
    }

    #[test]
    fn the_common_name_is_the_last_cn_and_none_without_one() {
        let two = der(include_bytes!("testdata/two-common-names.crt"));
        assert_eq!(common_name(&two).as_deref(), Some("second"));
        let s = summarize(&two).unwrap();
        assert_eq!(s.subject, "CN=second,O=org,CN=first");
        assert_eq!(s.serial, "07");
        // UTCTime (before 2050).
        assert_eq!(s.not_after, "2036-12-02T03:20:57Z");
        assert_eq!(s.not_after_unix, 2_111_800_857);
        let none = der(include_bytes!("testdata/no-common-name.crt"));
        assert_eq!(common_name(&none), None);
        assert_eq!(summarize(&none).unwrap().subject, "O=org");
    }

    #[test]
    fn gives_up_on_what_does_not_parse() {
        let der = der(include_bytes!("testdata/two-common-names.crt"));
        for cut in 0..der.len() {
            assert_eq!(summarize(&der[..cut]), None, "cut at {cut}");
            assert_eq!(common_name(&der[..cut]), None, "cut at {cut}");
        }
        assert_eq!(summarize(b"not a certificate"), None);
    }
}
