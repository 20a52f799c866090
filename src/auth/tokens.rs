//! Simple tokens (`--auth-token simple`, etcd's default): random strings
//! the server maps to a user. The proposing member draws the token (so
//! every member of a cluster stores the same one from the log entry); each
//! member forgets it after `--auth-token-ttl` without use, as etcd's
//! simple-token keeper does. That expiry is local bookkeeping, like etcd's:
//! it never changes what an entry applies to.

use parking_lot::Mutex;
use rand::Rng;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Letters a token's random part is drawn from (etcd uses the same set).
const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// Length of a token's random part (etcd's is 16 letters).
const RANDOM_LEN: usize = 16;

/// A fresh simple token: 16 random letters, a dot, and `serial`, so tokens
/// drawn on one member never repeat.
pub fn generate(serial: u64) -> String {
    let mut rng = rand::rng();
    let mut t: String = (0..RANDOM_LEN)
        .map(|_| LETTERS[rng.random_range(0..LETTERS.len())] as char)
        .collect();
    t.push('.');
    t.push_str(&serial.to_string());
    t
}

struct Issued {
    user: String,
    last_used: Instant,
}

/// The tokens this member knows.
pub struct Tokens {
    ttl: Duration,
    issued: Mutex<HashMap<String, Issued>>,
}

impl Tokens {
    /// An empty table whose tokens lapse after `ttl` without use.
    pub fn new(ttl: Duration) -> Self {
        Tokens {
            ttl,
            issued: Mutex::new(HashMap::new()),
        }
    }

    /// Records a token for `user`; forgets lapsed ones meanwhile, so a
    /// table of tokens nobody uses stays bounded.
    pub fn insert(&self, token: String, user: String) {
        let now = Instant::now();
        let mut issued = self.issued.lock();
        let ttl = self.ttl;
        issued.retain(|_, i| now.duration_since(i.last_used) < ttl);
        issued.insert(
            token,
            Issued {
                user,
                last_used: now,
            },
        );
    }

    /// The user of a live token, which is used now (its lapse is pushed
    /// back); `None` for an unknown or lapsed one.
    pub fn user(&self, token: &str) -> Option<String> {
        let now = Instant::now();
        let mut issued = self.issued.lock();
        let i = issued.get_mut(token)?;
        if now.duration_since(i.last_used) >= self.ttl {
            issued.remove(token);
            return None;
        }
        i.last_used = now;
        Some(i.user.clone())
    }

    /// Forgets every token of `user` (deleted, or its password changed).
    pub fn revoke_user(&self, user: &str) {
        self.issued.lock().retain(|_, i| i.user != user);
    }

    /// Forgets every token (auth disabled).
    pub fn clear(&self) {
        self.issued.lock().clear();
    }

    /// Every live token and its user, sorted by token (a Raft snapshot
    /// carries them).
    pub fn live(&self) -> Vec<(String, String)> {
        let now = Instant::now();
        let issued = self.issued.lock();
        let mut out: Vec<_> = issued
            .iter()
            .filter(|(_, i)| now.duration_since(i.last_used) < self.ttl)
            .map(|(t, i)| (t.clone(), i.user.clone()))
            .collect();
        out.sort();
        out
    }

    /// Replaces every token with `tokens`, each fresh (used now).
    pub fn replace(&self, tokens: Vec<(String, String)>) {
        let now = Instant::now();
        *self.issued.lock() = tokens
            .into_iter()
            .map(|(token, user)| {
                (
                    token,
                    Issued {
                        user,
                        last_used: now,
                    },
                )
            })
            .collect();
    }
}
