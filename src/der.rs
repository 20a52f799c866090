//! Walking DER (the encoding of X.509 certificates) element by element,
//! bounds-checked, for the few fields ephd reads from certificates rustls
//! has already verified (`x509`): the summary logged when certificates
//! load, and the common name that peer checks and auth read; and the
//! revoked serial numbers of version 1 revocation lists, which rustls does
//! not read (`server/crl_v1.rs`). Every function here returns `None` on
//! input it cannot walk, never panics, whatever the bytes.

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

/// An OPTIONAL element: `Some((Some(content), rest))` when the next
/// element has `tag`, `Some((None, input))` when `input` is empty or the
/// next element has another tag (the field is absent), `None` when the
/// next element does not parse.
pub(crate) fn optional(input: &[u8], tag: u8) -> Option<(Option<&[u8]>, &[u8])> {
    if input.is_empty() {
        return Some((None, input));
    }
    let (t, content, rest) = tlv(input)?;
    Some(if t == tag {
        (Some(content), rest)
    } else {
        (None, input)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_long_lengths_split_off_one_element() {
        assert_eq!(
            tlv(&[0x02, 0x01, 0x05, 0xff]),
            Some((0x02, &[5u8][..], &[0xffu8][..]))
        );
        let mut long = vec![0x04, 0x81, 0x80];
        long.extend([7u8; 0x80]);
        let (tag, content, rest) = tlv(&long).unwrap();
        assert_eq!((tag, content.len(), rest.len()), (0x04, 0x80, 0));
        let mut two = vec![0x30, 0x82, 0x01, 0x00];
        two.extend([0u8; 0x100]);
        assert_eq!(tlv(&two).map(|(_, c, _)| c.len()), Some(0x100));
        assert_eq!(tlv(&[0x05, 0x00]), Some((0x05, &[][..], &[][..])));
    }

    #[test]
    fn truncated_indefinite_and_high_tag_input_is_refused() {
        for bad in [
            &[][..],
            &[0x30],                               // no length
            &[0x30, 0x02, 0x01],                   // content shorter than its length
            &[0x30, 0x80, 0x00, 0x00],             // indefinite length (BER, not DER)
            &[0x30, 0x82, 0x01],                   // length bytes cut short
            &[0x30, 0x85, 1, 0, 0, 0, 0],          // more length bytes than allowed
            &[0x1f, 0x01, 0x00],                   // high tag number form
            &[0x30, 0x84, 0xff, 0xff, 0xff, 0xff], // a length far beyond the input
        ] {
            assert_eq!(tlv(bad), None, "{bad:02x?}");
        }
    }

    #[test]
    fn expect_checks_the_tag() {
        assert_eq!(
            expect(&[0x02, 0x01, 0x05], 0x02),
            Some((&[5u8][..], &[][..]))
        );
        assert_eq!(expect(&[0x02, 0x01, 0x05], 0x30), None);
    }

    #[test]
    fn optional_elements_are_taken_when_present_and_left_when_absent() {
        let input = [0xa0, 0x01, 0x09, 0x02, 0x01, 0x05];
        assert_eq!(
            optional(&input, 0xa0),
            Some((Some(&[9u8][..]), &input[3..]))
        );
        assert_eq!(optional(&input, 0x02), Some((None, &input[..])));
        assert_eq!(optional(&[], 0x02), Some((None, &[][..])));
        assert_eq!(optional(&[0xa0, 0x05], 0xa0), None);
    }

    /// What `tlv` splits off lies within its input, whatever the input.
    fn within(input: &[u8]) {
        if let Some((_, content, rest)) = tlv(input) {
            assert!(
                content.len() + rest.len() + 2 <= input.len(),
                "{input:02x?}"
            );
        }
    }

    #[test]
    fn any_prefix_or_changed_byte_is_split_within_bounds_or_refused() {
        // Every prefix and every one-byte change of a small valid element.
        let valid = [0x30, 0x81, 0x06, 0x02, 0x01, 0x05, 0xa0, 0x01, 0x00];
        for end in 0..=valid.len() {
            within(&valid[..end]);
            assert_eq!(tlv(&valid[..end]).is_some(), end == valid.len());
        }
        for i in 0..valid.len() {
            for b in 0..=255u8 {
                let mut v = valid;
                v[i] = b;
                within(&v);
                let _ = optional(&v, 0x30);
            }
        }
    }
}
