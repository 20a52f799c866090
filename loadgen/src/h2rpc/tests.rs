//! Tests of the lean client: its pieces, every way a reply can end against
//! a scripted HTTP/2 server, and agreement with tonic against ephd itself.

use super::*;

#[test]
fn status_headers_read_as_tonic_reads_them() {
    let mut h = HeaderMap::new();
    assert!(grpc_status(&h).is_none());
    h.insert("grpc-status", HeaderValue::from_static("0"));
    assert!(matches!(grpc_status(&h), Some(Ok(()))));

    h.insert("grpc-status", HeaderValue::from_static("3"));
    h.insert(
        "grpc-message",
        HeaderValue::from_static("etcdserver: requested lease not found %E2%9C%93 100%25"),
    );
    let st = grpc_status(&h).unwrap().unwrap_err();
    assert_eq!(st.code(), Code::InvalidArgument);
    assert_eq!(
        st.message(),
        "etcdserver: requested lease not found \u{2713} 100%"
    );
    // Malformed escapes stay as they are; unknown codes read as Unknown.
    h.insert(
        "grpc-message",
        HeaderValue::from_static("50% off, ends in %4"),
    );
    assert_eq!(
        grpc_status(&h).unwrap().unwrap_err().message(),
        "50% off, ends in %4"
    );
    h.insert("grpc-status", HeaderValue::from_static("99"));
    assert_eq!(grpc_status(&h).unwrap().unwrap_err().code(), Code::Unknown);
}

#[test]
fn replies_decode_or_fail_as_internal() {
    use ephd::proto::etcdserverpb::{PutResponse, ResponseHeader};
    let msg = PutResponse {
        header: Some(ResponseHeader {
            revision: 42,
            ..Default::default()
        }),
        prev_kv: None,
    };
    let framed = encode(&mut BytesMut::new(), &msg).unwrap();
    assert_eq!(framed[0], 0);
    let back: PutResponse = decode_message(framed.clone()).unwrap();
    assert_eq!(back, msg);

    let cut = framed.slice(..framed.len() - 1);
    let err = decode_message::<PutResponse>(cut).unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    let err = decode_message::<PutResponse>(Bytes::new()).unwrap_err();
    assert_eq!(err.message(), "Missing response message.");
    let mut compressed = framed.to_vec();
    compressed[0] = 1;
    let err = decode_message::<PutResponse>(compressed.into()).unwrap_err();
    assert_eq!(err.code(), Code::Internal);
}

#[test]
fn missing_status_maps_http_codes() {
    assert_eq!(
        missing_status(StatusCode::NOT_FOUND).code(),
        Code::Unimplemented
    );
    assert_eq!(
        missing_status(StatusCode::SERVICE_UNAVAILABLE).code(),
        Code::Unavailable
    );
    assert_eq!(missing_status(StatusCode::OK).code(), Code::Unknown);
}

// ---------------------------------------------------------------
// Against a scripted HTTP/2 server: each path is one way a reply can
// end, so every branch of `unary` runs without a real etcd.

use ephd::proto::etcdserverpb::{
    kv_client::KvClient, PutRequest, PutResponse, RangeRequest, RangeResponse, ResponseHeader,
    TxnRequest,
};
use http::Response;

fn grpc_frame(m: &impl prost::Message) -> Bytes {
    encode(&mut BytesMut::new(), m).unwrap()
}

fn ok_trailers() -> HeaderMap {
    let mut t = HeaderMap::new();
    t.insert("grpc-status", HeaderValue::from_static("0"));
    t
}

fn grpc_headers(status: u16) -> Response<()> {
    Response::builder()
        .status(status)
        .header("content-type", "application/grpc")
        .body(())
        .unwrap()
}

/// Serves one request the way its path says.
async fn script(req: http::Request<h2::RecvStream>, mut respond: h2::server::SendResponse<Bytes>) {
    let path = req.uri().path().to_string();
    let mut body = req.into_body();
    let mut got = BytesMut::new();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        got.extend_from_slice(&chunk);
    }
    match path.as_str() {
        // Echoes the request's key length as the revision, checking the
        // request's framing on the way.
        "/ok" | "/split" => {
            let req: PutRequest = decode_message(got.freeze()).unwrap();
            let reply = grpc_frame(&PutResponse {
                header: Some(ResponseHeader {
                    revision: req.key.len() as i64,
                    ..Default::default()
                }),
                prev_kv: None,
            });
            let mut tx = respond.send_response(grpc_headers(200), false).unwrap();
            if path == "/split" {
                for part in [reply.slice(..2), reply.slice(2..7), reply.slice(7..)] {
                    tx.send_data(part, false).unwrap();
                }
            } else {
                tx.send_data(reply, false).unwrap();
            }
            tx.send_trailers(ok_trailers()).unwrap();
        }
        // A 6 MiB reply: more than the 4 MiB stream window, so it only
        // arrives if the client releases capacity as it reads.
        "/big" => {
            let reply = grpc_frame(&RangeResponse {
                count: 6,
                kvs: (0..6)
                    .map(|i| ephd::proto::mvccpb::KeyValue {
                        key: Bytes::from(format!("k{i}")),
                        value: Bytes::from(vec![b'v'; 1 << 20]),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            });
            let mut tx = respond.send_response(grpc_headers(200), false).unwrap();
            tx.send_data(reply, false).unwrap();
            tx.send_trailers(ok_trailers()).unwrap();
        }
        "/trailers-only" => {
            let mut r = grpc_headers(200);
            r.headers_mut()
                .insert("grpc-status", HeaderValue::from_static("5"));
            r.headers_mut().insert(
                "grpc-message",
                HeaderValue::from_static("no%20such%20key%3A%20%2Fa%25"),
            );
            respond.send_response(r, true).unwrap();
        }
        "/error-after-data" => {
            let mut tx = respond.send_response(grpc_headers(200), false).unwrap();
            tx.send_data(grpc_frame(&PutResponse::default()), false)
                .unwrap();
            let mut t = HeaderMap::new();
            t.insert("grpc-status", HeaderValue::from_static("9"));
            t.insert("grpc-message", HeaderValue::from_static("nope"));
            tx.send_trailers(t).unwrap();
        }
        "/no-status" => {
            let mut tx = respond.send_response(grpc_headers(200), false).unwrap();
            tx.send_data(grpc_frame(&PutResponse::default()), true)
                .unwrap();
        }
        "/ok-without-message" => {
            let mut tx = respond.send_response(grpc_headers(200), false).unwrap();
            tx.send_trailers(ok_trailers()).unwrap();
        }
        "/http-404" => {
            respond.send_response(grpc_headers(404), true).unwrap();
        }
        "/refused" => respond.send_reset(h2::Reason::REFUSED_STREAM),
        "/cancel" => respond.send_reset(h2::Reason::CANCEL),
        other => panic!("unscripted path {other}"),
    }
}

/// A scripted HTTP/2 server on a free loopback port.
async fn scripted_server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(tcp).await else {
                    return;
                };
                while let Some(Ok((req, respond))) = conn.accept().await {
                    tokio::spawn(script(req, respond));
                }
            });
        }
    });
    addr
}

async fn put_to(
    client: &mut Client,
    channel: &Channel,
    path: &'static str,
) -> Result<PutResponse, Status> {
    let req = PutRequest {
        key: Bytes::from_static(b"twelve bytes"),
        value: Bytes::from_static(b"v"),
        ..Default::default()
    };
    let uri = channel.method(path);
    let call = client.unary::<_, PutResponse>(&uri, req);
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("a reply or an error, never a hang")
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn every_way_a_reply_ends_maps_to_a_result() {
    let addr = scripted_server().await;
    let channel = Channel::connect(addr, Duration::from_secs(5))
        .await
        .unwrap();
    let mut c = Client::new(&channel);

    for path in ["/ok", "/split"] {
        let r = put_to(&mut c, &channel, path).await.unwrap();
        assert_eq!(r.header.unwrap().revision, 12, "{path}");
    }
    let big = c
        .unary::<_, RangeResponse>(&channel.method("/big"), RangeRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(big.kvs.len(), 6);
    assert!(big.kvs.iter().all(|kv| kv.value.len() == 1 << 20));

    let expect = [
        ("/trailers-only", Code::NotFound, "no such key: /a%"),
        ("/error-after-data", Code::FailedPrecondition, "nope"),
        (
            "/ok-without-message",
            Code::Internal,
            "Missing response message.",
        ),
        (
            "/http-404",
            Code::Unimplemented,
            "grpc-status header missing, mapped from HTTP status code 404",
        ),
    ];
    for (path, code, message) in expect {
        let st = put_to(&mut c, &channel, path).await.unwrap_err();
        assert_eq!((st.code(), st.message()), (code, message), "{path}");
    }
    let st = put_to(&mut c, &channel, "/no-status").await.unwrap_err();
    assert_eq!(st.code(), Code::Unknown);
    let st = put_to(&mut c, &channel, "/refused").await.unwrap_err();
    assert_eq!(st.code(), Code::Unavailable);
    let st = put_to(&mut c, &channel, "/cancel").await.unwrap_err();
    assert_eq!(st.code(), Code::Cancelled);

    // The connection survives all of that.
    assert!(put_to(&mut c, &channel, "/ok").await.is_ok());
}

#[tokio::test]
async fn a_connection_the_server_drops_fails_requests_as_unavailable() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        // Accept, then hang up without a word.
        while let Ok((tcp, _)) = listener.accept().await {
            drop(tcp);
        }
    });
    let channel = Channel::connect(addr, Duration::from_secs(5))
        .await
        .unwrap();
    let mut c = Client::new(&channel);
    for _ in 0..3 {
        let st = put_to(&mut c, &channel, "/ok").await.unwrap_err();
        assert_eq!(st.code(), Code::Unavailable, "{st:?}");
    }
}

// ---------------------------------------------------------------
// Against ephd itself: both transports must report the same thing.

#[tokio::test]
async fn lean_and_tonic_clients_agree_against_ephd() {
    use clap::Parser;
    let config = ephd::config::Config::parse_from([
        "ephd",
        "--listen-client-urls",
        "http://127.0.0.1:0",
        // Fail on unknown leases, as etcd does.
        "--lease-adopt-unknown-ttl",
        "0",
    ]);
    let server = ephd::server::Server::bind(config).await.unwrap();
    let addr = server.local_addrs()[0];
    tokio::spawn(server.run(std::future::pending()));

    let channel = Channel::connect(addr, Duration::from_secs(5))
        .await
        .unwrap();
    let mut lean = Client::new(&channel);
    let (put, txn) = (
        channel.method("/etcdserverpb.KV/Put"),
        channel.method("/etcdserverpb.KV/Txn"),
    );
    let mut tonic = KvClient::connect(format!("http://{addr}")).await.unwrap();

    let ok = PutRequest {
        key: Bytes::from_static(b"/a"),
        value: Bytes::from_static(b"1"),
        ..Default::default()
    };
    let a = lean
        .unary::<_, PutResponse>(&put, ok.clone())
        .await
        .unwrap();
    let b = tonic.put(ok).await.unwrap();
    assert_eq!(
        a.into_inner().header.unwrap().revision + 1,
        b.into_inner().header.unwrap().revision
    );

    let no_key = PutRequest::default();
    let bad_lease = TxnRequest {
        success: vec![crate::ops::put_op(
            &Bytes::from_static(b"/b"),
            Bytes::new(),
            0x5eed,
        )],
        ..Default::default()
    };
    let a = lean
        .unary::<_, PutResponse>(&put, no_key.clone())
        .await
        .unwrap_err();
    let b = tonic.put(no_key).await.unwrap_err();
    assert_eq!((a.code(), a.message()), (b.code(), b.message()));
    let a = lean
        .unary::<_, ephd::proto::etcdserverpb::TxnResponse>(&txn, bad_lease.clone())
        .await
        .unwrap_err();
    let b = tonic.txn(bad_lease).await.unwrap_err();
    assert_eq!((a.code(), a.message()), (b.code(), b.message()));
    assert_eq!(a.code(), Code::NotFound);

    // An unknown method: tonic's router answers with a trailers-only reply.
    let st = lean
        .unary::<_, PutResponse>(
            &channel.method("/etcdserverpb.KV/Nope"),
            PutRequest::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::Unimplemented);
}
