//! Puts ephd's configuration together from its sources the way etcd 3.4
//! does, so an etcd command line, env file or configuration file carries
//! over unchanged:
//!
//! * With `--config-file` (or `ETCD_CONFIG_FILE`/`EPHD_CONFIG_FILE`), the
//!   file is the whole configuration: other flags and environment variables
//!   are ignored, with an info line saying so (etcd's rule).
//! * Command-line flags take one dash or two, as Go's flag package reads
//!   them ([`super::go_flags`]).
//! * Otherwise command-line flags, then environment variables: `ETCD_<FLAG>`
//!   for every flag (the name upper-cased, `-` → `_`) and ephd's own
//!   `EPHD_*` names. A flag given both on the command line and as
//!   `ETCD_<FLAG>` is refused, as etcd refuses it ("conflicting environment
//!   variable ... is shadowed"); an `EPHD_*` variable is overridden by the
//!   flag, as before. An `ETCD_*` variable that names no flag gets etcd's
//!   "unrecognized environment variable" warning.
//! * etcd flags without an ephd setting are judged by [`super::etcd`]:
//!   ignored with a warning, or refused.
//!
//! Nothing is logged here: logging is set up from the result, so what
//! loading has to say comes back as [`Notice`]s for the caller to log.

use super::etcd::{self, Kind};
use super::go_flags;
use super::yaml::{self, ValueKind};
use super::Config;
use clap::parser::ValueSource;
use clap::{Arg, ArgMatches, Command, CommandFactory, FromArgMatches};
use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

/// Something loading has to tell the operator, logged once logging is set
/// up (with the level it names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// Logged at INFO, e.g. which environment variables were used.
    Info(String),
    /// Logged at WARN, e.g. an etcd flag that is accepted and ignored.
    Warn(String),
}

/// The loaded configuration and what to log about it.
#[derive(Debug)]
pub struct Loaded {
    /// The configuration to run with.
    pub config: Config,
    /// What to log about it, in order, once logging is set up.
    pub notices: Vec<Notice>,
}

/// Why no configuration could be loaded.
#[derive(Debug)]
pub enum LoadError {
    /// From the command line, including `--help` and `--version`, which clap
    /// prints and exits for ([`clap::Error::exit`]).
    Clap(clap::Error),
    /// A refused flag, a conflicting or invalid environment variable, or a
    /// bad configuration file.
    Invalid(String),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Clap(e) => write!(f, "{e}"),
            LoadError::Invalid(m) => f.write_str(m),
        }
    }
}

/// Loads the configuration from this process' arguments and environment.
pub fn load() -> Result<Loaded, LoadError> {
    let env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    load_from(std::env::args_os(), &env)
}

/// Flags ephd implements whose values are durations: a configuration file
/// gives them in nanoseconds, as etcd's does. (The compat flags' kinds say
/// it for themselves.)
const DURATION_FLAGS: &[&str] = &[
    "experimental-watch-progress-notify-interval",
    "snapshot-interval",
    "compaction-safety-net",
    "overload-queue-timeout",
    "grpc-keepalive-interval",
    "grpc-keepalive-timeout",
    "tls-reload-interval",
    "experimental-warning-apply-duration",
];

/// Flags ephd implements whose values are booleans: a configuration file
/// may give them as YAML 1.1 words (`yes`, `on`), as etcd's parser reads them.
const BOOL_FLAGS: &[&str] = &[
    "client-cert-auth",
    "allow-insecure-plaintext",
    "strict-restore",
    "revision-continuity",
    "debug",
    "etcd-compat",
];

/// Loads the configuration from `args` (the first is the program name) and
/// the `ETCD_*` variables of `env`. ephd's own `EPHD_*` variables are read
/// by clap from the process environment.
pub fn load_from<I, T>(args: I, env: &[(String, String)]) -> Result<Loaded, LoadError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cmd = command();
    let args = go_flags::with_long_dashes(&cmd, args.into_iter().map(Into::into).collect());
    let cli = cmd
        .clone()
        .try_get_matches_from(&args)
        .map_err(LoadError::Clap)?;
    let mut notices = Vec::new();
    let file = cli
        .get_one::<PathBuf>("config_file")
        .cloned()
        .or_else(|| env_value(env, "ETCD_CONFIG_FILE").map(PathBuf::from));
    let matches = match &file {
        Some(path) => from_file(&cmd, path, &mut notices)?,
        None => {
            let extra = env_flags(&cmd, &cli, env, &mut notices)?;
            cmd.try_get_matches_from(args.iter().cloned().chain(extra))
                .map_err(LoadError::Clap)?
        }
    };
    let mut config = Config::from_arg_matches(&matches).map_err(LoadError::Clap)?;
    config.config_file = file;
    let kept = config.apply_etcd_compat(|id| {
        matches!(
            matches.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    });
    for flag in kept {
        notices.push(Notice::Info(format!(
            "--etcd-compat: {flag} keeps the value given for it"
        )));
    }
    let (warnings, cluster) = etcd::judge(&matches, &config.name).map_err(LoadError::Invalid)?;
    if cluster.is_some() && config.restore_snapshot.is_some() {
        return Err(LoadError::Invalid(
            "--restore-snapshot is refused in cluster mode: cluster members start empty and \
             take every write from the Raft log (restore a single ephd instead)"
                .to_string(),
        ));
    }
    if cluster.is_none() {
        config.advertise_peer_urls = etcd::single_member_peer_urls(&matches);
    }
    config.cluster = cluster;
    notices.extend(warnings.into_iter().map(Notice::Warn));
    Ok(Loaded { config, notices })
}

/// ephd's flags plus etcd's compat flags. Like Go's flag package, a flag
/// given twice takes its last value.
fn command() -> Command {
    etcd::add_compat_args(Config::command()).args_override_self(true)
}

/// `cmd` without its `EPHD_*` environment variables, for parses that must
/// see only the flags they are handed.
fn bare(cmd: &Command) -> Command {
    cmd.clone().mut_args(|a| a.env(None))
}

fn env_value<'e>(env: &'e [(String, String)], name: &str) -> Option<&'e str> {
    env.iter()
        .find(|(k, v)| k == name && !v.is_empty())
        .map(|(_, v)| v.as_str())
}

/// The first line of a clap error, without its `error: ` prefix.
fn clap_message(e: &clap::Error) -> String {
    let text = e.to_string();
    let line = text.lines().next().unwrap_or_default();
    line.strip_prefix("error: ").unwrap_or(line).to_string()
}

/// Every long name (and alias) of `cmd`'s settable flags.
fn flags_by_name(cmd: &Command) -> HashMap<String, &Arg> {
    let mut map = HashMap::new();
    for arg in cmd.get_arguments() {
        if matches!(arg.get_id().as_str(), "help" | "version") {
            continue;
        }
        for name in arg
            .get_long()
            .into_iter()
            .chain(arg.get_all_aliases().unwrap_or_default())
        {
            map.insert(name.to_string(), arg);
        }
    }
    map
}

/// What a flag's value looks like, for the configuration file.
fn value_kind(arg: &Arg) -> ValueKind {
    let name = arg.get_long().unwrap_or_default();
    if let Some(compat) = etcd::find(name) {
        return match compat.kind {
            Kind::Bool => ValueKind::Bool,
            Kind::Duration => ValueKind::Duration,
            _ => ValueKind::Other,
        };
    }
    if BOOL_FLAGS.contains(&name) {
        ValueKind::Bool
    } else if DURATION_FLAGS.contains(&name) {
        ValueKind::Duration
    } else {
        ValueKind::Other
    }
}

/// Checks one flag on its own, so an error can name where the value came
/// from (`what`) rather than a flag the operator never typed.
fn check_one(bare: &Command, flag: &str, value: &str, what: &str) -> Result<(), LoadError> {
    bare.clone()
        .try_get_matches_from(["ephd".to_string(), format!("--{flag}={value}")])
        .map(drop)
        .map_err(|e| {
            LoadError::Invalid(format!(
                "invalid value {value:?} for {what}: {}",
                clap_message(&e)
            ))
        })
}

/// The configuration in the YAML file at `path`, as matches of `cmd`.
fn from_file(
    cmd: &Command,
    path: &std::path::Path,
    notices: &mut Vec<Notice>,
) -> Result<ArgMatches, LoadError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| LoadError::Invalid(format!("cannot read configuration file {shown}: {e}")))?;
    let bare = bare(cmd);
    let by_name = flags_by_name(&bare);
    let kind = |flag: &str| -> Option<ValueKind> {
        if flag == "config-file" {
            return None;
        }
        by_name.get(flag).map(|arg| value_kind(arg))
    };
    let file = yaml::parse(&shown, &text, &kind).map_err(LoadError::Invalid)?;
    notices.push(Notice::Info(format!(
        "loading server configuration from {shown:?}; other configuration command line flags \
         and environment variables are ignored if provided"
    )));
    notices.extend(file.warnings.into_iter().map(Notice::Warn));
    let mut argv = vec!["ephd".to_string()];
    for (flag, value) in &file.flags {
        check_one(
            &bare,
            flag,
            value,
            &format!("{flag} in configuration file {shown}"),
        )?;
        argv.push(format!("--{flag}={value}"));
    }
    bare.try_get_matches_from(argv).map_err(|e| {
        LoadError::Invalid(format!("configuration file {shown}: {}", clap_message(&e)))
    })
}

/// The `--flag=value` arguments that `env`'s `ETCD_*` variables stand for.
fn env_flags(
    cmd: &Command,
    cli: &ArgMatches,
    env: &[(String, String)],
    notices: &mut Vec<Notice>,
) -> Result<Vec<OsString>, LoadError> {
    let bare = bare(cmd);
    let mut by_env: HashMap<String, &Arg> = HashMap::new();
    for (name, arg) in flags_by_name(cmd) {
        by_env.insert(
            format!("ETCD_{}", name.to_uppercase().replace('-', "_")),
            arg,
        );
    }
    let mut vars: Vec<&(String, String)> = env
        .iter()
        .filter(|(k, v)| k.starts_with("ETCD_") && !v.is_empty())
        .collect();
    vars.sort();
    let mut extra = Vec::new();
    for (key, value) in vars {
        let Some(arg) = by_env.get(key.as_str()) else {
            notices.push(Notice::Warn(format!(
                "unrecognized environment variable {key}={value}"
            )));
            continue;
        };
        let flag = arg.get_long().unwrap_or_default();
        match cli.value_source(arg.get_id().as_str()) {
            Some(ValueSource::CommandLine) => {
                return Err(LoadError::Invalid(format!(
                    "conflicting environment variable {key:?} is shadowed by corresponding \
                     command-line flag --{flag} (either unset environment variable or disable flag)"
                )))
            }
            Some(ValueSource::EnvVariable) => {
                let ephd = arg
                    .get_env()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default()
                    .to_string();
                let ephd_value = env_value(env, &ephd);
                if ephd_value != Some(value.as_str()) {
                    return Err(LoadError::Invalid(format!(
                        "conflicting environment variables {key}={value} and {ephd}={}: both set --{flag}; unset one",
                        ephd_value.unwrap_or_default()
                    )));
                }
            }
            _ => {}
        }
        check_one(&bare, flag, value, key)?;
        notices.push(Notice::Info(format!(
            "recognized and used environment variable {key}={value}"
        )));
        extra.push(OsString::from(format!("--{flag}={value}")));
    }
    Ok(extra)
}

#[cfg(test)]
#[path = "load_tests.rs"]
mod tests;
