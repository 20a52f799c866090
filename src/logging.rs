//! Log output as etcd's operators expect it.
//!
//! * `--logger=zap` (the default): one JSON object per line, with the field
//!   names etcd's zap configuration writes: `level` (lower case), `ts`
//!   (UTC, microseconds: `2026-12-01T02:05:58.123456Z`, etcd 3.5's format),
//!   `logger` (the tracing target, zap's name for a named logger), `caller`
//!   (`dir/file.rs:line`, as zap's short caller), `msg`, then the event's
//!   own fields with their JSON types. [`EtcdJson`] writes it.
//! * `--logger=capnslog`: tracing-subscriber's text lines, as ephd always
//!   wrote, with ANSI colours only when every output is a terminal.
//! * `--log-outputs`: [`LogOutputs`], every line to every output.
//!
//! The server's own code logs through `tracing` and never sees the format.

use crate::config::Config;
use parking_lot::Mutex;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Fields whose value is JSON text (the startup line's `config`): written
/// as JSON values, not as strings, so a log pipeline can query into them.
/// A value that does not parse stays a string.
const JSON_VALUED: &[&str] = &["config"];

/// Sets up the global subscriber for `config`'s `--logger` and
/// `--log-level`, writing to `outputs`. Call once, before anything logs.
pub fn init(config: &Config, outputs: LogOutputs) {
    let filter = tracing_subscriber::EnvFilter::try_new(config.log_filter())
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let colour = outputs.all_terminals() && no_color_unset();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(outputs);
    if config.json_logs() {
        builder.event_format(EtcdJson).init();
    } else {
        builder.with_ansi(colour).init();
    }
}

/// Whether the `NO_COLOR` convention (<https://no-color.org>) leaves
/// colours allowed.
fn no_color_unset() -> bool {
    std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// zap's JSON lines as etcd configures zap (see the module docs). Values
/// are escaped by serde_json, so every event is one line that parses as
/// one object, whatever its message holds (newlines included).
#[derive(Debug, Clone, Copy, Default)]
pub struct EtcdJson;

impl<S, N> FormatEvent<S, N> for EtcdJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut ts = String::with_capacity(32);
        SystemTime.format_time(&mut Writer::new(&mut ts))?;
        let mut fields = Fields::default();
        event.record(&mut fields);
        let meta = event.metadata();
        let file = fields.log_file.as_deref().or(meta.file());
        let line = fields.log_line.or(meta.line().map(u64::from));
        let target = fields.log_target.as_deref().unwrap_or(meta.target());
        let mut out = Line::default();
        out.put("level", level(*meta.level()).into());
        out.put("ts", ts.into());
        out.put("logger", target.into());
        if let Some(file) = file {
            let caller = match line {
                Some(line) => format!("{}:{line}", short_caller(file)),
                None => short_caller(file).to_string(),
            };
            out.put("caller", caller.into());
        }
        out.put("msg", std::mem::take(&mut fields.msg).into());
        for (name, value) in fields.fields {
            out.put(name, value);
        }
        writer.write_str(&out.finish())
    }
}

/// zap's lower-case level names; tracing's TRACE, which zap lacks, keeps
/// its own name.
fn level(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error",
        Level::WARN => "warn",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}

/// The last directory and the file name, as zap's short caller shows a
/// Go package and file: `server/mod.rs` for `src/server/mod.rs`.
fn short_caller(file: &str) -> &str {
    let mut slashes = file.rmatch_indices(['/', '\\']);
    match (slashes.next(), slashes.next()) {
        (Some(_), Some((i, _))) => &file[i + 1..],
        _ => file,
    }
}

/// One JSON object being written, keys in the order given (zap's order:
/// level, ts, logger, caller, msg, fields).
#[derive(Default)]
struct Line(String);

impl Line {
    fn put(&mut self, key: &str, value: serde_json::Value) {
        self.0.push(if self.0.is_empty() { '{' } else { ',' });
        // Strings and values serde_json made itself always serialize.
        let _ = write!(self.0, "{}:{}", serde_json::Value::from(key), value);
    }

    fn finish(mut self) -> String {
        if self.0.is_empty() {
            self.0.push('{');
        }
        self.0.push_str("}\n");
        self.0
    }
}

/// An event's message and fields as JSON values.
#[derive(Default)]
struct Fields {
    msg: String,
    fields: Vec<(&'static str, serde_json::Value)>,
    /// Where an event forwarded from the `log` crate came from (tracing-log
    /// puts it in `log.*` fields, not in the metadata).
    log_file: Option<String>,
    log_line: Option<u64>,
    log_target: Option<String>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: serde_json::Value) {
        match field.name() {
            "message" => {
                self.msg = match value {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                }
            }
            "log.file" => self.log_file = value.as_str().map(str::to_string),
            "log.line" => self.log_line = value.as_u64(),
            "log.target" => self.log_target = value.as_str().map(str::to_string),
            name if name.starts_with("log.") => {}
            name => self.fields.push((name, value)),
        }
    }

    fn put_text(&mut self, field: &Field, text: String) {
        if JSON_VALUED.contains(&field.name()) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                return self.put(field, v);
            }
        }
        self.put(field, text.into());
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put_text(field, format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put_text(field, value.to_string());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, value.to_string().into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // NaN and infinities are no JSON numbers: null, as serde_json has it.
        self.put(field, value.into());
    }
}

/// Where log lines go (`--log-outputs`): each formatted event is written
/// whole to every output, so lines from concurrent threads never interleave
/// within one output.
#[derive(Clone)]
pub struct LogOutputs(Arc<Vec<LogOutput>>);

/// One `--log-outputs` target.
enum LogOutput {
    Stdout,
    Stderr,
    /// A file opened for appending, as etcd's zap logger does.
    File(Mutex<File>),
}

impl LogOutputs {
    /// Opens etcd's `--log-outputs` list: `default` and `stderr` (ephd has
    /// no journald output, so `default` is stderr), `stdout`, or file paths.
    pub fn open(names: &[String]) -> Result<LogOutputs, String> {
        let mut outputs = Vec::new();
        for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
            outputs.push(match name {
                "default" | "stderr" => LogOutput::Stderr,
                "stdout" => LogOutput::Stdout,
                path => LogOutput::File(Mutex::new(
                    File::options()
                        .create(true)
                        .append(true)
                        .open(path)
                        .map_err(|e| format!("cannot open --log-outputs file {path}: {e}"))?,
                )),
            });
        }
        if outputs.is_empty() {
            outputs.push(LogOutput::Stderr);
        }
        Ok(LogOutputs(Arc::new(outputs)))
    }

    /// Whether every output is a terminal: only then may text lines carry
    /// ANSI colours, which in a file, a pipe or a log collector are only
    /// escape codes.
    pub fn all_terminals(&self) -> bool {
        self.0.iter().all(|o| match o {
            LogOutput::Stdout => std::io::stdout().is_terminal(),
            LogOutput::Stderr => std::io::stderr().is_terminal(),
            LogOutput::File(_) => false,
        })
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogOutputs {
    type Writer = LogWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        LogWriter(&self.0)
    }
}

/// Writes one log event to every output; an output that fails (a full
/// disk, a closed pipe) does not keep the others from getting it.
pub struct LogWriter<'a>(&'a [LogOutput]);

impl Write for LogWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for output in self.0 {
            let _ = match output {
                LogOutput::Stdout => std::io::stdout().write_all(buf),
                LogOutput::Stderr => std::io::stderr().write_all(buf),
                LogOutput::File(f) => f.lock().write_all(buf),
            };
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        for output in self.0 {
            let _ = match output {
                LogOutput::Stdout => std::io::stdout().flush(),
                LogOutput::Stderr => std::io::stderr().flush(),
                LogOutput::File(f) => f.lock().flush(),
            };
        }
        Ok(())
    }
}

/// Log capture for unit tests: a subscriber for the current thread whose
/// lines land in a buffer.
#[cfg(test)]
pub(crate) mod capture {
    use std::sync::{Arc, Mutex};

    /// The lines logged so far.
    #[derive(Clone, Default)]
    pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Captured {
        /// Everything written, as text.
        pub(crate) fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).expect("UTF-8 logs")
        }
    }

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Captures this thread's events in zap's JSON lines (or text lines
    /// without colours) until the guard is dropped.
    pub(crate) fn capture(json: bool) -> (Captured, tracing::subscriber::DefaultGuard) {
        let captured = Captured::default();
        let writer = captured.clone();
        let builder = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || writer.clone());
        let guard = if json {
            tracing::subscriber::set_default(builder.event_format(super::EtcdJson).finish())
        } else {
            tracing::subscriber::set_default(builder.with_ansi(false).finish())
        };
        (captured, guard)
    }
}

#[cfg(test)]
mod tests {
    use super::capture::capture;
    use super::*;

    fn objects(text: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
        assert!(text.ends_with('\n'), "{text:?}");
        text.lines()
            .map(|l| match serde_json::from_str(l) {
                Ok(serde_json::Value::Object(o)) => o,
                other => panic!("not one JSON object per line: {l:?}: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn zap_lines_have_etcds_field_names_in_zaps_order() {
        let (logs, _guard) = capture(true);
        let remote: std::net::SocketAddr = "10.0.0.7:51234".parse().unwrap();
        tracing::warn!(
            method = "/etcdserverpb.KV/Range",
            code = "ResourceExhausted",
            remote = %remote,
            took = ?std::time::Duration::from_millis(3),
            suppressed = 4u64,
            "expected-duration" = "100ms",
            negative = -3i64,
            fine = true,
            ratio = 0.5,
            "request shed"
        );
        let text = logs.text();
        let lines = objects(&text);
        assert_eq!(lines.len(), 1, "{text}");
        let o = &lines[0];
        // zap's order in the line itself.
        let order: Vec<usize> = [
            "\"level\"",
            "\"ts\"",
            "\"logger\"",
            "\"caller\"",
            "\"msg\"",
            "\"method\"",
        ]
        .iter()
        .map(|k| text.find(k).unwrap_or_else(|| panic!("{k} in {text}")))
        .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
        assert_eq!(o["level"], "warn");
        assert_eq!(o["msg"], "request shed");
        assert_eq!(o["logger"], "ephd::logging::tests");
        let caller = o["caller"].as_str().unwrap();
        assert!(caller.starts_with("src/logging.rs:"), "{caller}");
        assert!(
            caller["src/logging.rs:".len()..].parse::<u32>().is_ok(),
            "{caller}"
        );
        assert_eq!(o["method"], "/etcdserverpb.KV/Range");
        assert_eq!(o["remote"], "10.0.0.7:51234");
        assert_eq!(o["took"], "3ms");
        assert_eq!(o["suppressed"], 4);
        assert_eq!(o["expected-duration"], "100ms");
        assert_eq!(o["negative"], -3);
        assert_eq!(o["fine"], true);
        assert_eq!(o["ratio"], 0.5);
        // etcd 3.5's timestamp: UTC with microseconds.
        let ts = o["ts"].as_str().unwrap();
        let b = ts.as_bytes();
        assert_eq!(ts.len(), "2026-12-01T02:05:58.123456Z".len(), "{ts}");
        assert!(
            [4, 7].iter().all(|&i| b[i] == b'-')
                && b[10] == b'T'
                && [13, 16].iter().all(|&i| b[i] == b':')
                && b[19] == b'.'
                && b[26] == b'Z',
            "{ts}"
        );
        assert!(!text.contains('\x1b'));
    }

    #[test]
    fn every_event_is_one_line_whatever_its_text_holds() {
        let (logs, _guard) = capture(true);
        tracing::info!(
            detail = "a\nb \"quoted\" \u{1b}[31m",
            "two\nlines and a \"quote\""
        );
        tracing::error!("{}", "plain");
        tracing::debug!(
            config = r#"{"name":"m1","listen-client-urls":["http://127.0.0.1:2379"]}"#,
            "starting"
        );
        tracing::debug!(config = "not json {", "kept as text");
        let text = logs.text();
        let lines = objects(&text);
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(lines[0]["msg"], "two\nlines and a \"quote\"");
        assert_eq!(lines[0]["detail"], "a\nb \"quoted\" \u{1b}[31m");
        assert!(!text.contains('\x1b'), "escaped as \\u001b: {text}");
        assert_eq!(lines[1]["level"], "error");
        assert_eq!(lines[1]["msg"], "plain");
        // The startup line's configuration is an object, not a string.
        assert_eq!(lines[2]["config"]["name"], "m1");
        assert_eq!(
            lines[2]["config"]["listen-client-urls"][0],
            "http://127.0.0.1:2379"
        );
        assert_eq!(lines[3]["config"], "not json {");
    }

    #[test]
    fn text_lines_for_capnslog_carry_no_colour_codes() {
        let (logs, _guard) = capture(false);
        tracing::warn!(suppressed = 2u64, "request rejected");
        let text = logs.text();
        assert!(
            text.contains(" WARN ") && text.contains("request rejected suppressed=2"),
            "{text}"
        );
        assert!(!text.contains('\x1b'), "{text:?}");
    }

    #[test]
    fn callers_are_short_as_zaps() {
        assert_eq!(short_caller("src/server/mod.rs"), "server/mod.rs");
        assert_eq!(short_caller("src/main.rs"), "src/main.rs");
        assert_eq!(short_caller("main.rs"), "main.rs");
        assert_eq!(
            short_caller("/root/.cargo/registry/src/x/h2-0.4.12/src/proto/streams/recv.rs"),
            "streams/recv.rs"
        );
    }

    #[test]
    fn files_and_pipes_are_no_terminals() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ephd.log").display().to_string();
        let outputs = LogOutputs::open(std::slice::from_ref(&path)).unwrap();
        assert!(!outputs.all_terminals());
        // Under `cargo test` stderr is a pipe or a file, never a terminal
        // in CI; when it is one, colours are fine.
        let stderr = LogOutputs::open(&["stderr".to_string()]).unwrap();
        assert_eq!(stderr.all_terminals(), std::io::stderr().is_terminal());
        let mixed = LogOutputs::open(&["stderr".to_string(), path]).unwrap();
        assert!(
            !mixed.all_terminals(),
            "a file among the outputs: no colours"
        );
        assert!(LogOutputs::open(&["/nonexistent/dir/ephd.log".to_string()]).is_err());
    }
}
