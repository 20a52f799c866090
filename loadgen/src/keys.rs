//! Keys and values the workloads write: fixed-size padded keys, filler
//! values, prefix ends and a per-run nonce. `padded_key` runs once per put,
//! so it avoids the formatting machinery.

use bytes::Bytes;

/// The smallest key greater than every key with this prefix (etcd's
/// `GetPrefixRangeEnd`).
pub fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Bytes::from(end);
        }
    }
    Bytes::from_static(b"\0")
}

/// `prefix` followed by `n` in decimal, zero-padded so the key is `size`
/// bytes long when possible. Written by hand rather than with `format!`:
/// it runs once per put, and the formatting machinery was a visible share
/// of the client's CPU per op.
pub fn padded_key(prefix: &str, n: u64, size: usize) -> Bytes {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    let mut rest = n;
    loop {
        start -= 1;
        digits[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    let digits = &digits[start..];
    let zeros = size
        .saturating_sub(prefix.len())
        .saturating_sub(digits.len());
    let mut key = Vec::with_capacity(prefix.len() + zeros + digits.len());
    key.extend_from_slice(prefix.as_bytes());
    key.resize(prefix.len() + zeros, b'0');
    key.extend_from_slice(digits);
    Bytes::from(key)
}

/// A value of exactly `size` bytes: `head`, then filler.
pub fn value_with(head: &str, size: usize) -> Bytes {
    let mut v = Vec::with_capacity(size.max(head.len()));
    v.extend_from_slice(head.as_bytes());
    let filler = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut i = 0;
    while v.len() < size {
        v.push(filler[i % filler.len()]);
        i += 1;
    }
    v.truncate(size.max(head.len()).min(v.len()));
    Bytes::from(v)
}

/// A random 32-bit tag that keeps one run's keys apart from another's.
pub fn run_nonce() -> u32 {
    rand::random::<u32>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_have_the_requested_sizes() {
        assert_eq!(prefix_end(b"/a/"), Bytes::from_static(b"/a0"));
        assert_eq!(prefix_end(b"a\xff"), Bytes::from_static(b"b"));
        assert_eq!(padded_key("k", 42, 8).as_ref(), b"k0000042");
        for (prefix, n, size) in [
            ("/p/", 0, 10),
            ("k", u64::MAX, 4),
            ("", 7, 0),
            ("ab", 123, 5),
        ] {
            let width = size - prefix.len().min(size);
            assert_eq!(
                padded_key(prefix, n, size).as_ref(),
                format!("{prefix}{n:0width$}").as_bytes()
            );
        }
        assert_eq!(value_with("hi", 10).len(), 10);
        assert_eq!(value_with("hello", 3).as_ref(), b"hello");
    }
}
