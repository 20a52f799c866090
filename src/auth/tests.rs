//! The auth store on its own: etcd's rules and answers, in process.

use super::*;
use crate::error::Error;

fn store() -> AuthStore {
    AuthStore::new(AuthConfig {
        token_ttl: Duration::from_secs(300),
        bcrypt_cost: 4,
        ..AuthConfig::default()
    })
}

fn add_user(a: &AuthStore, name: &str, password: &str) {
    a.apply(&AuthOp::UserAdd {
        name: name.into(),
        password_hash: Some(hash_password(password, 4)),
    })
    .unwrap();
}

fn grant(a: &AuthStore, user: &str, role: &str) -> Result<()> {
    a.apply(&AuthOp::UserGrantRole {
        user: user.into(),
        role: role.into(),
    })
}

fn perm(kind: PermKind, key: &str, end: &[u8]) -> Permission {
    Permission {
        kind,
        key: key.as_bytes().to_vec(),
        range_end: end.to_vec(),
    }
}

fn auth_err(e: AuthError) -> Result<()> {
    Err(Error::Auth(e))
}

/// A store with root (password "pw") and user u1 (password "p") whose
/// role r1 may read and write `/a/` and read `k1`; auth enabled.
fn enabled() -> AuthStore {
    let a = store();
    add_user(&a, "root", "pw");
    grant(&a, "root", "root").unwrap();
    add_user(&a, "u1", "p");
    a.apply(&AuthOp::RoleAdd { name: "r1".into() }).unwrap();
    for p in [
        perm(PermKind::ReadWrite, "/a/", b"/a0"),
        perm(PermKind::Read, "k1", b""),
    ] {
        a.apply(&AuthOp::RoleGrantPermission {
            name: "r1".into(),
            perm: Some(p),
        })
        .unwrap();
    }
    grant(&a, "u1", "r1").unwrap();
    a.apply(&AuthOp::Enable).unwrap();
    a
}

fn login(a: &AuthStore, user: &str) -> AuthInfo {
    let token = a.new_token();
    a.apply(&AuthOp::Authenticate {
        name: user.into(),
        token: token.clone(),
    })
    .unwrap();
    a.caller(Some(&token), None).unwrap().unwrap()
}

#[test]
fn enable_needs_root_with_the_root_role() {
    let a = store();
    assert_eq!(
        a.apply(&AuthOp::Enable),
        auth_err(AuthError::RootUserNotExist)
    );
    add_user(&a, "root", "pw");
    assert_eq!(
        a.apply(&AuthOp::Enable),
        auth_err(AuthError::RootRoleNotExist)
    );
    // The root role may be granted before it exists.
    grant(&a, "root", "root").unwrap();
    assert!(!a.active(), "nothing to look at until auth is enabled");
    let rev = a.revision();
    a.apply(&AuthOp::Enable).unwrap();
    assert!(a.enabled() && a.active());
    assert_eq!(a.revision(), rev, "etcd does not count enabling");
    // Enabling again changes nothing either.
    a.apply(&AuthOp::Enable).unwrap();
    assert_eq!(a.revision(), rev);
}

#[test]
fn every_change_moves_the_revision_and_failures_do_not() {
    let a = store();
    assert_eq!(a.revision(), 1);
    add_user(&a, "u", "p");
    assert_eq!(a.revision(), 2);
    assert!(a
        .apply(&AuthOp::UserAdd {
            name: "u".into(),
            password_hash: None
        })
        .is_err());
    assert_eq!(a.revision(), 2);
    a.apply(&AuthOp::RoleAdd { name: "r".into() }).unwrap();
    grant(&a, "u", "r").unwrap();
    assert_eq!(a.revision(), 4);
    grant(&a, "u", "r").unwrap();
    assert_eq!(a.revision(), 4, "a role granted again is a no-op");
}

#[test]
fn names_and_lookups_fail_with_etcds_errors() {
    let a = store();
    let cases = [
        (
            AuthOp::UserAdd {
                name: String::new(),
                password_hash: None,
            },
            AuthError::UserEmpty,
        ),
        (
            AuthOp::RoleAdd {
                name: String::new(),
            },
            AuthError::RoleEmpty,
        ),
        (
            AuthOp::UserDelete { name: "x".into() },
            AuthError::UserNotFound,
        ),
        (
            AuthOp::RoleDelete { role: "x".into() },
            AuthError::RoleNotFound,
        ),
        (
            AuthOp::UserGrantRole {
                user: "x".into(),
                role: "r".into(),
            },
            AuthError::UserNotFound,
        ),
        (
            AuthOp::RoleGrantPermission {
                name: "x".into(),
                perm: None,
            },
            AuthError::RoleNotFound,
        ),
    ];
    for (op, want) in cases {
        assert_eq!(a.apply(&op), auth_err(want), "{op:?}");
    }
    add_user(&a, "u", "p");
    assert_eq!(grant(&a, "u", "nope"), auth_err(AuthError::RoleNotFound));
    assert_eq!(
        a.apply(&AuthOp::UserRevokeRole {
            name: "u".into(),
            role: "r".into()
        }),
        auth_err(AuthError::RoleNotGranted)
    );
    a.apply(&AuthOp::RoleAdd { name: "r".into() }).unwrap();
    assert_eq!(
        a.apply(&AuthOp::RoleAdd { name: "r".into() }),
        auth_err(AuthError::RoleAlreadyExist)
    );
    assert_eq!(
        a.apply(&AuthOp::RoleRevokePermission {
            role: "r".into(),
            key: b"k".to_vec(),
            range_end: vec![]
        }),
        auth_err(AuthError::PermissionNotGranted)
    );
    assert_eq!(
        a.apply(&AuthOp::RoleGrantPermission {
            name: "r".into(),
            perm: None
        }),
        auth_err(AuthError::PermissionNotGiven)
    );
}

#[test]
fn root_cannot_be_removed_while_enabled() {
    let a = enabled();
    for op in [
        AuthOp::UserDelete {
            name: "root".into(),
        },
        AuthOp::RoleDelete {
            role: "root".into(),
        },
        AuthOp::UserRevokeRole {
            name: "root".into(),
            role: "root".into(),
        },
    ] {
        assert_eq!(a.apply(&op), auth_err(AuthError::InvalidAuthMgmt), "{op:?}");
    }
}

#[test]
fn passwords_are_checked_by_bcrypt_and_never_stored_plain() {
    let a = enabled();
    assert_eq!(a.check_password("u1", "p"), Ok(()));
    assert_eq!(
        a.check_password("u1", "bad"),
        auth_err(AuthError::AuthFailed)
    );
    assert_eq!(
        a.check_password("nobody", "p"),
        auth_err(AuthError::AuthFailed)
    );
    a.apply(&AuthOp::UserAdd {
        name: "np".into(),
        password_hash: None,
    })
    .unwrap();
    assert_eq!(
        a.check_password("np", ""),
        auth_err(AuthError::NoPasswordUser)
    );
    let hash = a.state.read().users["u1"].password_hash.clone().unwrap();
    assert!(
        hash.starts_with("$2") && hash.len() == 60,
        "a bcrypt hash: {hash}"
    );
    let op = AuthOp::UserAdd {
        name: "x".into(),
        password_hash: Some(hash.clone()),
    };
    assert!(!format!("{op:?}").contains(&hash), "Debug hides the hash");
}

#[test]
fn authenticate_needs_auth_enabled() {
    let a = store();
    add_user(&a, "u", "p");
    assert_eq!(a.check_password("u", "p"), Err(Error::AuthNotEnabled));
    assert_eq!(
        a.apply(&AuthOp::Authenticate {
            name: "u".into(),
            token: "t.1".into()
        }),
        Err(Error::AuthNotEnabled)
    );
}

#[test]
fn permissions_cover_keys_ranges_and_prefixes() {
    let a = enabled();
    let u1 = login(&a, "u1");
    let ok = |k: &str, e: &[u8], want| a.check(&u1, want, k.as_bytes(), e).is_ok();
    assert!(ok("/a/x", b"", PermKind::Write));
    assert!(ok("/a/", b"/a0", PermKind::Read), "the whole prefix");
    assert!(ok("/a/b", b"/a/c", PermKind::Read), "a range inside it");
    assert!(!ok("/a/", b"/b", PermKind::Read), "a range beyond it");
    assert!(!ok("/b", b"", PermKind::Write));
    assert!(ok("k1", b"", PermKind::Read));
    assert!(!ok("k1", b"", PermKind::Write), "READ only");
    assert!(!ok("k1", b"k2", PermKind::Read), "a key is not a range");
    assert_eq!(
        a.check(&u1, PermKind::Write, b"/b", b""),
        auth_err(AuthError::PermissionDenied)
    );
    // root may do everything; a request without a user nothing.
    let root = login(&a, "root");
    assert!(a.check(&root, PermKind::Write, b"\0", &[0]).is_ok());
    assert_eq!(
        a.check(&AuthInfo::default(), PermKind::Read, b"/a/x", b""),
        auth_err(AuthError::UserEmpty)
    );
}

#[test]
fn adjacent_and_open_ended_grants_join() {
    let mut perms = Vec::new();
    perms::grant(&mut perms, perm(PermKind::Read, "a", b"c"));
    perms::grant(&mut perms, perm(PermKind::Read, "c", b"e"));
    perms::grant(&mut perms, perm(PermKind::Write, "x", &[0]));
    let p = |k: &str, e: &[u8], want| perms::permitted(perms.iter(), want, k.as_bytes(), e);
    assert!(p("a", b"e", PermKind::Read));
    assert!(!p("a", b"f", PermKind::Read));
    assert!(p("x", &[0], PermKind::Write));
    assert!(p("zzz", b"", PermKind::Write));
    assert!(p("y", b"z", PermKind::Write));
    assert!(!p("w", &[0], PermKind::Write));
    // Granting the same key and range again replaces the kind.
    perms::grant(&mut perms, perm(PermKind::ReadWrite, "a", b"c"));
    assert_eq!(perms.len(), 3);
    assert_eq!(perms[0].kind, PermKind::ReadWrite);
}

#[test]
fn an_auth_change_makes_checked_requests_stale() {
    let a = enabled();
    let u1 = login(&a, "u1");
    a.apply(&AuthOp::RoleAdd { name: "r2".into() }).unwrap();
    assert_eq!(
        a.check(&u1, PermKind::Read, b"k1", b""),
        auth_err(AuthError::AuthOldRevision)
    );
}

#[test]
fn tokens_die_with_disable_password_change_and_delete() {
    let a = enabled();
    let token = a.new_token();
    let auth = |t: &str| {
        a.apply(&AuthOp::Authenticate {
            name: "u1".into(),
            token: t.into(),
        })
        .unwrap()
    };
    auth(&token);
    assert!(a.caller(Some(&token), None).unwrap().is_some());
    a.apply(&AuthOp::UserChangePassword {
        name: "u1".into(),
        password_hash: Some(hash_password("q", 4)),
    })
    .unwrap();
    assert_eq!(
        a.caller(Some(&token), None),
        Err(Error::Auth(AuthError::InvalidAuthToken))
    );
    let t2 = a.new_token();
    auth(&t2);
    a.apply(&AuthOp::Disable).unwrap();
    assert_eq!(
        a.caller(Some(&t2), None),
        Ok(None),
        "while auth is off a token is not looked at, as etcd 3.6 does"
    );
    assert_eq!(a.caller(None, None), Ok(None));
    a.apply(&AuthOp::Enable).unwrap();
    assert_eq!(
        a.caller(Some(&t2), None),
        Err(Error::Auth(AuthError::InvalidAuthToken)),
        "AuthDisable ended the tokens issued before it"
    );
}

#[test]
fn tokens_lapse_after_the_ttl_without_use() {
    let a = AuthStore::new(AuthConfig {
        token_ttl: Duration::from_millis(50),
        bcrypt_cost: 4,
        ..AuthConfig::default()
    });
    add_user(&a, "root", "pw");
    grant(&a, "root", "root").unwrap();
    a.apply(&AuthOp::Enable).unwrap();
    let t = a.new_token();
    a.apply(&AuthOp::Authenticate {
        name: "root".into(),
        token: t.clone(),
    })
    .unwrap();
    assert!(a.caller(Some(&t), None).is_ok());
    std::thread::sleep(Duration::from_millis(80));
    assert_eq!(
        a.caller(Some(&t), None),
        Err(Error::Auth(AuthError::InvalidAuthToken))
    );
}

#[test]
fn admin_checks_follow_etcd() {
    let a = enabled();
    let u1 = login(&a, "u1");
    let root = login(&a, "root");
    assert_eq!(a.check_admin(None), auth_err(AuthError::UserEmpty));
    assert_eq!(
        a.check_admin(Some(&u1)),
        auth_err(AuthError::PermissionDenied)
    );
    assert_eq!(a.check_admin(Some(&root)), Ok(()));
    let ghost = AuthInfo {
        user: "ghost".into(),
        revision: a.revision(),
    };
    assert_eq!(
        a.check_admin(Some(&ghost)),
        auth_err(AuthError::UserNotFound)
    );
    // A certificate's common name stands for the user while enabled.
    let by_cert = a.caller(None, Some("root")).unwrap().unwrap();
    assert_eq!(a.check_admin(Some(&by_cert)), Ok(()));
}

#[test]
fn deleting_a_role_takes_it_from_its_users() {
    let a = enabled();
    a.apply(&AuthOp::RoleDelete { role: "r1".into() }).unwrap();
    assert_eq!(a.user_roles("u1").unwrap(), Vec::<String>::new());
    assert!(
        a.role_names().is_empty(),
        "root's role was granted, never added"
    );
}

fn jwt_store(private_key: Option<&[u8]>, public_key: Option<&[u8]>) -> AuthStore {
    let jwt = JwtTokens::new(JwtOptions {
        sign_method: "HS256",
        private_key: private_key.map(<[u8]>::to_vec),
        public_key: public_key.map(<[u8]>::to_vec),
        ttl: DEFAULT_JWT_TTL,
    })
    .unwrap();
    AuthStore::new(AuthConfig {
        bcrypt_cost: 4,
        jwt: Some(std::sync::Arc::new(jwt)),
        ..AuthConfig::default()
    })
}

/// JWT tokens: nothing is kept per token; the token carries the auth
/// revision it was signed at, so an auth change makes it old (etcd's
/// "revision of auth store is old", on which clients authenticate again),
/// and a member with the same key accepts it without having seen the entry.
#[test]
fn a_jwt_token_carries_its_user_and_revision_to_every_member_with_the_key() {
    let a = jwt_store(Some(b"secret"), None);
    add_user(&a, "root", "pw");
    grant(&a, "root", "root").unwrap();
    a.apply(&AuthOp::Enable).unwrap();
    let drawn = a.new_token();
    assert_eq!(drawn, "");
    a.apply(&AuthOp::Authenticate {
        name: "root".into(),
        token: drawn.clone(),
    })
    .unwrap();
    let token = a.issue_token("root", drawn).unwrap();
    let by = a.caller(Some(&token), None).unwrap().unwrap();
    assert_eq!(by.user, "root");
    assert_eq!(by.revision, a.revision());
    assert_eq!(a.check(&by, PermKind::Write, b"k", b""), Ok(()));

    let other = jwt_store(Some(b"secret"), None);
    add_user(&other, "root", "pw");
    grant(&other, "root", "root").unwrap();
    other.apply(&AuthOp::Enable).unwrap();
    assert_eq!(
        other.caller(Some(&token), None).unwrap().unwrap().user,
        "root"
    );
    assert_eq!(
        jwt_store(Some(b"another secret"), None).caller(Some(&token), None),
        Ok(None),
        "auth is off there: tokens are not looked at"
    );

    add_user(&a, "u1", "pw");
    assert_eq!(
        a.check(&by, PermKind::Write, b"k", b""),
        auth_err(AuthError::AuthOldRevision)
    );
    assert_eq!(
        a.caller(Some("not.a.jwt"), None),
        Err(Error::Auth(AuthError::InvalidAuthToken))
    );
}
