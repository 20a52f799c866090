//! Size-limit and truncated-body errors as etcd's clients know them.
//!
//! tonic refuses a received message over the decoding limit with
//! `OutOfRange` "Error, decoded message length too large: …"; grpc-go, and
//! so etcd, answers `ResourceExhausted` "grpc: received message larger than
//! max (N vs. M)". A request body that ends before its message does (empty,
//! or cut inside the 5-byte prefix or the message) is `Internal` "Missing
//! request message." or "Unexpected EOF decoding stream." from tonic, and
//! `Unknown` "EOF" or "unexpected EOF" from grpc-go: Go's `io.EOF` and
//! `io.ErrUnexpectedEOF` as a status. Unary calls get the rewrite from [`GrpcGoLimits`], a
//! layer over the router (their error travels in the response headers);
//! streams rewrite the error their inbound side returns with
//! [`as_grpc_go`] before ending with it.

use crate::error::message_too_large;
use tonic::codegen::http;

/// The start of tonic's message for an oversized received message.
const TONIC_TOO_LARGE: &str = "Error, decoded message length too large: found ";

/// tonic's message for a request body that ended before its message.
const TONIC_MISSING: &str = "Missing request message.";
/// tonic's message for a body cut inside a message or its prefix.
const TONIC_TRUNCATED: &str = "Unexpected EOF decoding stream.";

/// `status` as grpc-go would have reported it: oversized messages become
/// `ResourceExhausted` with grpc-go's text, truncated bodies `Unknown`
/// "EOF" or "unexpected EOF"; anything else is unchanged.
pub(crate) fn as_grpc_go(status: tonic::Status) -> tonic::Status {
    if let Some((found, limit)) = too_large(&status) {
        return tonic::Status::resource_exhausted(message_too_large(found, limit));
    }
    match (status.code(), status.message()) {
        (tonic::Code::Internal, TONIC_MISSING) => tonic::Status::unknown("EOF"),
        (tonic::Code::Internal, TONIC_TRUNCATED) => tonic::Status::unknown("unexpected EOF"),
        _ => status,
    }
}

/// The sizes in tonic's "decoded message length too large" error.
fn too_large(status: &tonic::Status) -> Option<(usize, usize)> {
    if status.code() != tonic::Code::OutOfRange {
        return None;
    }
    let rest = status.message().strip_prefix(TONIC_TOO_LARGE)?;
    let (found, rest) = rest.split_once(" bytes, the limit is: ")?;
    let limit = rest.strip_suffix(" bytes")?;
    Some((found.parse().ok()?, limit.parse().ok()?))
}

/// Rewrites unary responses whose status is tonic's oversized-message or
/// truncated-body error (see the module docs). Cheap for every other
/// response: one header lookup.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcGoLimits;

impl<S> tower::Layer<S> for GrpcGoLimits {
    type Service = tower::util::MapResponse<S, fn(HttpResponse) -> HttpResponse>;

    fn layer(&self, inner: S) -> Self::Service {
        tower::util::MapResponse::new(inner, rewrite as fn(HttpResponse) -> HttpResponse)
    }
}

type HttpResponse = http::Response<tonic::body::Body>;

fn rewrite(mut resp: HttpResponse) -> HttpResponse {
    // OutOfRange (11) or Internal (13): the only codes rewritten.
    let rewritable = resp
        .headers()
        .get("grpc-status")
        .is_some_and(|v| v.as_bytes() == b"11" || v.as_bytes() == b"13");
    if !rewritable {
        return resp;
    }
    if let Some(status) = tonic::Status::from_header_map(resp.headers()) {
        let go = as_grpc_go(status.clone());
        if go.code() != status.code() {
            let _ = go.add_header(resp.headers_mut());
        }
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tonics_oversize_error_is_rewritten() {
        let tonic_err = tonic::Status::out_of_range(
            "Error, decoded message length too large: found 2098162 bytes, the limit is: 2097152 bytes",
        );
        let mapped = as_grpc_go(tonic_err);
        assert_eq!(mapped.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            mapped.message(),
            "grpc: received message larger than max (2098162 vs. 2097152)"
        );
        let compacted =
            tonic::Status::out_of_range("etcdserver: mvcc: required revision has been compacted");
        assert_eq!(as_grpc_go(compacted.clone()).message(), compacted.message());
        assert_eq!(as_grpc_go(compacted).code(), tonic::Code::OutOfRange);
    }

    #[test]
    fn unary_error_headers_are_rewritten_in_place() {
        let status = tonic::Status::out_of_range(
            "Error, decoded message length too large: found 10 bytes, the limit is: 5 bytes",
        );
        let resp = status.into_http::<tonic::body::Body>();
        let resp = rewrite(resp);
        let seen = tonic::Status::from_header_map(resp.headers()).unwrap();
        assert_eq!(seen.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            seen.message(),
            "grpc: received message larger than max (10 vs. 5)"
        );
        let ok = http::Response::new(tonic::body::Body::empty());
        assert!(rewrite(ok).headers().is_empty());
    }

    #[test]
    fn truncated_bodies_answer_as_grpc_go_does() {
        for (tonic_text, go_text) in [
            ("Missing request message.", "EOF"),
            ("Unexpected EOF decoding stream.", "unexpected EOF"),
        ] {
            let resp = rewrite(tonic::Status::internal(tonic_text).into_http());
            let seen = tonic::Status::from_header_map(resp.headers()).unwrap();
            assert_eq!(
                (seen.code(), seen.message()),
                (tonic::Code::Unknown, go_text)
            );
        }
        let other = rewrite(tonic::Status::internal("etcdserver: corrupt cluster").into_http());
        let seen = tonic::Status::from_header_map(other.headers()).unwrap();
        assert_eq!(seen.code(), tonic::Code::Internal);
    }
}
