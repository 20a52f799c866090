//! Human-readable mismatch reports: a line diff of the pretty-printed
//! responses, so the differing fields stand out in big messages.

use std::fmt::Write;

use super::Mismatch;

/// Formats up to `shown` mismatches in full and lists the rest briefly.
pub fn report(label: &str, seeds: &[u64], ops: usize, all: &[Mismatch], shown: usize) -> String {
    let mut out = format!(
        "{} mismatches between stock etcd and {label} (seeds {seeds:x?}, {ops} ops each; \
         rerun one with EPHD_DIFF_SEEDS=0x..). Later mismatches of a seed often follow \
         from its first one.\n",
        all.len()
    );
    for m in all.iter().take(shown) {
        let _ = write!(
            out,
            "\n===== seed {:#x}, op {} =====\nop: {}\n--- stock etcd / +++ {label}:\n{}",
            m.seed,
            m.at,
            m.op,
            line_diff(&m.reference, &m.candidate)
        );
    }
    if all.len() > shown {
        out.push_str("\nfurther mismatches at:");
        for m in &all[shown..] {
            let _ = write!(out, " {:#x}/{}", m.seed, m.at);
        }
        out.push('\n');
    }
    out
}

/// A unified-style diff (LCS over lines) with two lines of context.
pub fn line_diff(a: &str, b: &str) -> String {
    let a: Vec<&str> = a.lines().collect();
    let b: Vec<&str> = b.lines().collect();
    // lcs[i][j] = LCS length of a[i..] and b[j..].
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut lines: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            lines.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            lines.push(('+', b[j]));
            j += 1;
        } else {
            lines.push(('-', a[i]));
            i += 1;
        }
    }
    let near_change = |k: usize| {
        let lo = k.saturating_sub(2);
        let hi = (k + 3).min(lines.len());
        lines[lo..hi].iter().any(|(c, _)| *c != ' ')
    };
    let mut out = String::new();
    let mut skipped = false;
    for (k, (c, line)) in lines.iter().enumerate() {
        if near_change(k) {
            if skipped {
                out.push_str("  ...\n");
                skipped = false;
            }
            let _ = writeln!(out, "{c} {line}");
        } else {
            skipped = true;
        }
    }
    out
}
