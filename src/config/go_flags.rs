//! Go-style flags: etcd parses its command line with Go's `flag` package,
//! which takes a long flag after one dash as well as two (`-name x`,
//! `-data-dir=/var/lib/etcd`, `-client-cert-auth`). Manifests and systemd
//! units written for etcd use both forms, so every single-dash word is read
//! as its two-dash form before clap sees it (ephd has no short flags but
//! clap's `-h` and `-V`, which stay as they are).
//!
//! Go takes the argument after a flag that needs a value as that value,
//! whatever it starts with, so `-initial-cluster-token -abc` keeps `-abc`
//! as the token: such a pair is handed to clap joined (`--flag=value`).
//! Like Go's parser, a lone `--` ends the flags.

use clap::{Arg, Command};
use std::collections::HashMap;
use std::ffi::OsString;

/// `args` (the program name first) with every single-dash long flag
/// written with two dashes and every flag that takes a separate value
/// joined to it with `=`.
pub(super) fn with_long_dashes(cmd: &Command, args: Vec<OsString>) -> Vec<OsString> {
    // Built, so that every flag's number of values is settled.
    let mut cmd = cmd.clone();
    cmd.build();
    let flags = long_flags(&cmd);
    let mut out: Vec<OsString> = Vec::with_capacity(args.len());
    let mut value_expected = false;
    let mut ended = false;
    for (i, arg) in args.into_iter().enumerate() {
        if i == 0 || ended {
            out.push(arg);
            continue;
        }
        if std::mem::take(&mut value_expected) {
            let flag = out.last_mut().expect("a flag precedes its value");
            flag.push("=");
            flag.push(arg);
            continue;
        }
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if text == "--" {
            ended = true;
            out.push(arg);
            continue;
        }
        let name = match text.strip_prefix("--") {
            Some(rest) => rest,
            None => match text.strip_prefix('-') {
                Some(rest) if rest.len() > 1 => rest,
                _ => {
                    out.push(arg);
                    continue;
                }
            },
        };
        if let Some(flag) = flags.get(name) {
            value_expected = takes_separate_value(flag);
        }
        out.push(OsString::from(format!("--{name}")));
    }
    out
}

/// Whether the flag, given without `=`, takes the next argument as its
/// value (a boolean flag alone means true, as in Go).
fn takes_separate_value(flag: &Arg) -> bool {
    flag.get_num_args()
        .is_some_and(|range| range.min_values() > 0)
}

/// Every long name and alias of `cmd`, `help` and `version` included
/// (`-help` prints the usage in Go too).
fn long_flags(cmd: &Command) -> HashMap<&str, &Arg> {
    let mut map = HashMap::new();
    for arg in cmd.get_arguments() {
        for name in arg
            .get_long()
            .into_iter()
            .chain(arg.get_all_aliases().unwrap_or_default())
        {
            if name.len() > 1 {
                map.insert(name, arg);
            }
        }
    }
    map
}
