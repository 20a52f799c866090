//! How a core error travels over gRPC: the status code and the exact text
//! etcd sends for it. Its own module, below both the gRPC services (`api`)
//! and cluster mode's peer services (`cluster`), so neither depends on the
//! other for it.

use crate::error::{Code, Error};

/// Maps a core error to the gRPC status etcd sends for it.
pub fn status(err: Error) -> tonic::Status {
    let code = match err.code() {
        Code::InvalidArgument => tonic::Code::InvalidArgument,
        Code::OutOfRange => tonic::Code::OutOfRange,
        Code::NotFound => tonic::Code::NotFound,
        Code::FailedPrecondition => tonic::Code::FailedPrecondition,
        Code::Unavailable => tonic::Code::Unavailable,
        Code::Unimplemented => tonic::Code::Unimplemented,
        Code::ResourceExhausted => tonic::Code::ResourceExhausted,
        Code::DataLoss => tonic::Code::DataLoss,
        Code::PermissionDenied => tonic::Code::PermissionDenied,
        Code::Unauthenticated => tonic::Code::Unauthenticated,
        Code::Unknown => tonic::Code::Unknown,
        Code::DeadlineExceeded => tonic::Code::DeadlineExceeded,
    };
    tonic::Status::new(code, err.message())
}
