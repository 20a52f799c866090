//! The errors of the lock and election recipes, with etcd's texts.

use crate::error::Error;

/// Why a recipe failed. etcd's lock and election servers return the error
/// of the in-process client unchanged, so all of them reach clients with
/// gRPC code Unknown and these texts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecipeError {
    /// A store error (lease not found, empty key, compacted, ...).
    Store(Error),
    /// Proclaim on a key that is not (any more) the one campaigned.
    NotLeader,
    /// Leader of an election nobody campaigns in.
    NoLeader,
    /// The waiter's own key was gone (its lease expired) once the lock
    /// came free.
    SessionExpired,
    /// Proclaim or Resign without a leader key.
    MissingLeaderKey,
    /// The server is shutting down.
    ShuttingDown,
}

impl RecipeError {
    /// etcd's text for the error.
    pub fn message(&self) -> &'static str {
        match self {
            RecipeError::Store(e) => e.message(),
            RecipeError::NotLeader => "election: not leader",
            RecipeError::NoLeader => "election: no leader",
            RecipeError::SessionExpired => "mutex: session is expired",
            RecipeError::MissingLeaderKey => "\"leader\" field must be provided",
            RecipeError::ShuttingDown => Error::StreamShutdown.message(),
        }
    }
}

impl From<Error> for RecipeError {
    fn from(e: Error) -> Self {
        RecipeError::Store(e)
    }
}
