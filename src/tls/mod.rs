//! TLS, for both listeners and for dialling peers: everything that reads
//! certificates, keys and revocation lists and decides whom to trust.
//!
//! ```text
//! reload.rs         the configuration an https:// listener accepts with,
//!                   rebuilt while serving when its files change or on
//!                   SIGHUP; the stream of accepted TLS connections
//! revocation.rs     --client-crl-file / --peer-crl-file: which lists go to
//!                   rustls and which are checked here; the log of refusals
//! crl_v1.rs         revocation lists rustls does not check (version 1, or
//!                   signed with SHA-1), matched by issuer and serial
//! peer_identity.rs  --peer-cert-allowed-cn / -hostname on the peer listener
//! peer_allowed.rs   the allowed-name check itself, shared with dialling
//! layered.rs        a check run after rustls' own client verifier
//! certificate.rs    the fields of a certificate ephd reads: subject, serial,
//!                   end of validity (logs), common name (peers and auth)
//! ```
//!
//! Certificates and lists are parsed with `x509-parser`; chains and
//! signatures are verified by rustls and webpki.

pub(crate) mod certificate;
mod crl_v1;
mod layered;
pub(crate) mod peer_allowed;
mod peer_identity;
mod reload;
mod revocation;

pub(crate) use reload::{incoming, Live, Reloader};
