//! The auth state's snapshot image: what goes in comes back out, through
//! the bytes and into another store, and damaged images are refused.

use super::*;
use crate::auth::{hash_password, AuthConfig, AuthOp, AuthStore, PermKind, Permission};
use std::time::Duration;

fn store() -> AuthStore {
    AuthStore::new(AuthConfig {
        token_ttl: Duration::from_secs(300),
        bcrypt_cost: 4,
        ..AuthConfig::default()
    })
}

/// root with the root role, u1 (password "p") with role r1 on `/a/` and
/// `k1`, a user without a password, auth enabled, a token for u1.
fn used() -> AuthStore {
    let a = store();
    let ops = [
        AuthOp::UserAdd {
            name: "root".into(),
            password_hash: Some(hash_password("pw", 4)),
        },
        AuthOp::UserGrantRole {
            user: "root".into(),
            role: "root".into(),
        },
        AuthOp::UserAdd {
            name: "u1".into(),
            password_hash: Some(hash_password("p", 4)),
        },
        AuthOp::UserAdd {
            name: "cert-only".into(),
            password_hash: None,
        },
        AuthOp::RoleAdd { name: "r1".into() },
        AuthOp::RoleGrantPermission {
            name: "r1".into(),
            perm: Some(Permission {
                kind: PermKind::Read,
                key: b"k1".to_vec(),
                range_end: Vec::new(),
            }),
        },
        AuthOp::RoleGrantPermission {
            name: "r1".into(),
            perm: Some(Permission {
                kind: PermKind::ReadWrite,
                key: b"/a/".to_vec(),
                range_end: b"/a0".to_vec(),
            }),
        },
        AuthOp::UserGrantRole {
            user: "u1".into(),
            role: "r1".into(),
        },
        AuthOp::Enable,
        AuthOp::Authenticate {
            name: "u1".into(),
            token: "tok.1".into(),
        },
    ];
    for op in &ops {
        a.apply(op).unwrap();
    }
    a
}

#[test]
fn a_fresh_store_is_pristine_and_a_used_one_is_not() {
    assert!(store().image(true).is_pristine());
    assert_eq!(store().image(true), AuthImage::pristine());
    assert!(!used().image(false).is_pristine());
}

#[test]
fn an_image_round_trips_through_bytes_and_into_another_store() {
    let a = used();
    let image = a.image(true);
    assert!(image.state.enabled);
    assert_eq!(image.tokens, vec![("tok.1".to_string(), "u1".to_string())]);
    let decoded = AuthImage::decode(&image.encode()).unwrap();
    assert_eq!(decoded, image);

    let b = store();
    b.install(decoded);
    assert_eq!(b.image(true), image);
    assert!(b.enabled() && b.active());
    assert_eq!(b.revision(), a.revision());
    // The token works there, with u1's rights.
    let who = b.caller(Some("tok.1"), None).unwrap().unwrap();
    assert_eq!(who.user, "u1");
    assert!(b.check(&who, PermKind::Write, b"/a/x", b"").is_ok());
    assert!(b.check(&who, PermKind::Write, b"k1", b"").is_err());
    b.check_password("u1", "p").unwrap();
    assert!(b.check_password("cert-only", "").is_err());
}

#[test]
fn without_tokens_the_image_leaves_them_out_and_installing_forgets_others() {
    let a = used();
    let image = a.image(false);
    assert!(image.tokens.is_empty());
    let b = used();
    b.install(image);
    assert!(b.caller(Some("tok.1"), None).is_err(), "token forgotten");
    // Installing a fresh image disables auth again.
    b.install(AuthImage::pristine());
    assert!(!b.enabled());
    assert_eq!(b.revision(), 1);
}

#[test]
fn damaged_images_are_refused() {
    let good = used().image(true);
    assert!(AuthImage::decode(&[0xff, 0xff, 0xff]).is_err());
    let mut zero = good.clone();
    zero.revision = 0;
    let e = AuthImage::decode(&zero.encode()).unwrap_err();
    assert!(e.contains("auth revision 0"), "{e}");
    let mut rootless = good.clone();
    rootless.state.users.remove("root");
    let e = AuthImage::decode(&rootless.encode()).unwrap_err();
    assert!(e.contains("without a root user"), "{e}");
    let mut twice = ImageRecord::decode(good.encode().as_slice()).unwrap();
    twice.users.push(twice.users[0].clone());
    let e = AuthImage::decode(&twice.encode_to_vec()).unwrap_err();
    assert!(e.contains("twice"), "{e}");
    let mut bad_kind = ImageRecord::decode(good.encode().as_slice()).unwrap();
    bad_kind.roles[0].perms[0].kind = 7;
    let e = AuthImage::decode(&bad_kind.encode_to_vec()).unwrap_err();
    assert!(e.contains("unknown kind 7"), "{e}");
    let mut nameless = ImageRecord::decode(good.encode().as_slice()).unwrap();
    nameless.roles[0].name.clear();
    assert!(AuthImage::decode(&nameless.encode_to_vec()).is_err());
}
