//! Key permissions as etcd checks them: a role grants READ, WRITE or
//! READWRITE on one key (empty `range_end`), on `[key, range_end)`, or on
//! everything from `key` on (`range_end` = `"\0"`). A request on one key is
//! allowed when some granted interval contains it; a request on a range
//! when the union of the user's granted intervals covers all of it.

/// etcd's `authpb.Permission.Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PermKind {
    /// READ (0).
    Read,
    /// WRITE (1).
    Write,
    /// READWRITE (2).
    ReadWrite,
}

impl PermKind {
    /// From etcd's wire number; unknown numbers read as READ, as Go's
    /// zero value does.
    pub fn from_i32(n: i32) -> Self {
        match n {
            1 => PermKind::Write,
            2 => PermKind::ReadWrite,
            _ => PermKind::Read,
        }
    }

    /// etcd's wire number.
    pub fn as_i32(self) -> i32 {
        match self {
            PermKind::Read => 0,
            PermKind::Write => 1,
            PermKind::ReadWrite => 2,
        }
    }

    /// Whether a grant of this kind allows an access of kind `want` (READ
    /// or WRITE).
    fn allows(self, want: PermKind) -> bool {
        self == PermKind::ReadWrite || self == want
    }
}

/// One granted permission of a role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permission {
    /// READ, WRITE or READWRITE.
    pub kind: PermKind,
    /// The key, or the start of the range.
    pub key: Vec<u8>,
    /// Empty for one key; `"\0"` for every key from `key` on.
    pub range_end: Vec<u8>,
}

/// An interval `[begin, end)` where `end == None` is unbounded.
struct Interval<'a> {
    begin: &'a [u8],
    end: Option<Vec<u8>>,
}

fn interval<'a>(key: &'a [u8], range_end: &[u8]) -> Interval<'a> {
    let end = if range_end.is_empty() {
        // One key: [key, key + "\0").
        let mut e = key.to_vec();
        e.push(0);
        Some(e)
    } else if range_end == [0] {
        None
    } else {
        Some(range_end.to_vec())
    };
    Interval { begin: key, end }
}

/// `a < b` where `None` is +infinity.
fn end_lt(a: &Option<Vec<u8>>, b: &Option<Vec<u8>>) -> bool {
    match (a, b) {
        (_, None) => a.is_some(),
        (None, Some(_)) => false,
        (Some(a), Some(b)) => a < b,
    }
}

/// Whether `perms` (every permission of every role of a user) allow an
/// access of kind `want` (READ or WRITE) to `key`/`range_end` as a request
/// names them (empty `range_end`: one key; `"\0"`: from `key` on).
pub fn permitted<'p>(
    perms: impl Iterator<Item = &'p Permission>,
    want: PermKind,
    key: &[u8],
    range_end: &[u8],
) -> bool {
    let mut granted: Vec<Interval<'p>> = perms
        .filter(|p| p.kind.allows(want))
        .map(|p| interval(&p.key, &p.range_end))
        .collect();
    if range_end.is_empty() {
        // One key: some granted interval contains it.
        return granted.iter().any(|g| {
            g.begin <= key
                && match &g.end {
                    None => true,
                    Some(e) => key < e.as_slice(),
                }
        });
    }
    let want = interval(key, range_end);
    granted.sort_by(|a, b| a.begin.cmp(b.begin));
    // Sweep: how far from `want.begin` the granted intervals cover
    // without a gap.
    let mut covered: Option<Vec<u8>> = Some(want.begin.to_vec());
    for g in &granted {
        let Some(c) = &covered else { break };
        if g.begin > c.as_slice() {
            break;
        }
        if end_lt(&covered, &g.end) {
            covered = g.end.clone();
        }
    }
    !end_lt(&covered, &want.end)
}

/// Inserts or updates `perm` in `perms`, kept sorted by key then range
/// end as etcd keeps them: granting the same key and range again replaces
/// its kind.
pub fn grant(perms: &mut Vec<Permission>, perm: Permission) {
    let at = perms.binary_search_by(|p| {
        (p.key.as_slice(), p.range_end.as_slice())
            .cmp(&(perm.key.as_slice(), perm.range_end.as_slice()))
    });
    match at {
        Ok(i) => perms[i].kind = perm.kind,
        Err(i) => perms.insert(i, perm),
    }
}
