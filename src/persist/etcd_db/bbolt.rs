//! Reading a bbolt database file: its newest valid meta page and the
//! buckets and key-values of its B+tree, in key order; and clearing the
//! bytes of one that no page in use holds. Read-only and whole
//! file in memory; every offset is checked, so a damaged file is an error
//! that says where, never a panic. (The `bbolt-rs` crate that writes
//! ephd's snapshots cannot open files written without a synced freelist,
//! as etcd writes them.)

const PAGE_HEADER: usize = 16;
const ELEMENT: usize = 16;
const BRANCH_PAGE: u16 = 0x01;
const LEAF_PAGE: u16 = 0x02;
const META_PAGE: u16 = 0x04;
const BUCKET_LEAF: u32 = 0x01;
const MAGIC: u32 = 0xED0C_DAED;
/// Bytes of a meta page's fields covered by its checksum.
const META_CHECKED: usize = 56;
/// How deep a tree may go before the file is called damaged (bbolt's
/// trees are a handful of levels; a cycle would recurse forever).
const MAX_DEPTH: usize = 64;

/// A bucket's key-values, in key order.
pub(super) type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// What [`Bolt::walk`] calls for each element: key, value, element flags.
type Visit<'f> = dyn FnMut(&[u8], &[u8], u32) -> Result<(), String> + 'f;

/// A database read into memory.
pub(super) struct Bolt {
    bytes: Vec<u8>,
    page_size: usize,
    root: u64,
    freelist: u64,
}

/// Where a bucket's tree lives: its own pages, or inline in its parent's
/// value.
#[derive(Clone, Copy)]
enum Tree<'a> {
    Page(u64),
    Inline(&'a [u8]),
}

impl Bolt {
    /// Reads the meta pages of `bytes` (the whole file).
    pub fn new(bytes: Vec<u8>) -> Result<Bolt, String> {
        let page_size = meta(&bytes, 0).map(|m| m.page_size).or_else(|_| {
            // Meta page 0 damaged: find the second by trying the sizes
            // bbolt uses.
            [4096usize, 8192, 16384, 65536]
                .into_iter()
                .find_map(|size| meta(&bytes, size).ok().filter(|m| m.page_size == size))
                .map(|m| m.page_size)
                .ok_or("no valid meta page: not a bbolt database, or damaged".to_string())
        })?;
        if !bytes.len().is_multiple_of(page_size) {
            return Err(format!(
                "the database is cut short ({} bytes is not a whole number of {page_size}-byte \
                 pages)",
                bytes.len()
            ));
        }
        let best = [meta(&bytes, 0), meta(&bytes, page_size)]
            .into_iter()
            .flatten()
            .max_by_key(|m| m.txid)
            .ok_or("no valid meta page")?;
        Ok(Bolt {
            bytes,
            page_size,
            root: best.root,
            freelist: best.freelist,
        })
    }

    /// The key-values of the top-level bucket `name` (`None` if there is
    /// no such bucket).
    pub fn bucket(&self, name: &[u8]) -> Result<Option<Entries>, String> {
        let mut found = None;
        self.walk(Tree::Page(self.root), 0, &mut |k, v, flags| {
            if flags & BUCKET_LEAF != 0 && k == name {
                found = Some(v.to_vec());
            }
            Ok(())
        })?;
        let Some(header) = found else {
            return Ok(None);
        };
        let tree = bucket_tree(&header)?;
        let mut entries = Vec::new();
        self.walk(tree, 0, &mut |k, v, flags| {
            if flags & BUCKET_LEAF == 0 {
                entries.push((k.to_vec(), v.to_vec()));
            }
            Ok(())
        })?;
        Ok(Some(entries))
    }

    /// Calls `f(key, value, flags)` for every element under `tree`, in key
    /// order.
    fn walk<'a>(&'a self, tree: Tree<'a>, depth: usize, f: &mut Visit<'_>) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("a tree deeper than any bbolt writes (a cycle?)".into());
        }
        let (page, what) = match tree {
            Tree::Page(id) => (self.page(id)?, format!("page {id}")),
            Tree::Inline(bytes) => (bytes, "an inline bucket".to_string()),
        };
        let header = page
            .get(..PAGE_HEADER)
            .ok_or_else(|| format!("{what}: cut short"))?;
        let flags = u16::from_le_bytes([header[8], header[9]]);
        let count = u16::from_le_bytes([header[10], header[11]]) as usize;
        for i in 0..count {
            let at = PAGE_HEADER + i * ELEMENT;
            let e = page
                .get(at..at + ELEMENT)
                .ok_or_else(|| format!("{what}: element {i} out of the page"))?;
            let word = |n: usize| u32::from_le_bytes([e[n], e[n + 1], e[n + 2], e[n + 3]]);
            match flags {
                LEAF_PAGE => {
                    let (eflags, pos, ksize, vsize) = (
                        word(0),
                        word(4) as usize,
                        word(8) as usize,
                        word(12) as usize,
                    );
                    let key_at = at + pos;
                    let key = page
                        .get(key_at..key_at + ksize)
                        .ok_or_else(|| format!("{what}: key {i} out of the page"))?;
                    let value = page
                        .get(key_at + ksize..key_at + ksize + vsize)
                        .ok_or_else(|| format!("{what}: value {i} out of the page"))?;
                    f(key, value, eflags)?;
                }
                BRANCH_PAGE => {
                    let child = u64::from_le_bytes(e[8..16].try_into().expect("8 bytes"));
                    self.walk(Tree::Page(child), depth + 1, f)?;
                }
                other => return Err(format!("{what}: flags {other:#x}, not a tree page")),
            }
        }
        Ok(())
    }

    /// The database with every byte that no page in use holds set to
    /// zero: free pages, and the slack after each page's header, elements,
    /// keys and values. A writer that does not clear the memory it writes
    /// pages from leaves whatever that memory held there; nothing of it
    /// may leave the process in a snapshot.
    pub fn scrubbed(self) -> Result<Vec<u8>, String> {
        let mut used = vec![(0, PAGE_HEADER + 64), (self.page_size, PAGE_HEADER + 64)];
        if self.freelist != u64::MAX {
            let page = self.page(self.freelist)?;
            let count = u16::from_le_bytes([page[10], page[11]]) as usize;
            // A count of 0xFFFF is kept in the first element instead.
            let ids = if count == 0xFFFF {
                page.get(16..24)
                    .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize + 1)
                    .ok_or("freelist page cut short")?
            } else {
                count
            };
            used.push((self.start(self.freelist), PAGE_HEADER + ids * 8));
        }
        self.pages_in_use(Tree::Page(self.root), 0, &mut used)?;
        used.sort_unstable();
        let mut bytes = self.bytes;
        let mut from = 0;
        for (start, len) in used {
            if start > from {
                bytes[from..start].fill(0);
            }
            from = from.max(start + len).min(bytes.len());
        }
        bytes[from..].fill(0);
        Ok(bytes)
    }

    /// Adds (start, bytes used) of every page of `tree` and of the trees of
    /// the buckets in it.
    fn pages_in_use(
        &self,
        tree: Tree<'_>,
        depth: usize,
        used: &mut Vec<(usize, usize)>,
    ) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err("a tree deeper than any bbolt writes (a cycle?)".into());
        }
        let Tree::Page(id) = tree else {
            // An inline bucket is sized to what it holds; its buckets are
            // inline too.
            return Ok(());
        };
        let page = self.page(id)?;
        let flags = u16::from_le_bytes([page[8], page[9]]);
        let count = u16::from_le_bytes([page[10], page[11]]) as usize;
        let mut end = PAGE_HEADER + count * ELEMENT;
        for i in 0..count {
            let at = PAGE_HEADER + i * ELEMENT;
            let e = page
                .get(at..at + ELEMENT)
                .ok_or_else(|| format!("page {id}: element {i} out of the page"))?;
            let word = |n: usize| u32::from_le_bytes([e[n], e[n + 1], e[n + 2], e[n + 3]]) as usize;
            if flags == LEAF_PAGE {
                let (key_at, ksize, vsize) = (at + word(4), word(8), word(12));
                end = end.max(key_at + ksize + vsize);
                if word(0) as u32 & BUCKET_LEAF != 0 {
                    let value = page
                        .get(key_at + ksize..key_at + ksize + vsize)
                        .ok_or_else(|| format!("page {id}: value {i} out of the page"))?;
                    self.pages_in_use(bucket_tree(value)?, depth + 1, used)?;
                }
            } else if flags == BRANCH_PAGE {
                end = end.max(at + word(0) + word(4));
                let child = u64::from_le_bytes(e[8..16].try_into().expect("8 bytes"));
                self.pages_in_use(Tree::Page(child), depth + 1, used)?;
            } else {
                return Err(format!("page {id}: flags {flags:#x}, not a tree page"));
            }
        }
        used.push((self.start(id), end.min(page.len())));
        Ok(())
    }

    fn start(&self, id: u64) -> usize {
        id as usize * self.page_size
    }

    /// The bytes of page `id` with its overflow pages.
    fn page(&self, id: u64) -> Result<&[u8], String> {
        let start = (id as usize)
            .checked_mul(self.page_size)
            .filter(|s| *s < self.bytes.len())
            .ok_or_else(|| format!("page {id} is beyond the file"))?;
        let header = self
            .bytes
            .get(start..start + PAGE_HEADER)
            .ok_or_else(|| format!("page {id}: cut short"))?;
        let overflow = u32::from_le_bytes(header[12..16].try_into().expect("4 bytes")) as usize;
        let end = overflow
            .checked_add(1)
            .and_then(|n| n.checked_mul(self.page_size))
            .and_then(|n| n.checked_add(start))
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| format!("page {id}: its overflow pages are beyond the file"))?;
        Ok(&self.bytes[start..end])
    }
}

/// A bucket value's tree: `root` 0 means the tree is inline after the
/// 16-byte bucket header.
fn bucket_tree(header: &[u8]) -> Result<Tree<'_>, String> {
    let root = header
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or("a bucket header cut short")?;
    Ok(if root == 0 {
        Tree::Inline(&header[16.min(header.len())..])
    } else {
        Tree::Page(root)
    })
}

struct Meta {
    page_size: usize,
    root: u64,
    freelist: u64,
    txid: u64,
}

/// The meta page at byte `at`, if its magic, version and checksum hold.
fn meta(bytes: &[u8], at: usize) -> Result<Meta, String> {
    let page = bytes
        .get(at..at + PAGE_HEADER + 64)
        .ok_or("file too short for a meta page")?;
    let flags = u16::from_le_bytes([page[8], page[9]]);
    let m = &page[PAGE_HEADER..];
    let u32_at = |n: usize| u32::from_le_bytes(m[n..n + 4].try_into().expect("4 bytes"));
    let u64_at = |n: usize| u64::from_le_bytes(m[n..n + 8].try_into().expect("8 bytes"));
    if flags != META_PAGE || u32_at(0) != MAGIC {
        return Err("no bbolt magic".into());
    }
    if u32_at(4) != 2 {
        return Err(format!("bbolt version {}, not 2", u32_at(4)));
    }
    if u64_at(META_CHECKED) != fnv1a64(&m[..META_CHECKED]) {
        return Err("meta page checksum does not match".into());
    }
    let page_size = u32_at(8) as usize;
    if !(512..=1 << 20).contains(&page_size) {
        return Err(format!("page size {page_size}"));
    }
    Ok(Meta {
        page_size,
        root: u64_at(16),
        freelist: u64_at(32),
        txid: u64_at(48),
    })
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}
