//! The record framing of cluster snapshots (`snapshot.rs`), the same as
//! `--data-dir` snapshots' (`persist`): `[len: u32 LE][crc32 of body: u32
//! LE][body]`, `body = [kind: u8][payload]`.
//!
//! Only a record's length is 32 bits; a whole snapshot may be any size
//! (offsets are `usize`). A record is one key's history cut into parts of
//! `KEY_RECORD_BYTES`, one event (at most two key-values), a lease, an
//! alarm or a section, so it stays far below 4 GiB: a key-value is at
//! most `--max-request-bytes`, which the flag bounds at 1 GiB
//! (`config::MAX_REQUEST_BYTES_LIMIT`).
//! The writer never truncates a length; the reader refuses any length the
//! bytes do not hold, without allocating for it.

/// Writes records after a magic header.
pub(super) struct Writer {
    /// Everything written so far.
    pub(super) out: Vec<u8>,
    /// Records written so far.
    pub(super) records: u64,
}

impl Writer {
    /// A writer that starts with `magic`.
    pub(super) fn new(magic: &[u8]) -> Writer {
        Writer {
            out: magic.to_vec(),
            records: 0,
        }
    }

    /// Appends one record of `kind`.
    pub(super) fn record(&mut self, kind: u8, payload: &[u8]) {
        let mut crc = crc32fast::Hasher::new();
        crc.update(&[kind]);
        crc.update(payload);
        // Never a truncated length (see the module docs).
        let len = u32::try_from(payload.len() + 1).expect(
            "a snapshot record under 4 GiB: histories are cut, key-values are at most 1 GiB",
        );
        self.out.extend_from_slice(&len.to_le_bytes());
        self.out.extend_from_slice(&crc.finalize().to_le_bytes());
        self.out.push(kind);
        self.out.extend_from_slice(payload);
        self.records += 1;
    }
}

/// Reads records off a byte slice.
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
    /// Where the next record starts.
    pub(super) at: usize,
}

impl<'a> Reader<'a> {
    /// A reader of the records of `bytes` from byte `at`.
    pub(super) fn new(bytes: &'a [u8], at: usize) -> Reader<'a> {
        Reader { bytes, at }
    }

    /// Record `n` (for messages): its kind and payload, checked against
    /// its CRC; sliced from the bytes, so its length sizes no allocation.
    pub(super) fn record(&mut self, n: u64) -> Result<(u8, &'a [u8]), String> {
        let at = self.at;
        let head = self
            .bytes
            .get(at..at + 8)
            .ok_or_else(|| format!("cut short before record {n} at byte {at}"))?;
        let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(head[4..].try_into().expect("4 bytes"));
        if len == 0 {
            return Err(format!(
                "record {n} at byte {at} has an impossible length 0"
            ));
        }
        let body = self
            .bytes
            .get(at + 8..(at + 8).saturating_add(len))
            .ok_or_else(|| format!("record {n} at byte {at} is incomplete"))?;
        if crc32fast::hash(body) != crc {
            return Err(format!("record {n} at byte {at} fails its checksum"));
        }
        self.at = at + 8 + len;
        Ok((body[0], &body[1..]))
    }
}
