//! The gRPC services' paths answer gRPC requests only: HTTP/2 with a gRPC
//! content type. Anything else on those paths (an HTTP/1.1 POST, a plain
//! HTTP/2 request) gets the 404 of etcd's HTTP handler, which serves every
//! request that is not gRPC.
//!
//! A plain tower service rather than a middleware function: every gRPC
//! request of the client port passes it, and it routes without allocating.

use axum::extract::Request;
use axum::http::{header, Version};
use axum::response::Response;
use futures::future::{ready, Either, Ready};
use std::convert::Infallible;
use std::task::{Context, Poll};

/// Wraps the gRPC routes in [`GrpcOnly`]; the answer to anything that is
/// not gRPC is `not_found`'s.
#[derive(Debug, Clone, Copy)]
pub(super) struct GrpcOnlyLayer {
    pub(super) not_found: fn() -> Response,
}

impl<S> tower::Layer<S> for GrpcOnlyLayer {
    type Service = GrpcOnly<S>;

    fn layer(&self, inner: S) -> GrpcOnly<S> {
        GrpcOnly {
            inner,
            not_found: self.not_found,
        }
    }
}

/// Passes gRPC requests to the routes, answers anything else with the 404.
#[derive(Debug, Clone)]
pub(super) struct GrpcOnly<S> {
    inner: S,
    not_found: fn() -> Response,
}

impl<S> tower::Service<Request> for GrpcOnly<S>
where
    S: tower::Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<S::Future, Ready<Result<Response, Infallible>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let grpc = req.version() == Version::HTTP_2
            && req
                .headers()
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        if grpc {
            Either::Left(self.inner.call(req))
        } else {
            Either::Right(ready(Ok((self.not_found)())))
        }
    }
}
