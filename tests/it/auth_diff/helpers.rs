//! The requests and answer summaries of the side-by-side auth script.

use ephd::proto::authpb;
use ephd::proto::etcdserverpb::{
    self as pb, auth_client::AuthClient, kv_client::KvClient, lease_client::LeaseClient,
    maintenance_client::MaintenanceClient, watch_client::WatchClient,
};
use tonic::transport::Channel;
use tonic::Request;

/// A connection and the token its requests carry.
pub(super) struct Session {
    pub(super) ch: Channel,
    pub(super) token: Option<String>,
}

impl Session {
    pub(super) fn req<T>(&self, msg: T) -> Request<T> {
        let mut r = Request::new(msg);
        if let Some(t) = &self.token {
            r.metadata_mut().insert("token", t.parse().unwrap());
        }
        r
    }
    pub(super) fn auth(&self) -> AuthClient<Channel> {
        AuthClient::new(self.ch.clone())
    }
    pub(super) fn kv(&self) -> KvClient<Channel> {
        KvClient::new(self.ch.clone())
    }
    pub(super) fn lease(&self) -> LeaseClient<Channel> {
        LeaseClient::new(self.ch.clone())
    }
    pub(super) fn maint(&self) -> MaintenanceClient<Channel> {
        MaintenanceClient::new(self.ch.clone())
    }
    pub(super) fn with_token(&self, token: Option<String>) -> Session {
        Session {
            ch: self.ch.clone(),
            token,
        }
    }
}

/// What one step shows: `ok ...` with the fields that matter, or the
/// status code and message.
pub(super) fn shown<T>(
    r: Result<tonic::Response<T>, tonic::Status>,
    ok: impl FnOnce(T) -> String,
) -> String {
    match r {
        Ok(resp) => format!("ok {}", ok(resp.into_inner())),
        Err(s) => format!("{:?}: {}", s.code(), s.message()),
    }
}

pub(super) fn done<T>(_: T) -> String {
    String::new()
}

pub(super) fn perm(
    t: authpb::permission::Type,
    key: &str,
    end: &str,
) -> Option<authpb::Permission> {
    Some(authpb::Permission {
        perm_type: t as i32,
        key: key.as_bytes().to_vec().into(),
        range_end: end.as_bytes().to_vec().into(),
    })
}

pub(super) fn user_add(name: &str, password: &str) -> pb::AuthUserAddRequest {
    pb::AuthUserAddRequest {
        name: name.into(),
        password: password.into(),
        ..Default::default()
    }
}

pub(super) fn put(k: &str, lease: i64) -> pb::PutRequest {
    pb::PutRequest {
        key: k.as_bytes().to_vec().into(),
        value: b"v".to_vec().into(),
        lease,
        ..Default::default()
    }
}

pub(super) fn range(k: &str, end: &str) -> pb::RangeRequest {
    pb::RangeRequest {
        key: k.as_bytes().to_vec().into(),
        range_end: end.as_bytes().to_vec().into(),
        ..Default::default()
    }
}

pub(super) fn keys(r: pb::RangeResponse) -> String {
    let keys: Vec<String> = r
        .kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect();
    keys.join(",")
}

pub(super) async fn authenticate(
    s: &Session,
    name: &str,
    password: &str,
    out: &mut Vec<String>,
) -> Option<String> {
    let r = s
        .auth()
        .authenticate(s.req(pb::AuthenticateRequest {
            name: name.into(),
            password: password.into(),
        }))
        .await;
    let token = r.as_ref().ok().map(|t| t.get_ref().token.clone());
    out.push(format!(
        "authenticate {name}: {}",
        shown(r, |t| format!("token present: {}", !t.token.is_empty()))
    ));
    token
}

/// The first response of a watch of `key`..`end` on a stream opened with
/// `token`, and whether a second create on the same stream still gets an
/// answer.
pub(super) async fn watch_once(s: &Session, key: &str, end: &str) -> String {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let create = |k: &str, e: &str| pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
            pb::WatchCreateRequest {
                key: k.as_bytes().to_vec().into(),
                range_end: e.as_bytes().to_vec().into(),
                ..Default::default()
            },
        )),
    };
    tx.send(create(key, end)).await.unwrap();
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut client = WatchClient::new(s.ch.clone());
    let resp = client.watch(s.req(stream)).await;
    let mut inbound = match resp {
        Ok(r) => r.into_inner(),
        Err(st) => return format!("{:?}: {}", st.code(), st.message()),
    };
    let first = tokio::time::timeout(std::time::Duration::from_secs(5), inbound.message()).await;
    let show = |r: Result<Result<Option<pb::WatchResponse>, tonic::Status>, _>| match r {
        Ok(Ok(Some(w))) => format!(
            "created={} canceled={} id={} reason={:?}",
            w.created, w.canceled, w.watch_id, w.cancel_reason
        ),
        Ok(Ok(None)) => "stream ended".into(),
        Ok(Err(st)) => format!("{:?}: {}", st.code(), st.message()),
        Err(_) => "no answer".into(),
    };
    let text = show(first);
    // Does the stream still serve a create after that answer?
    let _ = tx.send(create("k1", "")).await;
    let second = tokio::time::timeout(std::time::Duration::from_secs(2), inbound.message()).await;
    format!("{text}; then {}", show(second))
}
