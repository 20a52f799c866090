//! Who a request comes from, for the services that check permissions
//! once auth is enabled: its token (etcd reads the `token` metadata key,
//! then `authorization`, the gateway's) or else the common name of its
//! verified TLS client certificate. While auth was never used this is one
//! relaxed atomic load ([`crate::auth::AuthStore::active`]).

use super::{status, Shared};
use crate::auth::{AuthError, AuthInfo, PermKind};
use crate::backend::Backend;
use crate::error::Error;
use crate::proto::etcdserverpb as pb;
use std::future::Future;
use tonic::{Request, Status};

/// etcd's metadata key for the token (`rpctypes.TokenFieldNameGRPC`).
pub const TOKEN_KEY: &str = "token";
/// The key etcd's JSON gateway passes the token under.
pub const GATEWAY_TOKEN_KEY: &str = "authorization";

/// The caller of `req`: `None` when auth is off and no token was sent
/// (then nothing is checked); an unknown or lapsed token is "invalid auth
/// token". The future holds nothing of `req`.
pub(crate) fn caller<'s, T>(
    shared: &'s Shared,
    req: &Request<T>,
) -> impl Future<Output = Result<Option<AuthInfo>, Status>> + Send + 's {
    let creds = shared.store.auth().active().then(|| Credentials::of(req));
    async move {
        match creds {
            None => Ok(None),
            Some(c) => c.resolve(shared).await,
        }
    }
}

fn token<T>(req: &Request<T>) -> Option<&str> {
    let md = req.metadata();
    md.get(TOKEN_KEY)
        .or_else(|| md.get(GATEWAY_TOKEN_KEY))
        .and_then(|v| v.to_str().ok())
}

/// The subject common name of the client's verified certificate.
fn common_name<T>(req: &Request<T>) -> Option<String> {
    let certs = req.peer_certs()?;
    crate::tls::certificate::common_name(certs.first()?.as_ref())
}

/// A read of `key`/`range_end` by `by` (Range).
pub(crate) fn check_read(
    shared: &Shared,
    by: &Option<AuthInfo>,
    key: &[u8],
    range_end: &[u8],
) -> Result<(), Status> {
    match by {
        None => Ok(()),
        Some(by) => shared
            .store
            .auth()
            .check(by, PermKind::Read, key, range_end)
            .map_err(status),
    }
}

/// The `root`-only calls (Maintenance's Defragment, Hash, HashKV,
/// Snapshot, MoveLeader, as etcd's auth maintenance server has them),
/// refused with the same codes and texts as every other auth check (etcd
/// 3.6; 3.4 let its auth package's own texts through as Unknown).
pub(crate) async fn require_root<T>(shared: &Shared, req: &Request<T>) -> Result<(), Status> {
    let Some(by) = caller(shared, req).await? else {
        return Ok(());
    };
    shared.store.auth().check_admin(Some(&by)).map_err(status)
}

/// The calls any authenticated user may make once auth is enabled
/// (Maintenance's Status and Alarm GET, as etcd 3.6 has them): a request
/// without credentials gets `etcdserver: user name is empty`.
pub(crate) async fn require_user<T>(shared: &Shared, req: &Request<T>) -> Result<(), Status> {
    let auth = shared.store.auth();
    if !auth.enabled() {
        return Ok(());
    }
    match caller(shared, req).await? {
        Some(by) if !by.user.is_empty() => Ok(()),
        _ => Err(status(Error::from(AuthError::UserEmpty))),
    }
}

/// What a request or stream was sent with (token, certificate name).
#[derive(Default)]
pub(crate) struct Credentials {
    token: Option<String>,
    common_name: Option<String>,
}

impl Credentials {
    /// The credentials of a request, or of a stream's opening request
    /// (etcd checks each watch create against those).
    pub(crate) fn of<T>(req: &Request<T>) -> Self {
        let token = token(req).map(str::to_string);
        let common_name = if token.is_none() {
            common_name(req)
        } else {
            None
        };
        Credentials { token, common_name }
    }

    /// Who these credentials name. In cluster mode a token drawn by
    /// another member may not have reached this one yet: an unknown token
    /// is looked up again once this member has caught up with the leader
    /// (etcd waits likewise for the log index a token names).
    async fn resolve(&self, shared: &Shared) -> Result<Option<AuthInfo>, Status> {
        let auth = shared.store.auth();
        let lookup = || auth.caller(self.token.as_deref(), self.common_name.as_deref());
        match lookup() {
            Err(Error::Auth(AuthError::InvalidAuthToken)) => {
                shared.backend.read_index().await.map_err(status)?;
                lookup().map_err(status)
            }
            r => r.map_err(status),
        }
    }

    /// A Watch create refused for lack of READ on its range: etcd's
    /// answer (created and canceled at once, with the permission-denied
    /// status text as the reason); `None` when it may go ahead.
    pub(crate) async fn watch_denied(
        &self,
        shared: &Shared,
        c: &pb::WatchCreateRequest,
    ) -> Option<pb::WatchResponse> {
        let auth = shared.store.auth();
        if !auth.active() {
            return None;
        }
        // etcd checks the range as its watch server rewrites it: an empty
        // key is "\0", and a range end of "\0" (every key from `key` on)
        // is checked as the single key.
        let key: &[u8] = if c.key.is_empty() { &[0] } else { &c.key };
        let end: &[u8] = if c.range_end.as_ref() == [0] {
            &[]
        } else {
            &c.range_end
        };
        let allowed = match self.resolve(shared).await {
            Ok(None) => true,
            Ok(Some(by)) => auth.check(&by, PermKind::Read, key, end).is_ok(),
            Err(_) => false,
        };
        (!allowed).then(|| pb::WatchResponse {
            header: shared.info.header(shared.store.current_revision()),
            // etcd 3.4 answers with -1 whatever ID the create asked for.
            watch_id: -1,
            created: true,
            canceled: true,
            cancel_reason: crate::auth::WATCH_PERMISSION_DENIED.to_string(),
            ..Default::default()
        })
    }
}
