//! etcd's YAML configuration file (`--config-file`), turned into the flags
//! it stands for, so a file and a command line are checked by the same
//! parser and mean the same thing.
//!
//! etcd 3.4 reads the file into its `embed.Config`: the keys are the flag
//! names, the client and peer TLS settings sit in two sections
//! (`client-transport-security`, `peer-transport-security`), URL lists are
//! comma-separated strings, and durations are integers of nanoseconds (Go's
//! `time.Duration` in JSON). ephd takes the same, and also YAML lists for
//! list values and Go duration strings (`5s`), which etcd refuses. Keys it
//! does not know are skipped with a warning (etcd skips them silently); an
//! empty or `null` value leaves the default, as in etcd.

use yaml_rust2::{Yaml, YamlLoader};

/// The keys of the two TLS sections and the flags they stand for.
const CLIENT_SECURITY: &[(&str, &str)] = &[
    ("cert-file", "cert-file"),
    ("key-file", "key-file"),
    ("client-cert-auth", "client-cert-auth"),
    ("trusted-ca-file", "trusted-ca-file"),
    ("auto-tls", "auto-tls"),
    ("crl-file", "client-crl-file"),
    ("allowed-hostname", "client-cert-allowed-hostname"),
];
const PEER_SECURITY: &[(&str, &str)] = &[
    ("cert-file", "peer-cert-file"),
    ("key-file", "peer-key-file"),
    ("client-cert-auth", "peer-client-cert-auth"),
    ("trusted-ca-file", "peer-trusted-ca-file"),
    ("auto-tls", "peer-auto-tls"),
    ("crl-file", "peer-crl-file"),
    ("allowed-cn", "peer-cert-allowed-cn"),
    ("allowed-hostname", "peer-cert-allowed-hostname"),
];

/// What a flag's value looks like, so YAML scalars can be written the way
/// the flag parser reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ValueKind {
    Bool,
    Duration,
    Other,
}

/// The flags a configuration file stands for: `(flag, value)` pairs in file
/// order, and a warning for each key that is no flag.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct FileFlags {
    pub flags: Vec<(String, String)>,
    pub warnings: Vec<String>,
}

/// Reads the YAML `text` of `path`; `kind` tells whether a flag exists
/// (`None`: unknown key) and what its value looks like.
pub(super) fn parse(
    path: &str,
    text: &str,
    kind: &dyn Fn(&str) -> Option<ValueKind>,
) -> Result<FileFlags, String> {
    let docs = YamlLoader::load_from_str(text)
        .map_err(|e| format!("cannot parse configuration file {path}: {e}"))?;
    let mut out = FileFlags::default();
    let root = match docs.into_iter().next() {
        None | Some(Yaml::Null) => return Ok(out),
        Some(Yaml::Hash(h)) => h,
        Some(_) => {
            return Err(format!(
                "configuration file {path}: expected a mapping of etcd flag names to values"
            ))
        }
    };
    for (key, value) in root {
        let key = key_name(path, &key)?;
        let section = match key.as_str() {
            "client-transport-security" => Some(CLIENT_SECURITY),
            "peer-transport-security" => Some(PEER_SECURITY),
            _ => None,
        };
        if let Some(section) = section {
            match value {
                Yaml::Null => {}
                Yaml::Hash(h) => {
                    for (sub, v) in h {
                        let sub = key_name(path, &sub)?;
                        match section.iter().find(|(k, _)| *k == sub) {
                            Some((_, flag)) => add(path, &mut out, flag, &v, kind)?,
                            None => out.warnings.push(unknown(path, &format!("{key}.{sub}"))),
                        }
                    }
                }
                _ => {
                    return Err(format!(
                        "configuration file {path}: {key} must be a mapping"
                    ))
                }
            }
            continue;
        }
        if key == "config-file" {
            out.warnings.push(unknown(path, &key));
            continue;
        }
        add(path, &mut out, &key, &value, kind)?;
    }
    Ok(out)
}

fn unknown(path: &str, key: &str) -> String {
    format!("configuration file {path}: unrecognized key {key:?} ignored")
}

fn key_name(path: &str, key: &Yaml) -> Result<String, String> {
    match key {
        Yaml::String(s) => Ok(s.clone()),
        other => Err(format!(
            "configuration file {path}: key {other:?} is not a flag name"
        )),
    }
}

/// Adds `flag: value` to `out` (nothing for an empty value: the default
/// stays, as in etcd).
fn add(
    path: &str,
    out: &mut FileFlags,
    flag: &str,
    value: &Yaml,
    kind: &dyn Fn(&str) -> Option<ValueKind>,
) -> Result<(), String> {
    let Some(k) = kind(flag) else {
        out.warnings.push(unknown(path, flag));
        return Ok(());
    };
    let text = match value {
        Yaml::Array(items) => {
            let parts = items
                .iter()
                .map(|v| scalar(path, flag, v, k))
                .collect::<Result<Vec<_>, _>>()?;
            parts.join(",")
        }
        v => scalar(path, flag, v, k)?,
    };
    if !text.is_empty() {
        out.flags.push((flag.to_string(), text));
    }
    Ok(())
}

/// One scalar as the flag parser reads it.
fn scalar(path: &str, flag: &str, v: &Yaml, kind: ValueKind) -> Result<String, String> {
    Ok(match v {
        Yaml::Null => String::new(),
        Yaml::Boolean(b) => b.to_string(),
        Yaml::Integer(n) if kind == ValueKind::Duration => nanos(*n),
        Yaml::Integer(n) => n.to_string(),
        Yaml::Real(r) => r.clone(),
        // YAML 1.1 booleans, which etcd's YAML parser (go-yaml v2) reads.
        Yaml::String(s) if kind == ValueKind::Bool => match s.as_str() {
            "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => "true".into(),
            "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => "false".into(),
            _ => s.clone(),
        },
        Yaml::String(s) => s.clone(),
        _ => {
            return Err(format!(
                "configuration file {path}: {flag} must be a scalar or a list of scalars"
            ))
        }
    })
}

/// A Go `time.Duration` in nanoseconds, in duration syntax, exactly.
fn nanos(n: i64) -> String {
    if n == 0 {
        return "0".into();
    }
    for (unit, per) in [("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)] {
        if n % per == 0 {
            return format!("{}{unit}", n / per);
        }
    }
    format!("{n}ns")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(flag: &str) -> Option<ValueKind> {
        match flag {
            "client-cert-auth" | "auto-tls" | "peer-client-cert-auth" | "enable-pprof" => {
                Some(ValueKind::Bool)
            }
            "experimental-watch-progress-notify-interval" => Some(ValueKind::Duration),
            "name"
            | "listen-client-urls"
            | "log-outputs"
            | "cert-file"
            | "key-file"
            | "peer-cert-file"
            | "quota-backend-bytes"
            | "auto-compaction-retention"
            | "proxy"
            | "data-dir" => Some(ValueKind::Other),
            _ => None,
        }
    }

    fn flags(text: &str) -> FileFlags {
        parse("f.yml", text, &kind).unwrap()
    }

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn keys_become_flags_and_sections_become_tls_flags() {
        let f = flags(
            "name: 'm1'\ndata-dir:\nlisten-client-urls: http://a:1,http://b:2\n\
             quota-backend-bytes: 1000\nauto-compaction-retention: 1\nproxy: 'off'\n\
             client-transport-security:\n  cert-file: /c.pem\n  key-file: /k.pem\n  client-cert-auth: yes\n\
             peer-transport-security:\n  cert-file: /p.pem\n  client-cert-auth: false\n\
             enable-pprof: true\nlog-outputs: [stderr, stdout]\n",
        );
        assert_eq!(
            f.flags,
            pairs(&[
                ("name", "m1"),
                ("listen-client-urls", "http://a:1,http://b:2"),
                ("quota-backend-bytes", "1000"),
                ("auto-compaction-retention", "1"),
                ("proxy", "off"),
                ("cert-file", "/c.pem"),
                ("key-file", "/k.pem"),
                ("client-cert-auth", "true"),
                ("peer-cert-file", "/p.pem"),
                ("peer-client-cert-auth", "false"),
                ("enable-pprof", "true"),
                ("log-outputs", "stderr,stdout"),
            ])
        );
        assert!(f.warnings.is_empty(), "{:?}", f.warnings);
    }

    #[test]
    fn durations_are_nanoseconds_as_in_etcd_or_go_strings() {
        let f = flags("experimental-watch-progress-notify-interval: 5000000000\n");
        assert_eq!(
            f.flags,
            pairs(&[("experimental-watch-progress-notify-interval", "5s")])
        );
        let f = flags("experimental-watch-progress-notify-interval: 1m30s\n");
        assert_eq!(
            f.flags,
            pairs(&[("experimental-watch-progress-notify-interval", "1m30s")])
        );
        assert_eq!(nanos(1_500_000), "1500us");
        assert_eq!(nanos(250_000_000), "250ms");
        assert_eq!(nanos(7), "7ns");
    }

    #[test]
    fn unknown_keys_warn_and_bad_shapes_fail() {
        let f = flags("bogus: 1\nclient-transport-security:\n  nope: 1\n");
        assert!(f.flags.is_empty());
        assert_eq!(f.warnings.len(), 2);
        assert!(f.warnings[0].contains("\"bogus\""));
        assert!(f.warnings[1].contains("client-transport-security.nope"));
        assert_eq!(flags(""), FileFlags::default());
        assert!(parse("f.yml", "- a\n- b\n", &kind).is_err());
        assert!(parse("f.yml", "name: {a: 1}\n", &kind).is_err());
        assert!(parse("f.yml", "name: [unclosed\n", &kind).is_err());
        assert!(parse("f.yml", "client-transport-security: 1\n", &kind).is_err());
    }
}
