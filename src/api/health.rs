//! `grpc.health.v1.Health` as etcd 3.6's grpc-go serves it: Check and
//! Watch from tonic-health, and List (the statuses of every registered
//! service), which tonic-health does not implement.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::{http, BoxFuture, Service};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};
use tonic_health::pb::health_server::{Health as _, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};

/// The path of the List method.
const LIST: &str = "/grpc.health.v1.Health/List";

/// The services whose status List reports: the server as a whole, the one
/// status ephd sets.
const SERVICES: [&str; 1] = [""];

/// `HealthListRequest` of grpc's health.proto (no fields).
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthListRequest {}

/// `HealthListResponse` of grpc's health.proto.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthListResponse {
    /// Every service's status, by service name.
    #[prost(map = "string, message", tag = "1")]
    pub statuses: HashMap<String, HealthCheckResponse>,
}

/// The health service: List here, everything else tonic-health's.
#[derive(Clone)]
pub struct Health {
    statuses: Arc<HealthService>,
    inner: HealthServer<HealthService>,
}

impl Health {
    /// The service and the reporter that sets its statuses.
    pub fn new() -> (HealthReporter, Health) {
        let reporter = HealthReporter::new();
        let statuses = Arc::new(HealthService::from_health_reporter(reporter.clone()));
        let inner = HealthServer::from_arc(statuses.clone());
        (reporter, Health { statuses, inner })
    }
}

impl NamedService for Health {
    const NAME: &'static str = "grpc.health.v1.Health";
}

#[derive(Clone)]
struct List(Arc<HealthService>);

impl UnaryService<HealthListRequest> for List {
    type Response = HealthListResponse;
    type Future = BoxFuture<Response<HealthListResponse>, Status>;

    fn call(&mut self, _request: Request<HealthListRequest>) -> Self::Future {
        let statuses = self.0.clone();
        Box::pin(async move {
            let mut out = HashMap::new();
            for service in SERVICES {
                let check = HealthCheckRequest {
                    service: service.to_string(),
                };
                let status = statuses.check(Request::new(check)).await?.into_inner();
                out.insert(service.to_string(), status);
            }
            Ok(Response::new(HealthListResponse { statuses: out }))
        })
    }
}

impl<B> Service<http::Request<B>> for Health
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
    HealthServer<HealthService>: Service<
        http::Request<B>,
        Response = http::Response<tonic::body::Body>,
        Error = Infallible,
        Future = BoxFuture<http::Response<tonic::body::Body>, Infallible>,
    >,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != LIST {
            return self.inner.call(req);
        }
        let list = List(self.statuses.clone());
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<HealthListResponse, HealthListRequest>::default();
            Ok(Grpc::new(codec).unary(list, req).await)
        })
    }
}
