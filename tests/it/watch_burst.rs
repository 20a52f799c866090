//! A burst of watch creates on one stream, as a client that starts many
//! watchers at once sends them: 10,000 create requests pipelined on one
//! Watch stream, each in a DATA frame of its own (as Go's gRPC client
//! writes them), before any answer is read. Stock etcd creates every
//! watcher; ephd must too, never answering the burst by closing the
//! connection (h2's flood protection counts small DATA frames that the
//! server has not read yet).

use bytes::Bytes;
use ephd::proto::etcdserverpb::{watch_request::RequestUnion, WatchRequest, WatchResponse};
use prost::Message;

use crate::harness::StockEtcd;
use crate::support::{ephd, watch_req, within_for};

const CREATES: usize = 10_000;

/// A gRPC message: the flag byte, the length, the encoded message.
fn framed(msg: &impl Message) -> Bytes {
    let body = msg.encode_to_vec();
    let mut out = Vec::with_capacity(5 + body.len());
    out.push(0);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out.into()
}

/// Sends `CREATES` create requests on one Watch stream to `port`, each in a
/// DATA frame of its own, then reads answers until every watcher is
/// created; returns how many were, or the error that ended the stream.
async fn burst(port: u16) -> Result<usize, String> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    // The test client reads every answer and never limits the server's
    // small DATA frames itself: only the server's behaviour is under test.
    let (client, conn) = h2::client::Builder::new()
        .initial_window_size(1 << 20)
        .initial_connection_window_size(1 << 24)
        .data_frame_budget(usize::MAX / 2)
        .handshake(tcp)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let mut client = client.ready().await.map_err(|e| e.to_string())?;
    let request = http::Request::post(format!("http://127.0.0.1:{port}/etcdserverpb.Watch/Watch"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut send) = client
        .send_request(request, false)
        .map_err(|e| e.to_string())?;
    let sender = tokio::spawn(async move {
        for i in 0..CREATES {
            let key = format!("/registry/pods/ns/pod-{i:05}");
            let req = WatchRequest {
                request_union: Some(RequestUnion::CreateRequest(watch_req(
                    key.as_bytes(),
                    b"",
                    0,
                ))),
            };
            let frame = framed(&req);
            send.reserve_capacity(frame.len());
            // Waits for flow-control capacity, as any client must.
            while send.capacity() < frame.len() {
                match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(format!("create {i}: {e}")),
                    None => return Err(format!("create {i}: stream closed")),
                }
            }
            send.send_data(frame, false)
                .map_err(|e| format!("create {i}: {e}"))?;
        }
        Ok(send)
    });
    let mut body = response.await.map_err(|e| e.to_string())?.into_body();
    let mut buf: Vec<u8> = Vec::new();
    let mut created = 0;
    while created < CREATES {
        let chunk = match body.data().await {
            Some(Ok(chunk)) => chunk,
            Some(Err(e)) => return Err(format!("after {created} created: {e}")),
            None => return Err(format!("stream ended after {created} created")),
        };
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
        while buf.len() >= 5 {
            let len = u32::from_be_bytes(buf[1..5].try_into().unwrap()) as usize;
            if buf.len() < 5 + len {
                break;
            }
            let resp = WatchResponse::decode(&buf[5..5 + len]).map_err(|e| e.to_string())?;
            buf.drain(..5 + len);
            if resp.created && !resp.canceled {
                created += 1;
            }
        }
    }
    let _send = sender.await.map_err(|e| e.to_string())??;
    Ok(created)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_pipelined_watch_creates_keep_the_connection() {
    let etcd = StockEtcd::start();
    let limit = std::time::Duration::from_secs(60);
    let reference = within_for(limit, "etcd burst", burst(etcd.port())).await;
    assert_eq!(reference, Ok(CREATES), "stock etcd");
    let server = ephd(&[]);
    for round in 0..3 {
        let got = within_for(limit, "ephd burst", burst(server.port())).await;
        assert_eq!(got, Ok(CREATES), "ephd, round {round}");
    }
}
