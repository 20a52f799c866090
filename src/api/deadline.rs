//! The deadline a gRPC client sent with its call (the `grpc-timeout`
//! header), for the few calls etcd lets run exactly as long as the client
//! waits (MoveLeader). tonic's server does not enforce it on its own.

use std::time::Duration;
use tonic::metadata::MetadataMap;

/// The header grpc clients put their deadline in.
const GRPC_TIMEOUT: &str = "grpc-timeout";

/// How long the client waits for this call, if it said: `grpc-timeout`
/// holds at most 8 digits and a unit (H, M, S, m, u, n). A malformed value
/// counts as none.
pub(super) fn client_timeout(metadata: &MetadataMap) -> Option<Duration> {
    let value = metadata.get(GRPC_TIMEOUT)?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert(GRPC_TIMEOUT, value.parse().unwrap());
        m
    }

    #[test]
    fn every_unit_of_the_grpc_timeout_header_is_read() {
        let cases = [
            ("2H", Duration::from_secs(7200)),
            ("3M", Duration::from_secs(180)),
            ("5S", Duration::from_secs(5)),
            ("4999m", Duration::from_millis(4999)),
            ("250u", Duration::from_micros(250)),
            ("99999999n", Duration::from_nanos(99_999_999)),
        ];
        for (value, expected) in cases {
            assert_eq!(client_timeout(&with(value)), Some(expected), "{value}");
        }
        assert_eq!(client_timeout(&MetadataMap::new()), None);
    }

    #[test]
    fn a_malformed_grpc_timeout_counts_as_none() {
        for value in ["", "S", "5", "5s", "123456789S", "-5S", "5 S", "5.0S"] {
            let m = if value.is_empty() {
                MetadataMap::new()
            } else {
                with(value)
            };
            assert_eq!(client_timeout(&m), None, "{value:?}");
        }
    }
}
