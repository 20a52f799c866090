//! etcd's auth flags: `--auth-token`, `--auth-token-ttl`, `--bcrypt-cost`.

use clap::Args;
use serde::Serialize;

/// How tokens are made and how passwords are hashed.
#[derive(Args, Debug, Clone, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct AuthFlags {
    /// Token kind that Authenticate hands out. Only etcd's default,
    /// `simple`, is served: random tokens this server maps to a user,
    /// valid on every member of a cluster. `jwt` is refused at startup
    /// (ephd does not sign tokens).
    #[arg(long, env = "EPHD_AUTH_TOKEN", default_value = "simple", value_parser = parse_auth_token)]
    pub auth_token: String,

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
        }
    }
}

/// `simple` (etcd's default); `jwt,...` and anything else are refused
/// with a clear message rather than served as something else.
fn parse_auth_token(v: &str) -> Result<String, String> {
    let kind = v.split(',').next().unwrap_or("").trim();
    match kind {
        "simple" => Ok("simple".to_string()),
        "jwt" => Err(
            "jwt tokens are not supported by ephd: use --auth-token simple (etcd's default)"
                .to_string(),
        ),
        other => Err(format!(
            "unknown token kind {other:?}: ephd serves --auth-token simple"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_is_served_and_jwt_is_refused_clearly() {
        assert_eq!(parse_auth_token("simple").unwrap(), "simple");
        let jwt = parse_auth_token("jwt,pub-key=a.pub,priv-key=a,sign-method=RS256").unwrap_err();
        assert!(jwt.contains("jwt tokens are not supported"), "{jwt}");
        assert!(parse_auth_token("paseto").is_err());
    }
}
