//! The crate's module graph has no cycle: dependencies inside `src/` run
//! one way, so each layer can be read, tested and replaced on its own.
//!
//! The graph is read from the source text: every `crate::…`, `super::…`
//! and `self::…` path in code (comments and strings excluded) is an edge
//! from the file it appears in to the file of the module it names. A
//! parent's `mod child;` declarations and `pub use` re-exports of its own
//! children are containment, not dependencies, and are left out. The check
//! runs at two levels: between files, and between top-level modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (e.g. `["mvcc", "store"]`) of every `.rs` file under `src/`,
/// except binaries (their own crates).
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("dir entry").path();
            let rel = path.strip_prefix(src).unwrap().to_path_buf();
            if rel.starts_with("bin") || rel.starts_with("main.rs") {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let mut parts: Vec<String> = rel
                .iter()
                .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            if parts.last().is_some_and(|l| l == "mod" || l == "lib") {
                parts.pop();
            }
            out.insert(parts, path);
        }
    }
    out
}

/// The source with comments, string and char literals blanked out, so only
/// code paths are seen.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i += 2;
            while i < b.len() && !b[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('x' or '\n'); lifetimes have no closing quote.
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// The module a path names: the longest prefix of `target` that is a known
/// module.
fn resolve(mods: &BTreeMap<Vec<String>, PathBuf>, mut target: Vec<String>) -> Option<Vec<String>> {
    while !target.is_empty() {
        if mods.contains_key(&target) {
            return Some(target);
        }
        target.pop();
    }
    None
}

/// Every path expression starting at `anchor` (`crate`, `super`, `self`)
/// in `code`, with the `use` statement it sits in, if any, expanded.
fn paths(code: &str) -> Vec<(bool, Vec<String>)> {
    let mut out = Vec::new();
    // Statements: split on ';' and '{'/'}' of use groups is handled by
    // expanding `use a::{b, c::d}` groups one level at a time.
    for stmt in code.split(';') {
        let trimmed = stmt.trim_start();
        let reexport = trimmed.starts_with("pub use") || trimmed.starts_with("pub(crate) use");
        let is_use = reexport || trimmed.starts_with("use ");
        if is_use {
            let body = trimmed.split_once("use ").map(|x| x.1).unwrap_or("");
            for p in expand_use(body) {
                out.push((reexport, p));
            }
            continue;
        }
        let words: Vec<&str> = stmt
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .filter(|w| {
                w.starts_with("crate::") || w.starts_with("super::") || w.starts_with("self::")
            })
            .collect();
        for w in words {
            out.push((false, w.split("::").map(str::to_string).collect()));
        }
    }
    out
}

/// `a::{b, c::{d, e}}` → [a::b, a::c::d, a::c::e].
fn expand_use(body: &str) -> Vec<Vec<String>> {
    // Renames (`a::b as c`) keep only the path; mark them before the
    // white space goes.
    let body: String = body
        .replace(" as ", "@")
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let mut out = Vec::new();
    expand_into(&body, &mut Vec::new(), &mut out);
    out
}

fn expand_into(body: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if let Some(open) = body.find('{') {
        let head: Vec<String> = body[..open]
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        let inner = &body[open + 1..body.rfind('}').unwrap_or(body.len())];
        let mut depth = 0;
        let mut start = 0;
        let mut items = Vec::new();
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(&inner[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        items.push(&inner[start..]);
        let len = prefix.len();
        prefix.extend(head);
        for item in items.into_iter().filter(|i| !i.is_empty()) {
            expand_into(item, prefix, out);
        }
        prefix.truncate(len);
    } else {
        let mut p = prefix.clone();
        p.extend(
            body.split('@')
                .next()
                .unwrap_or("")
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string),
        );
        out.push(p);
    }
}

/// Absolute module path of `path` as written in module `at`, or `None` for
/// paths into other crates.
fn absolute(at: &[String], is_dir_module: bool, path: &[String]) -> Option<Vec<String>> {
    let mut base: Vec<String> = at.to_vec();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        _ => {
            // A bare `use child::…` inside a module names its child.
            let first = rest.first()?;
            if first.chars().next().is_some_and(|c| c.is_lowercase()) {
                let mut p = at.to_vec();
                let _ = is_dir_module;
                p.extend(rest.iter().cloned());
                return Some(p);
            }
            return None;
        }
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

fn edges(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mods = modules(src);
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, file) in &mods {
        let text = std::fs::read_to_string(file).expect("read source");
        let code = code_only(&text);
        // `#[cfg(test)]` modules may use anything in the crate.
        let code = code
            .split("#[cfg(test)]\nmod tests {")
            .next()
            .unwrap_or(&code)
            .to_string();
        let is_dir = file.ends_with("mod.rs") || file.ends_with("lib.rs");
        let deps = graph.entry(module.clone()).or_default();
        for (reexport, path) in paths(&code) {
            let Some(abs) = absolute(module, is_dir, &path) else {
                continue;
            };
            let Some(target) = resolve(&mods, abs) else {
                continue;
            };
            let is_child = target.len() > module.len() && target.starts_with(module);
            if &target == module || (reexport && is_child) {
                continue;
            }
            deps.insert(target);
        }
    }
    graph
}

/// A cycle in `graph`, if there is one.
fn find_cycle<N: Ord + Clone>(graph: &BTreeMap<N, BTreeSet<N>>) -> Option<Vec<N>> {
    fn visit<N: Ord + Clone>(
        n: &N,
        graph: &BTreeMap<N, BTreeSet<N>>,
        state: &mut BTreeMap<N, u8>,
        stack: &mut Vec<N>,
    ) -> Option<Vec<N>> {
        state.insert(n.clone(), 1);
        stack.push(n.clone());
        for m in graph.get(n).into_iter().flatten() {
            match state.get(m).copied().unwrap_or(0) {
                1 => {
                    let from = stack.iter().position(|x| x == m).unwrap();
                    let mut cycle = stack[from..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(m, graph, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if state.get(n).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(n, graph, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_module_cycle_between_files() {
    let graph = edges(&src_dir());
    assert!(
        graph.len() > 30,
        "the graph covers the crate: {}",
        graph.len()
    );
    // The reader sees real edges, e.g. the store uses its index.
    let store = vec!["mvcc".to_string(), "store".to_string()];
    assert!(graph[&store].contains(&vec!["mvcc".to_string(), "index".to_string()]));
    if let Some(cycle) = find_cycle(&graph) {
        let names: Vec<String> = cycle.iter().map(|m| m.join("::")).collect();
        panic!("module cycle: {}", names.join(" -> "));
    }
}

#[test]
fn no_cycle_between_top_level_modules() {
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, tos) in edges(&src_dir()) {
        let Some(a) = from.first().cloned() else {
            continue; // lib.rs
        };
        let deps = top.entry(a.clone()).or_default();
        for to in tos {
            if let Some(b) = to.first() {
                if *b != a {
                    deps.insert(b.clone());
                }
            }
        }
    }
    assert!(top["mvcc"].contains("lease"), "mvcc uses the lessor");
    assert!(!top["lease"].contains("mvcc"), "the lessor knows no store");
    if let Some(cycle) = find_cycle(&top) {
        panic!("top-level module cycle: {}", cycle.join(" -> "));
    }
}

/// The checker itself finds a cycle through `use` groups, `super::` paths
/// and plain paths in code, and ignores re-exports of children.
#[test]
fn the_checker_sees_cycles_and_ignores_reexports() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path();
    std::fs::create_dir_all(src.join("core")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod core;\npub mod top;\n").unwrap();
    std::fs::write(
        src.join("core/mod.rs"),
        "mod index;\nmod store;\npub use store::Store;\npub use index::Index;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("core/index.rs"),
        "// use super::store::Nothing; (a comment)\nuse super::store::{History, Other as O};\n",
    )
    .unwrap();
    std::fs::write(
        src.join("core/store.rs"),
        "fn f() { let s = \"crate::top\"; crate::core::index::make(); }\n",
    )
    .unwrap();
    std::fs::write(src.join("top.rs"), "use crate::core::Store;\n").unwrap();
    let graph = edges(src);
    let module = |p: &str| p.split("::").map(str::to_string).collect::<Vec<_>>();
    assert_eq!(
        graph[&module("core::index")],
        BTreeSet::from([module("core::store")])
    );
    assert_eq!(
        graph[&module("core::store")],
        BTreeSet::from([module("core::index")]),
        "string literals are not paths"
    );
    assert!(
        graph[&module("core")].is_empty(),
        "re-exports are containment"
    );
    assert_eq!(graph[&module("top")], BTreeSet::from([module("core")]));
    let cycle = find_cycle(&graph).expect("index <-> store");
    assert_eq!(cycle.len(), 3);
}

/// The library is embeddable (`ephd::embed`): two servers in one process
/// must not share settings or state through statics, and settings come
/// from the configuration, not from environment reads deep inside. A
/// static that can change, or an environment read, outside the places
/// listed here fails.
#[test]
fn no_mutable_process_globals_or_environment_reads_in_the_library() {
    // The gateway's descriptor pool: built once from compiled-in bytes,
    // the same for every server.
    const STATICS_ALLOWED: &[&str] = &["gateway/json.rs"];
    // Loading the configuration (flags and EPHD_*/ETCD_* variables), and
    // the NO_COLOR convention of the text logger.
    const ENV_ALLOWED: &[&str] = &["config/load.rs", "logging.rs"];
    const MUTABLE: &[&str] = &[
        "Atomic", "Mutex", "RwLock", "OnceLock", "LazyLock", "Cell", "OnceCell",
    ];
    let src = src_dir();
    let mut found = Vec::new();
    for path in modules(&src).values() {
        let rel = path.strip_prefix(&src).unwrap().display().to_string();
        if rel == "main.rs" {
            continue;
        }
        let code = code_only(&std::fs::read_to_string(path).unwrap());
        for (n, line) in code.lines().enumerate() {
            let line = line.trim();
            let is_static = line.starts_with("static ") || line.contains(" static ");
            let mutable = is_static && MUTABLE.iter().any(|m| line.contains(m));
            if (mutable || line.contains("thread_local!"))
                && !STATICS_ALLOWED.contains(&rel.as_str())
            {
                found.push(format!("{rel}:{}: {line}", n + 1));
            }
            let env = line.contains("env::var") || line.contains("env::vars");
            if env && !ENV_ALLOWED.contains(&rel.as_str()) {
                found.push(format!("{rel}:{}: {line}", n + 1));
            }
        }
    }
    assert!(found.is_empty(), "process globals:\n{}", found.join("\n"));
}

/// The services are thin adapters over one seam (`src/backend/`): they
/// never name the cluster module, and never ask which mode they serve
/// (no match on the backend's mode, no reach for the Raft node behind a
/// cluster member). Their tests may build either mode.
#[test]
fn the_services_reach_either_mode_only_through_the_backend() {
    const ADAPTERS: &[&str] = &["api", "concurrency", "gateway", "http"];
    const MODE_BRANCHES: &[&str] = &["cluster_node(", "Mode::", ".node()"];
    let is_adapter = |m: &[String]| m.first().is_some_and(|t| ADAPTERS.contains(&t.as_str()));
    let is_test = |m: &[String]| {
        m.last()
            .is_some_and(|l| l == "tests" || l.ends_with("_tests"))
    };
    let graph = edges(&src_dir());
    let mut found = Vec::new();
    for (module, uses) in &graph {
        if !is_adapter(module) || is_test(module) {
            continue;
        }
        for used in uses
            .iter()
            .filter(|u| u.first().is_some_and(|t| t == "cluster"))
        {
            found.push(format!("{} uses {}", module.join("::"), used.join("::")));
        }
    }
    let src = src_dir();
    for (module, path) in modules(&src) {
        if !is_adapter(&module) || is_test(&module) {
            continue;
        }
        let code = code_only(&std::fs::read_to_string(&path).unwrap());
        for (n, line) in code.lines().enumerate() {
            if MODE_BRANCHES.iter().any(|b| line.contains(b)) {
                found.push(format!("{}:{}: {}", module.join("::"), n + 1, line.trim()));
            }
        }
    }
    assert!(
        graph[&vec!["api".to_string(), "kv".to_string()]].contains(&vec!["backend".to_string()]),
        "the checker sees the KV service call the backend"
    );
    assert!(
        found.is_empty(),
        "mode knowledge in the services:\n{}",
        found.join("\n")
    );
}

/// `src/cluster/` is layered: each folder imports only the folders before
/// it in this list (or itself), so a reader can start at the log and go
/// up. Every cluster file but the folder's map sits in one of them. Test
/// modules may use any layer.
#[test]
fn the_cluster_layers_import_only_downwards() {
    const LAYERS: &[&str] = &[
        "log",
        "replicated",
        "transport",
        "member",
        "node",
        "serve",
        "lifecycle",
    ];
    let layer = |m: &[String]| -> Option<usize> {
        if m.first().map(String::as_str) != Some("cluster") || m.len() < 2 {
            return None;
        }
        LAYERS.iter().position(|l| *l == m[1])
    };
    let is_test = |m: &[String]| {
        m.last()
            .is_some_and(|l| l == "tests" || l.ends_with("_tests"))
    };
    let graph = edges(&src_dir());
    let mut found = Vec::new();
    for (module, uses) in &graph {
        if module.first().map(String::as_str) != Some("cluster") || module.len() < 2 {
            continue;
        }
        let Some(from) = layer(module) else {
            found.push(format!("{} is in no layer", module.join("::")));
            continue;
        };
        if is_test(module) {
            continue;
        }
        for used in uses {
            if let Some(to) = layer(used) {
                if to > from {
                    found.push(format!(
                        "{} ({}) uses {} ({})",
                        module.join("::"),
                        LAYERS[from],
                        used.join("::"),
                        LAYERS[to]
                    ));
                }
            }
        }
    }
    let path = |p: &str| p.split("::").map(String::from).collect::<Vec<_>>();
    assert!(
        graph[&path("cluster::node::raft_loop")].contains(&path("cluster::log::queue")),
        "the checker sees the Raft loop use its queue"
    );
    assert!(found.is_empty(), "cluster layers:\n{}", found.join("\n"));
}
