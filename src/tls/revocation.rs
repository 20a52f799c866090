//! `--client-crl-file` and `--peer-crl-file`: certificate revocation lists
//! that turn away a client (or connecting member) whose certificate they
//! revoke, as etcd's flags of the same names do on its listeners.
//!
//! rustls' client certificate verifier checks version 2 lists (RFC 5280;
//! what `openssl ca` writes when its configuration names a `crlnumber`
//! file, and what Go's and cfssl's tools write): `tls.rs` hands it the
//! lists parsed here. rustls reads no version 1 lists (what `openssl ca
//! -gencrl` writes without a `crlnumber` file), which etcd accepts;
//! `crl_v1.rs` reads those and checks them after rustls has verified the
//! chain. This module reads the file, sorts its lists by version and logs
//! refusals of either kind.
//! What a client sees matches etcd: a certificate whose serial a list of
//! its issuer names is refused and the connection ends; any other
//! certificate of the trusted CAs is served; a client without a
//! certificate is judged as without the lists. The differences, all in
//! what an operator writes rather than what a client sees:
//!
//! * etcd reads the file again at every connection; ephd reads it with
//!   the certificates (`--tls-reload-interval`, SIGHUP), so a newly
//!   revoked certificate is refused after the next reload. A file that
//!   stops loading keeps the previous lists (with a WARN), where etcd
//!   refuses every client certificate until it loads.
//! * etcd starts with a file it cannot read or parse and then refuses
//!   every connection that presents a certificate; ephd refuses to start,
//!   naming the flag and the file.
//! * etcd compares serial numbers only, with the first list in the file,
//!   without checking who signed it; ephd takes every list in the file and
//!   applies one to a certificate only when its issuer is that
//!   certificate's issuer (a list of another CA revokes nothing of this
//!   one). rustls also verifies a version 2 list's signature with the
//!   issuer's key; a version 1 list's is not verified, as in etcd
//!   (`crl_v1.rs` says why). An expired list still counts, as in etcd.
//! * Intermediate certificates the client sends are checked too (a list of
//!   the root can revoke an intermediate), as etcd checks every certificate
//!   the client sent.
//! * On the peer listener the refusal is the same, but its effect is not:
//!   etcd's Raft transport also carries a member's messages over
//!   connections the others dialled to it, so a member whose certificate
//!   is revoked still takes full part in etcd 3.4 (it was even elected
//!   leader when tried by hand). ephd's members send only on connections
//!   they dial, so a revoked member's messages never arrive and the others
//!   go on without it (CLUSTER.md, "Peer transport").

use super::crl_v1::{self, V1List};
use super::layered::{layer, ClientCheck};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_rustls::rustls::pki_types::{
    pem::PemObject, CertificateDer, CertificateRevocationListDer,
};
use tokio_rustls::rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use tokio_rustls::rustls::{CertificateError, Error};

/// The lists of one `--client-crl-file` or `--peer-crl-file`, by version:
/// rustls' verifier checks version 2 lists, [`crl_v1::RevokedV1`] version 1
/// ones.
#[derive(Debug, Default)]
pub(super) struct Lists {
    /// Version 2 lists, for rustls.
    pub(super) v2: Vec<CertificateRevocationListDer<'static>>,
    /// Version 1 lists, and version 2 ones rustls cannot verify, read
    /// here.
    pub(super) v1: Vec<V1List>,
}

impl Lists {
    /// How many lists are in force (the load log says it).
    pub(super) fn len(&self) -> usize {
        self.v2.len() + self.v1.len()
    }
}

/// The revocation lists in `bytes` (the file `path`, named by `flag`):
/// every PEM `X509 CRL` block, or the whole file as one DER list. Each is
/// parsed here so that a bad file is refused with a message that says
/// what is wrong with it.
pub(super) fn parse(bytes: &[u8], flag: &str, path: &Path) -> Result<Lists, String> {
    let at = || format!("{flag} {}", path.display());
    let looks_pem = bytes.windows(11).any(|w| w == b"-----BEGIN ");
    let crls = if looks_pem {
        CertificateRevocationListDer::pem_slice_iter(bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: {e}", at()))?
    } else {
        vec![CertificateRevocationListDer::from(bytes.to_vec())]
    };
    if crls.is_empty() || bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(format!(
            "{} holds no certificate revocation list (PEM \"-----BEGIN X509 CRL-----\" or DER)",
            at()
        ));
    }
    let count = crls.len();
    let mut lists = Lists::default();
    for (i, crl) in crls.into_iter().enumerate() {
        let which = || {
            if count > 1 {
                format!(" (list {} of {count})", i + 1)
            } else {
                String::new()
            }
        };
        if crl_v1::is_version_1(crl.as_ref()) {
            let list =
                V1List::parse(crl.as_ref()).map_err(|why| format!("{}{}: {why}", at(), which()))?;
            lists.v1.push(list);
        } else {
            webpki::OwnedCertRevocationList::from_der(crl.as_ref())
                .map_err(|e| format!("{}{}: {}", at(), which(), why(&e)))?;
            if crl_v1::signature_verifiable(crl.as_ref()) {
                lists.v2.push(crl);
            } else {
                // rustls would fail every certificate of its issuer.
                let list = V1List::parse(crl.as_ref())
                    .map_err(|why| format!("{}{}: {why}", at(), which()))?;
                tracing::warn!(
                    "{}{}: signed with an algorithm ephd cannot verify (SHA-1?); its serial \
                     numbers are checked without its signature, as etcd checks them",
                    at(),
                    which()
                );
                lists.v1.push(list);
            }
        }
    }
    Ok(lists)
}

/// What is wrong with a list that does not parse, in an operator's words.
fn why(e: &webpki::Error) -> String {
    match e {
        webpki::Error::UnsupportedCrlVersion => {
            "a certificate revocation list of a version other than 1 or 2".to_string()
        }
        webpki::Error::BadDer | webpki::Error::BadDerTime | webpki::Error::TrailingData(_) => {
            "not a certificate revocation list (it does not parse as one)".to_string()
        }
        e => format!("cannot use this certificate revocation list: {e:?}"),
    }
}

/// How often the refusal of one certificate is logged while it keeps
/// trying: a revoked member redials many times a second, and one line a
/// minute (with the count since) says as much as thousands.
const REPEAT_REFUSAL: Duration = Duration::from_secs(60);

/// Logs the certificates the verifier below (rustls', with
/// [`crl_v1::RevokedV1`] when there are version 1 lists) refuses because a
/// revocation list names them (etcd logs each such refusal too, ephd once
/// a minute per certificate); changes no result (`layered.rs`).
#[derive(Debug)]
pub(super) struct LogRevoked {
    /// The flag of the lists, for the log line.
    flag: &'static str,
    /// Per refused serial: when it was last logged, and refusals not
    /// logged since (the next line reports them as `repeated`).
    logged: Mutex<HashMap<String, (Instant, u64)>>,
}

impl LogRevoked {
    /// Wraps `inner`, whose lists came from `flag`.
    pub(super) fn wrap(
        inner: Arc<dyn ClientCertVerifier>,
        flag: &'static str,
    ) -> Arc<dyn ClientCertVerifier> {
        layer(
            inner,
            LogRevoked {
                flag,
                logged: Mutex::new(HashMap::new()),
            },
        )
    }

    /// Logs the refusal of `cert`, unless it was logged less than
    /// [`REPEAT_REFUSAL`] ago.
    fn refused(&self, cert: &CertificateDer<'_>) {
        let (subject, serial) = match super::certificate::summarize(cert) {
            Some(s) => (s.subject, s.serial),
            None => ("(unreadable)".to_string(), "(unreadable)".to_string()),
        };
        let now = Instant::now();
        let repeated = {
            let mut logged = self.logged.lock();
            // Certificates that stopped trying are forgotten, so the map
            // stays as small as the set of revoked certificates in use.
            logged.retain(|_, (at, _)| now.duration_since(*at) < 2 * REPEAT_REFUSAL);
            match logged.get_mut(&serial) {
                Some((at, since)) if now.duration_since(*at) < REPEAT_REFUSAL => {
                    *since += 1;
                    return;
                }
                Some((at, since)) => {
                    *at = now;
                    std::mem::take(since)
                }
                None => {
                    logged.insert(serial.clone(), (now, 0));
                    0
                }
            }
        };
        tracing::warn!(
            subject,
            serial,
            crl = self.flag,
            repeated,
            "rejected connection: its certificate (or one it chains through) is revoked; \
             further refusals of it are logged once a minute"
        );
    }
}

impl ClientCheck for LogRevoked {
    fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        below: Result<ClientCertVerified, Error>,
    ) -> Result<ClientCertVerified, Error> {
        if let Err(Error::InvalidCertificate(CertificateError::Revoked)) = &below {
            self.refused(end_entity);
        }
        below
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Empty lists of a P-256 test CA (valid for a century), as `openssl ca
    // -gencrl` writes them with and without a crlnumber file.
    const V2_PEM: &[u8] = include_bytes!("testdata/crl-v2.pem");
    const V2_DER: &[u8] = include_bytes!("testdata/crl-v2.der");
    const V1_PEM: &[u8] = include_bytes!("testdata/crl-v1.pem");
    /// A version 1 list revoking two serials (`crl_v1_tests.rs`).
    const V1_REVOKING_PEM: &[u8] = include_bytes!("testdata/crl-v1-revoking.pem");

    #[test]
    fn pem_lists_one_or_more_and_a_der_list_load() {
        assert_eq!(parsed(V2_PEM), Ok((1, 0)));
        assert_eq!(parsed(V2_DER), Ok((1, 0)));
        let two = [V2_PEM, V2_PEM].concat();
        assert_eq!(parsed(&two), Ok((2, 0)));
    }

    #[test]
    fn version_1_lists_load_alone_and_mixed_with_version_2() {
        assert_eq!(parsed(V1_PEM), Ok((0, 1)));
        let mixed = [V2_PEM, V1_PEM, V1_REVOKING_PEM].concat();
        assert_eq!(parsed(&mixed), Ok((1, 2)));
        // DER, as `openssl crl -outform der` writes it.
        let der = CertificateRevocationListDer::from_pem_slice(V1_PEM).unwrap();
        assert_eq!(parsed(der.as_ref()), Ok((0, 1)));
    }

    #[test]
    fn a_version_1_list_that_does_not_parse_names_the_flag_and_path() {
        let der = CertificateRevocationListDer::from_pem_slice(V1_REVOKING_PEM).unwrap();
        // The serial 0A1B2C of its second entry made an OCTET STRING.
        let serial = [0x02, 0x03, 0x0a, 0x1b, 0x2c];
        let mut broken = der.as_ref().to_vec();
        let at = broken.windows(5).position(|w| w == serial).unwrap();
        broken[at] = 0x04;
        let e = parsed(&broken).unwrap_err();
        assert_eq!(
            e,
            "--client-crl-file /x/crl.pem: not a certificate revocation list \
             (it does not parse as one)"
        );
    }

    /// How many version 2 and version 1 lists `bytes` holds.
    fn parsed(bytes: &[u8]) -> Result<(usize, usize), String> {
        parse(bytes, "--client-crl-file", Path::new("/x/crl.pem")).map(|c| (c.v2.len(), c.v1.len()))
    }

    #[test]
    fn a_version_2_list_signed_with_sha1_is_read_for_its_serials() {
        let sha1 = include_bytes!("testdata/crl-v2-sha1.pem");
        assert_eq!(parsed(sha1), Ok((0, 1)));
        let v2 = include_bytes!("testdata/crl-v2.pem");
        assert_eq!(
            parsed(v2),
            Ok((1, 0)),
            "ECDSA with SHA-256: rustls checks it"
        );
    }

    #[test]
    fn garbage_and_empty_files_are_refused_naming_the_flag_and_path() {
        for bad in [&b"garbage\n"[..], b"", b"\n  \n", b"\x30\x03\x02\x01\x01"] {
            let e = parsed(bad).unwrap_err();
            assert!(e.starts_with("--client-crl-file /x/crl.pem"), "{e}");
        }
        // PEM without a CRL in it (a certificate given by mistake).
        let cert = "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n";
        let e = parsed(cert.as_bytes()).unwrap_err();
        assert!(e.contains("holds no certificate revocation list"), "{e}");
        // A CRL block whose content is not a CRL.
        let crl = "-----BEGIN X509 CRL-----\nMAA=\n-----END X509 CRL-----\n";
        let e = parsed(crl.as_bytes()).unwrap_err();
        assert!(e.contains("not a certificate revocation list"), "{e}");
    }
}
