//! etcd's auth flags: `--auth-token`, `--auth-token-ttl`, `--bcrypt-cost`.

use crate::auth::{JwtOptions, JwtTokens, DEFAULT_JWT_TTL};
use clap::Args;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;

/// How tokens are made and how passwords are hashed.
#[derive(Args, Debug, Clone, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct AuthFlags {
    /// Token kind that Authenticate hands out, as etcd writes it:
    /// `simple` (etcd's default: random tokens each member maps to a user)
    /// or `jwt,sign-method=RS256,priv-key=FILE,pub-key=FILE,ttl=5m`
    /// (signed tokens that every member holding the key verifies; a stock
    /// etcd with the same keys accepts them and the other way round).
    #[arg(long, env = "EPHD_AUTH_TOKEN", default_value = "simple", value_parser = parse_auth_token)]
    pub auth_token: AuthToken,

    /// Seconds a simple token stays valid without use (etcd's default,
    /// 300). A request with a lapsed token gets "etcdserver: invalid auth
    /// token", on which clients authenticate again.
    #[arg(long, env = "EPHD_AUTH_TOKEN_TTL", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub auth_token_ttl: u64,

    /// bcrypt cost of stored password hashes (etcd's default, 10; 4 to
    /// 31). Lower values make UserAdd and Authenticate faster, for tests.
    #[arg(long, env = "EPHD_BCRYPT_COST", default_value_t = 10, value_parser = clap::value_parser!(u32).range(4..=31))]
    pub bcrypt_cost: u32,
}

impl AuthFlags {
    /// The store's auth settings.
    pub fn auth_config(&self) -> crate::auth::AuthConfig {
        crate::auth::AuthConfig {
            token_ttl: std::time::Duration::from_secs(self.auth_token_ttl),
            bcrypt_cost: self.bcrypt_cost,
            jwt: match &self.auth_token {
                AuthToken::Simple => None,
                AuthToken::Jwt { keys, .. } => Some(keys.clone()),
            },
        }
    }
}

/// `--auth-token`, its JWT key files read.
#[derive(Debug, Clone)]
pub enum AuthToken {
    /// etcd's default.
    Simple,
    /// Signed tokens.
    Jwt {
        /// The flag's value as given (shown in the configuration dump).
        given: String,
        /// The keys.
        keys: Arc<JwtTokens>,
    },
}

impl Serialize for AuthToken {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            AuthToken::Simple => s.serialize_str("simple"),
            AuthToken::Jwt { given, .. } => s.serialize_str(given),
        }
    }
}

/// etcd's `--auth-token` syntax: the kind, then `,name=value` options
/// (each exactly one `=`, none twice). `jwt` reads its key files now, so a
/// missing or wrong key refuses the start, as in etcd.
fn parse_auth_token(v: &str) -> Result<AuthToken, String> {
    let mut parts = v.split(',');
    let kind = parts.next().unwrap_or_default();
    let mut options: HashMap<&str, &str> = HashMap::new();
    for part in parts {
        let Some((name, value)) = part.split_once('=').filter(|(_, v)| !v.contains('=')) else {
            return Err(format!(
                "auth: invalid auth options: {part:?} is not name=value"
            ));
        };
        if options.insert(name, value).is_some() {
            return Err(format!("auth: invalid auth options: {name} given twice"));
        }
    }
    match kind {
        "simple" => Ok(AuthToken::Simple),
        "jwt" => {
            let read = |name: &str| -> Result<Option<Vec<u8>>, String> {
                match options.get(name).filter(|f| !f.is_empty()) {
                    None => Ok(None),
                    Some(file) => std::fs::read(file)
                        .map(Some)
                        .map_err(|e| format!("jwt {name} {file}: {e}")),
                }
            };
            let ttl = match options.get("ttl").filter(|t| !t.is_empty()) {
                None => DEFAULT_JWT_TTL,
                Some(t) => super::parse_duration(t).map_err(|e| format!("jwt ttl: {e}"))?,
            };
            let keys = JwtTokens::new(JwtOptions {
                sign_method: options.get("sign-method").copied().unwrap_or_default(),
                private_key: read("priv-key")?,
                public_key: read("pub-key")?,
                ttl,
            })
            .map_err(|e| format!("jwt: {e}"))?;
            Ok(AuthToken::Jwt {
                given: v.to_string(),
                keys: Arc::new(keys),
            })
        }
        other => Err(format!(
            "unknown token kind {other:?}: ephd serves --auth-token simple or jwt,..."
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_and_jwt_are_read_as_etcd_reads_them() {
        assert!(matches!(parse_auth_token("simple"), Ok(AuthToken::Simple)));
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "shared").unwrap();
        let spec = format!("jwt,sign-method=HS256,priv-key={},ttl=1m", secret.display());
        match parse_auth_token(&spec) {
            Ok(AuthToken::Jwt { given, keys }) => {
                assert_eq!(given, spec);
                let token = keys.assign("root", 2).unwrap();
                assert_eq!(keys.info(&token), Some(("root".to_string(), 2)));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_token_options_are_refused_clearly() {
        let e = |v: &str| parse_auth_token(v).unwrap_err();
        assert!(e("paseto").contains("unknown token kind"));
        assert!(e("jwt,sign-method").contains("invalid auth options"));
        assert!(e("jwt,ttl=1s,ttl=2s").contains("given twice"));
        assert!(e("jwt,sign-method=RS256,priv-key=/nonexistent/key").contains("/nonexistent/key"));
        assert!(e("jwt,sign-method=RS256").contains("missing key data"));
        assert!(e("jwt,sign-method=HS256,priv-key=/dev/null,ttl=soon").contains("jwt ttl"));
    }
}
