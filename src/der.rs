//! Walking DER (the encoding of X.509 certificates) element by element,
//! bounds-checked, for the few fields ephd reads from certificates rustls
//! has already verified (`x509`): the summary logged when certificates
//! load, and the common name that peer checks and auth read.

/// Splits one DER element off `input`: its tag, its content and what
/// follows it. Only the definite, low-tag-number forms DER allows.
pub(crate) fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, input) = input.split_first()?;
    if tag & 0x1f == 0x1f {
        return None;
    }
    let (&first, mut input) = input.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || input.len() < n {
            return None;
        }
        let (bytes, after) = input.split_at(n);
        input = after;
        bytes.iter().fold(0usize, |l, &b| (l << 8) | usize::from(b))
    };
    if input.len() < len {
        return None;
    }
    let (content, rest) = input.split_at(len);
    Some((tag, content, rest))
}

/// [`tlv`] that also requires the tag.
pub(crate) fn expect(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (t, content, rest) = tlv(input)?;
    (t == tag).then_some((content, rest))
}
