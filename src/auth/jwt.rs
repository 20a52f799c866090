//! JWT tokens (`--auth-token jwt,...`): tokens signed by the member that
//! answers Authenticate and verified by every member that holds the key, so
//! no member keeps a table of them. The claims are etcd's (`username`,
//! `revision`: the auth revision when the token was signed, `exp`: Unix
//! seconds), and so are the sign methods' names; a token signed by a stock
//! etcd with the same key is accepted here and the other way round.
//!
//! The token's revision is the request's auth revision: once users, roles
//! or permissions change, older tokens get "revision of auth store is old"
//! and clients authenticate again, as with etcd.

use crate::error::{AuthError, Error};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// etcd's token lifetime when `ttl=` is not given.
pub const DEFAULT_JWT_TTL: Duration = Duration::from_secs(300);

/// What `--auth-token jwt,...` names, its key files already read.
pub struct JwtOptions<'a> {
    /// `sign-method`: etcd's (Go's JWT library's) name, such as `RS256`.
    pub sign_method: &'a str,
    /// `priv-key`: the PEM private key, or an HMAC method's secret (the
    /// file's bytes as they are).
    pub private_key: Option<Vec<u8>>,
    /// `pub-key`: the PEM public key (or certificate); alone, this member
    /// verifies tokens but signs none.
    pub public_key: Option<Vec<u8>>,
    /// `ttl`: how long a token is valid after it was signed.
    pub ttl: Duration,
}

/// The keys of one member's JWT tokens.
pub struct JwtTokens {
    algorithm: Algorithm,
    /// `None`: a verify-only member (a public key alone).
    signing: Option<EncodingKey>,
    verifying: DecodingKey,
    validation: Validation,
    ttl: Duration,
}

impl fmt::Debug for JwtTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtTokens")
            .field("algorithm", &self.algorithm)
            .field("verify_only", &self.signing.is_none())
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// The claims a token carries, as etcd writes them.
#[derive(Serialize)]
struct Signed<'a> {
    username: &'a str,
    revision: u64,
    exp: u64,
}

/// The claims read back: Go reads `revision` as a JSON number of any
/// form, so a float is taken too.
#[derive(Deserialize)]
struct Verified {
    username: String,
    revision: f64,
}

impl JwtTokens {
    /// The keys `options` name, checked as etcd checks them: a known sign
    /// method, at least one key, and a public key that belongs to the
    /// private one. The error says what is wrong, for the start-up refusal.
    pub fn new(options: JwtOptions<'_>) -> Result<Self, String> {
        let algorithm = algorithm(options.sign_method)?;
        let (signing, verifying) = match family(algorithm) {
            Family::Hmac => {
                let secret = options.private_key.ok_or(
                    "an HMAC sign method needs priv-key, the file holding the shared secret",
                )?;
                (
                    Some(EncodingKey::from_secret(&secret)),
                    DecodingKey::from_secret(&secret),
                )
            }
            family => asymmetric(family, options.private_key, options.public_key)?,
        };
        let mut validation = Validation::new(algorithm);
        // Go's JWT library: no leeway, and a token without `exp` does not
        // expire; there is no audience.
        validation.leeway = 0;
        validation.required_spec_claims.clear();
        validation.validate_aud = false;
        let tokens = JwtTokens {
            algorithm,
            signing,
            verifying,
            validation,
            ttl: options.ttl,
        };
        if tokens.signing.is_some() {
            let probe = tokens.sign("probe", 1, u64::MAX / 2)?;
            if tokens.info(&probe).is_none() {
                return Err("the public and private keys do not match".to_string());
            }
        }
        Ok(tokens)
    }

    /// A token for `user` at auth revision `revision`, valid for the
    /// configured TTL from now.
    pub fn assign(&self, user: &str, revision: u64) -> Result<String, Error> {
        if self.signing.is_none() {
            return Err(AuthError::VerifyOnly.into());
        }
        let exp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .saturating_add(self.ttl)
            .as_secs();
        self.sign(user, revision, exp).map_err(|e| {
            tracing::error!(error = %e, "failed to sign a JWT token");
            AuthError::SigningFailed.into()
        })
    }

    fn sign(&self, user: &str, revision: u64, exp: u64) -> Result<String, String> {
        let key = self.signing.as_ref().ok_or("no private key")?;
        let claims = Signed {
            username: user,
            revision,
            exp,
        };
        jsonwebtoken::encode(&Header::new(self.algorithm), &claims, key).map_err(|e| e.to_string())
    }

    /// The user and auth revision of a token signed with this member's key
    /// (or its pair) and method, not expired; `None` for anything else.
    pub fn info(&self, token: &str) -> Option<(String, u64)> {
        let data =
            jsonwebtoken::decode::<Verified>(token, &self.verifying, &self.validation).ok()?;
        let Verified { username, revision } = data.claims;
        // Go converts the number as `uint64(float64)`.
        Some((username, revision as u64))
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Hmac,
    Rsa,
    Ec,
    Ed,
}

/// etcd's sign method names that ephd signs with.
fn algorithm(name: &str) -> Result<Algorithm, String> {
    Ok(match name {
        "HS256" => Algorithm::HS256,
        "HS384" => Algorithm::HS384,
        "HS512" => Algorithm::HS512,
        "RS256" => Algorithm::RS256,
        "RS384" => Algorithm::RS384,
        "RS512" => Algorithm::RS512,
        "PS256" => Algorithm::PS256,
        "PS384" => Algorithm::PS384,
        "PS512" => Algorithm::PS512,
        "ES256" => Algorithm::ES256,
        "ES384" => Algorithm::ES384,
        "EdDSA" => Algorithm::EdDSA,
        "ES512" => {
            return Err(
                "sign-method ES512 is not supported by ephd (ES256 and ES384 are, \
                 and every RS, PS and HS method, and EdDSA)"
                    .to_string(),
            )
        }
        "" => return Err("sign-method is required (for example sign-method=RS256)".to_string()),
        other => {
            return Err(format!(
                "auth: invalid auth signature method {other:?} (etcd's names: RS256, \
                 RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA, HS256, HS384, HS512)"
            ))
        }
    })
}

fn family(algorithm: Algorithm) -> Family {
    match algorithm {
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => Family::Hmac,
        Algorithm::ES256 | Algorithm::ES384 => Family::Ec,
        Algorithm::EdDSA => Family::Ed,
        _ => Family::Rsa,
    }
}

/// The signing key (if a private key is given) and the verifying key (the
/// public key given, or else the private key's own).
fn asymmetric(
    family: Family,
    private: Option<Vec<u8>>,
    public: Option<Vec<u8>>,
) -> Result<(Option<EncodingKey>, DecodingKey), String> {
    let signing = match &private {
        Some(pem) => Some(private_key(family, pem).map_err(|e| format!("priv-key: {e}"))?),
        None => None,
    };
    let verifying = match (&public, &signing) {
        (Some(pem), _) => public_key(family, pem).map_err(|e| format!("pub-key: {e}"))?,
        (None, Some((_, own))) => own.clone(),
        (None, None) => {
            return Err(
                "auth: missing key data: give priv-key (to sign and verify) or pub-key \
                 (to verify only)"
                    .to_string(),
            )
        }
    };
    Ok((signing.map(|(key, _)| key), verifying))
}

/// A private key in PEM (PKCS#8, or PKCS#1 for RSA and SEC1 for EC, as
/// `openssl genrsa` and `openssl ecparam -genkey` write them) and its
/// public half.
fn private_key(family: Family, pem_text: &[u8]) -> Result<(EncodingKey, DecodingKey), String> {
    let block = pem::parse(pem_text).map_err(|e| format!("not a PEM key: {e}"))?;
    let der = block.contents();
    let bad = |e: ring::error::KeyRejected| format!("{} key rejected: {e}", block.tag());
    match (family, block.tag()) {
        (Family::Rsa, "RSA PRIVATE KEY" | "PRIVATE KEY") => {
            let pair = if block.tag() == "PRIVATE KEY" {
                RsaKeyPair::from_pkcs8(der)
            } else {
                RsaKeyPair::from_der(der)
            }
            .map_err(bad)?;
            let signing = EncodingKey::from_rsa_pem(pem_text).map_err(|e| e.to_string())?;
            Ok((signing, DecodingKey::from_rsa_der(pair.public().as_ref())))
        }
        (Family::Ec, "EC PRIVATE KEY" | "PRIVATE KEY") => {
            let pkcs8 = if block.tag() == "PRIVATE KEY" {
                der.to_vec()
            } else {
                sec1_to_pkcs8(der)?
            };
            let rng = ring::rand::SystemRandom::new();
            let pair = [
                &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                &ring::signature::ECDSA_P384_SHA384_FIXED_SIGNING,
            ]
            .into_iter()
            .find_map(|alg| EcdsaKeyPair::from_pkcs8(alg, &pkcs8, &rng).ok())
            .ok_or("EC key rejected: not a P-256 or P-384 key")?;
            let public = DecodingKey::from_ec_der(pair.public_key().as_ref());
            Ok((EncodingKey::from_ec_der(&pkcs8), public))
        }
        (Family::Ed, "PRIVATE KEY") => {
            let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der).map_err(bad)?;
            let public = DecodingKey::from_ed_der(pair.public_key().as_ref());
            Ok((EncodingKey::from_ed_der(der), public))
        }
        (_, tag) => Err(format!(
            "a {tag:?} PEM block is no private key for this sign-method"
        )),
    }
}

/// A public key (or certificate) in PEM for `family`.
fn public_key(family: Family, pem_text: &[u8]) -> Result<DecodingKey, String> {
    match family {
        Family::Rsa => DecodingKey::from_rsa_pem(pem_text),
        Family::Ec => DecodingKey::from_ec_pem(pem_text),
        Family::Ed => DecodingKey::from_ed_pem(pem_text),
        Family::Hmac => unreachable!("HMAC keys are secrets, not public keys"),
    }
    .map_err(|e| format!("not a public key for this sign-method: {e}"))
}

/// An EC private key in SEC1's form wrapped as PKCS#8, the form ring reads,
/// with the curve SEC1 names.
fn sec1_to_pkcs8(der: &[u8]) -> Result<Vec<u8>, String> {
    use sec1::der::{Decode, Encode};
    let key = sec1::EcPrivateKey::from_der(der).map_err(|e| format!("EC key: {e}"))?;
    let curve = key
        .parameters
        .and_then(|p| p.named_curve())
        .ok_or("EC key: no named curve")?;
    let info = sec1::pkcs8::PrivateKeyInfo {
        algorithm: sec1::pkcs8::AlgorithmIdentifierRef {
            oid: sec1::ALGORITHM_OID,
            parameters: Some((&curve).into()),
        },
        private_key: der,
        public_key: None,
    };
    info.to_der().map_err(|e| format!("EC key: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hmac(ttl: Duration) -> JwtTokens {
        JwtTokens::new(JwtOptions {
            sign_method: "HS256",
            private_key: Some(b"secret\n".to_vec()),
            public_key: None,
            ttl,
        })
        .unwrap()
    }

    #[test]
    fn a_signed_token_names_its_user_and_revision() {
        let t = hmac(DEFAULT_JWT_TTL);
        let token = t.assign("alice", 7).unwrap();
        assert_eq!(t.info(&token), Some(("alice".to_string(), 7)));
        assert_eq!(token.split('.').count(), 3);
    }

    #[test]
    fn expired_forged_and_foreign_tokens_are_refused() {
        let t = hmac(DEFAULT_JWT_TTL);
        let expired = t.sign("alice", 1, 1).unwrap();
        assert_eq!(t.info(&expired), None);
        let other = JwtTokens::new(JwtOptions {
            sign_method: "HS256",
            private_key: Some(b"other".to_vec()),
            public_key: None,
            ttl: DEFAULT_JWT_TTL,
        })
        .unwrap();
        assert_eq!(t.info(&other.assign("alice", 1).unwrap()), None);
        let mut forged = t.assign("alice", 1).unwrap();
        forged.push('x');
        assert_eq!(t.info(&forged), None);
        assert_eq!(t.info("abcdefghijklmnop.1"), None);
        assert_eq!(t.info(""), None);
    }

    /// An Ed25519 private key in PKCS#8 PEM (as `openssl genpkey` writes
    /// it) signs, and its public half, derived, verifies.
    #[test]
    fn a_private_key_alone_signs_and_verifies() {
        let rng = ring::rand::SystemRandom::new();
        let der = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pem_text = pem::encode(&pem::Pem::new("PRIVATE KEY", der.as_ref()));
        let t = JwtTokens::new(JwtOptions {
            sign_method: "EdDSA",
            private_key: Some(pem_text.into_bytes()),
            public_key: None,
            ttl: DEFAULT_JWT_TTL,
        })
        .unwrap();
        let token = t.assign("bob", 3).unwrap();
        assert_eq!(t.info(&token), Some(("bob".to_string(), 3)));
    }

    #[test]
    fn unknown_methods_and_missing_keys_are_refused_with_a_reason() {
        let options = |sign_method, private_key: Option<&[u8]>| JwtOptions {
            sign_method,
            private_key: private_key.map(<[u8]>::to_vec),
            public_key: None,
            ttl: DEFAULT_JWT_TTL,
        };
        let e = JwtTokens::new(options("XS256", Some(b"k"))).unwrap_err();
        assert!(e.contains("invalid auth signature method"), "{e}");
        let e = JwtTokens::new(options("ES512", Some(b"k"))).unwrap_err();
        assert!(e.contains("ES512 is not supported"), "{e}");
        let e = JwtTokens::new(options("RS256", None)).unwrap_err();
        assert!(e.contains("missing key data"), "{e}");
        let e = JwtTokens::new(options("HS256", None)).unwrap_err();
        assert!(e.contains("priv-key"), "{e}");
        let e = JwtTokens::new(options("RS256", Some(b"not pem"))).unwrap_err();
        assert!(e.starts_with("priv-key: not a PEM key"), "{e}");
    }
}
