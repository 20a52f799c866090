//! `--auth-token jwt,...` with keys shared between a stock etcd and ephd:
//! a token either one signs is accepted by the other, and both answer bad,
//! old and expired tokens, and a verify-only member's Authenticate, with
//! the same codes and texts.

use crate::auth::{raw_get, raw_token, set_up, with_token};
use crate::harness::{connect_channel, connect_client, free_port, Ephd, Server, StockEtcd};
use ephd::proto::etcdserverpb as pb;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl must be installed");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// A key pair as the usual openssl commands write it: RSA in PKCS#8, EC in
/// SEC1 (`ecparam -genkey`), with the public key beside it.
fn key_pair(dir: &Path, method: &str) -> (PathBuf, PathBuf) {
    let private = dir.join(format!("{method}.key"));
    let public = dir.join(format!("{method}.pub"));
    let (p, q) = (private.to_str().unwrap(), public.to_str().unwrap());
    match method {
        "RS256" => {
            openssl(&[
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
                p,
            ]);
            openssl(&["pkey", "-in", p, "-pubout", "-out", q]);
        }
        "ES256" => {
            openssl(&[
                "ecparam",
                "-name",
                "prime256v1",
                "-genkey",
                "-noout",
                "-out",
                p,
            ]);
            openssl(&["ec", "-in", p, "-pubout", "-out", q]);
        }
        other => panic!("no key recipe for {other}"),
    }
    (private, public)
}

fn spec(method: &str, private: Option<&Path>, public: &Path, ttl: &str) -> String {
    let mut s = format!("jwt,sign-method={method},pub-key={}", public.display());
    if let Some(p) = private {
        s.push_str(&format!(",priv-key={}", p.display()));
    }
    s.push_str(&format!(",ttl={ttl}"));
    s
}

type Answer = Result<(), (tonic::Code, String)>;

async fn get(endpoint: &str, token: &str, key: &str) -> Answer {
    raw_get(endpoint, token, key)
        .await
        .map(drop)
        .map_err(|s| (s.code(), s.message().to_string()))
}

async fn role_add(endpoint: &str, token: &str, role: &str) {
    let mut auth = pb::auth_client::AuthClient::new(connect_channel(endpoint).await);
    auth.role_add(with_token(
        pb::AuthRoleAddRequest { name: role.into() },
        token,
    ))
    .await
    .unwrap();
}

#[tokio::test]
async fn tokens_signed_by_etcd_or_ephd_are_accepted_by_the_other() {
    let dir = tempfile::tempdir().unwrap();
    for method in ["RS256", "ES256"] {
        let (private, public) = key_pair(dir.path(), method);
        let flag = spec(method, Some(&private), &public, "5m");
        let etcd = StockEtcd::start_with(&["--auth-token", &flag]);
        let ephd = Ephd::start(&["--auth-token", &flag, "--bcrypt-cost", "4"]);
        let (e, p) = (etcd.endpoint(), ephd.endpoint());
        set_up(&mut etcd.client().await).await;
        set_up(&mut ephd.client().await).await;

        let from_etcd = raw_token(&e, "u1", "p").await;
        let from_ephd = raw_token(&p, "u1", "p").await;
        assert_eq!(from_etcd.split('.').count(), 3, "{method}: {from_etcd}");
        assert_eq!(from_ephd.split('.').count(), 3, "{method}: {from_ephd}");
        for (server, token) in [(&e, &from_ephd), (&p, &from_etcd), (&p, &from_ephd)] {
            assert_eq!(get(server, token, "/app/x").await, Ok(()), "{method}");
        }
        // The same answers for a key u1 may not read and a token nobody
        // signed.
        for (key, token) in [("/other", from_etcd.as_str()), ("/app/x", "a.b.c")] {
            assert_eq!(
                get(&p, token, key).await,
                get(&e, token, key).await,
                "{method}: {key} {token}"
            );
        }
        assert_eq!(
            get(&p, "a.b.c", "/app/x").await,
            Err((
                tonic::Code::Unauthenticated,
                "etcdserver: invalid auth token".to_string()
            ))
        );

        // An auth change on both: tokens signed before it are old on both.
        let root_e = raw_token(&e, "root", "pw").await;
        let root_p = raw_token(&p, "root", "pw").await;
        role_add(&e, &root_e, "later").await;
        role_add(&p, &root_p, "later").await;
        let old = (
            tonic::Code::InvalidArgument,
            "etcdserver: revision of auth store is old".to_string(),
        );
        assert_eq!(get(&e, &from_ephd, "/app/x").await, Err(old.clone()));
        assert_eq!(get(&p, &from_etcd, "/app/x").await, Err(old));
        let fresh = raw_token(&e, "u1", "p").await;
        assert_eq!(get(&p, &fresh, "/app/x").await, Ok(()), "{method}");
    }
}

/// With the public key alone a member verifies tokens and signs none:
/// Authenticate gets etcd's verify-only error, and tokens from a member
/// that has the private key work.
#[tokio::test]
async fn a_verify_only_member_accepts_tokens_and_refuses_to_sign_like_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let (private, public) = key_pair(dir.path(), "RS256");
    let signer = Ephd::start(&[
        "--auth-token",
        &spec("RS256", Some(&private), &public, "5m"),
        "--bcrypt-cost",
        "4",
    ]);
    let verify_only = spec("RS256", None, &public, "5m");
    let etcd = StockEtcd::start_with(&["--auth-token", &verify_only]);
    let ephd = Ephd::start(&["--auth-token", &verify_only, "--bcrypt-cost", "4"]);
    for server in [signer.endpoint(), etcd.endpoint(), ephd.endpoint()] {
        set_up(&mut connect_client(&server).await).await;
    }
    let authenticate = |endpoint: String| async move {
        let mut auth = pb::auth_client::AuthClient::new(connect_channel(&endpoint).await);
        auth.authenticate(pb::AuthenticateRequest {
            name: "u1".into(),
            password: "p".into(),
        })
        .await
        .map(|r| r.into_inner().token)
        .map_err(|s| (s.code(), s.message().to_string()))
    };
    let refused = Err((
        tonic::Code::Unknown,
        "auth: token signing attempted with verify-only key".to_string(),
    ));
    assert_eq!(authenticate(etcd.endpoint()).await, refused);
    assert_eq!(authenticate(ephd.endpoint()).await, refused);
    let token = raw_token(&signer.endpoint(), "u1", "p").await;
    assert_eq!(get(&ephd.endpoint(), &token, "/app/x").await, Ok(()));
    assert_eq!(get(&etcd.endpoint(), &token, "/app/x").await, Ok(()));
}

/// A token is valid for the `ttl=` it was signed with, then invalid, on
/// which clients authenticate again.
#[tokio::test]
async fn a_jwt_token_expires_after_its_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let (private, public) = key_pair(dir.path(), "ES256");
    let ephd = Ephd::start(&[
        "--auth-token",
        &spec("ES256", Some(&private), &public, "2s"),
        "--bcrypt-cost",
        "4",
    ]);
    let p = ephd.endpoint();
    set_up(&mut ephd.client().await).await;
    let token = raw_token(&p, "u1", "p").await;
    assert_eq!(get(&p, &token, "/app/x").await, Ok(()));
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match get(&p, &token, "/app/x").await {
            Ok(()) => assert!(Instant::now() < deadline, "the token never expired"),
            Err(e) => {
                assert_eq!(
                    e,
                    (
                        tonic::Code::Unauthenticated,
                        "etcdserver: invalid auth token".to_string()
                    )
                );
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A key file that is missing or not a key refuses the start with a line
/// that names it, as etcd refuses to start.
#[test]
fn a_bad_jwt_key_refuses_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a key").unwrap();
    for (flag, message) in [
        (
            format!("jwt,sign-method=RS256,priv-key={}", junk.display()),
            "priv-key: not a PEM key".to_string(),
        ),
        (
            "jwt,sign-method=RS256,priv-key=/nonexistent/jwt.key".to_string(),
            "/nonexistent/jwt.key".to_string(),
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ephd"))
            .args(["--auth-token", &flag, "--listen-client-urls"])
            .arg(format!("http://127.0.0.1:{}", free_port()))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&message), "{stderr}");
    }
}
