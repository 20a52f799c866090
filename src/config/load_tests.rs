//! Unit tests of the loader (`src/config/load.rs`).

use super::*;
use std::time::Duration;

fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn load(args: &[&str], vars: &[(&str, &str)]) -> Result<Loaded, LoadError> {
    let mut argv = vec!["ephd"];
    argv.extend_from_slice(args);
    load_from(argv, &env(vars))
}

fn invalid(r: Result<Loaded, LoadError>) -> String {
    match r {
        Err(LoadError::Invalid(m)) => m,
        Err(LoadError::Clap(e)) => panic!("clap error, not a refusal: {e}"),
        Ok(l) => panic!("loaded: {:?}", l.config),
    }
}

fn warnings(l: &Loaded) -> Vec<&str> {
    l.notices
        .iter()
        .filter_map(|n| match n {
            Notice::Warn(w) => Some(w.as_str()),
            Notice::Info(_) => None,
        })
        .collect()
}

#[test]
fn etcd_env_vars_set_flags() {
    let l = load(
        &[],
        &[
            ("ETCD_NAME", "m1"),
            (
                "ETCD_LISTEN_CLIENT_URLS",
                "http://127.0.0.1:1,http://127.0.0.1:2",
            ),
            ("ETCD_CLIENT_CERT_AUTH", "true"),
            ("ETCD_MAX_REQUEST_BYTES", "1000"),
            ("ETCD_EXPERIMENTAL_WATCH_PROGRESS_NOTIFY_INTERVAL", "5s"),
            ("ETCD_DATA_DIR", ""),
            ("ETCDCTL_API", "3"),
            ("PATH", "/bin"),
        ],
    )
    .unwrap();
    let c = &l.config;
    assert_eq!(c.name, "m1");
    assert_eq!(
        c.listen_client_urls,
        ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    );
    assert!(c.client_cert_auth);
    assert_eq!(c.max_request_bytes, 1000);
    assert_eq!(c.watch_progress_notify_interval, Duration::from_secs(5));
    assert_eq!(c.data_dir, None);
    let go = load(&[], &[("ETCD_CLIENT_CERT_AUTH", "1"), ("ETCD_DEBUG", "T")]).unwrap();
    assert!(go.config.client_cert_auth && go.config.debug);
    assert!(warnings(&l).is_empty(), "{:?}", l.notices);
    assert!(l.notices.contains(&Notice::Info(
        "recognized and used environment variable ETCD_NAME=m1".into()
    )));
}

#[test]
fn a_flag_given_both_ways_is_refused_as_in_etcd() {
    let m = invalid(load(&["--name", "a"], &[("ETCD_NAME", "b")]));
    assert!(
        m.starts_with("conflicting environment variable \"ETCD_NAME\" is shadowed"),
        "{m}"
    );
    // Other flags and variables do not conflict.
    let l = load(&["--name", "a"], &[("ETCD_MAX_TXN_OPS", "7")]).unwrap();
    assert_eq!((l.config.name.as_str(), l.config.max_txn_ops), ("a", 7));
}

#[test]
fn unknown_etcd_vars_warn_and_bad_values_name_the_variable() {
    let l = load(&[], &[("ETCD_NO_SUCH_FLAG", "1")]).unwrap();
    assert_eq!(
        warnings(&l),
        ["unrecognized environment variable ETCD_NO_SUCH_FLAG=1"]
    );
    let m = invalid(load(&[], &[("ETCD_SNAPSHOT_COUNT", "abc")]));
    assert!(
        m.starts_with("invalid value \"abc\" for ETCD_SNAPSHOT_COUNT"),
        "{m}"
    );
    let m = invalid(load(&[], &[("ETCD_MAX_TXN_OPS", "-1")]));
    assert!(m.contains("ETCD_MAX_TXN_OPS"), "{m}");
}

#[test]
fn compat_flags_warn_once_each_or_are_refused() {
    let l = load(
        &[
            "--snapshot-count=10000",
            "--metrics=basic",
            "--enable-pprof",
            "--feature-gates=InitialCorruptCheck=true",
            "--experimental-initial-corrupt-check=true",
        ],
        &[],
    )
    .unwrap();
    let w = warnings(&l);
    assert_eq!(w.len(), 5, "{w:?}");
    assert!(w
        .iter()
        .all(|w| w.contains("accepted for etcd compatibility and ignored: ")));
    assert!(
        w[0].starts_with("flag --snapshot-count is accepted"),
        "{w:?}"
    );
    // Go's boolean syntax: `--flag false` is not a value.
    assert!(load(&["--enable-pprof", "false"], &[]).is_err());
    for refused in [
        "--grpc-keepalive-min-time=10s",
        "--cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        "--auto-tls",
        "--enable-v2=true",
        "--proxy=on",
        "--discovery=https://discovery.etcd.io/x",
    ] {
        let m = invalid(load(&[refused], &[]));
        assert!(m.contains("is refused: "), "{refused}: {m}");
    }
    assert!(load(&["--grpc-keepalive-min-time=5s", "--enable-v2=false"], &[]).is_ok());
    assert!(load(&["--snapshot-count=many"], &[]).is_err());
    assert!(load(&["--logger=glog"], &[]).is_err());
    assert!(load(&["--metrics=all"], &[]).is_err());
}

#[test]
fn other_members_in_the_initial_cluster_mean_cluster_mode() {
    let ok = load(
        &["--name=m1", "--initial-cluster=m1=https://10.0.0.1:2380"],
        &[],
    )
    .unwrap();
    assert_eq!(warnings(&ok).len(), 1);
    assert!(ok.config.cluster.is_none());
    let three = "m1=http://10.0.0.1:2380,m2=http://10.0.0.2:2380,m3=http://10.0.0.3:2380";
    let l = load(
        &[
            "--name=m2",
            &format!("--initial-cluster={three}"),
            "--initial-advertise-peer-urls=http://10.0.0.2:2380",
            "--listen-peer-urls=http://0.0.0.0:2380",
            "--heartbeat-interval=50",
            "--election-timeout=500",
        ],
        &[],
    )
    .unwrap();
    assert!(warnings(&l).is_empty(), "the flags are used, not ignored");
    let c = l.config.cluster.expect("cluster mode");
    assert_eq!(c.members.len(), 3);
    assert_eq!(c.name, "m2");
    assert_eq!(c.listen_peer_urls, ["http://0.0.0.0:2380"]);
    assert_eq!(c.election_ticks(), 10);
    let m = invalid(load(
        &[
            "--name=m1",
            "--initial-cluster=m1=http://10.0.0.1:2380,m2=http://10.0.0.2:2380",
            "--initial-advertise-peer-urls=http://10.0.0.1:2380",
            "--peer-cert-file=/etc/peer.pem",
        ],
        &[],
    ));
    assert!(m.contains("need https:// peer URLs"), "{m}");
    let m = invalid(load(
        &[
            "--name=m1",
            "--initial-cluster=m1=http://10.0.0.1:2380,m2=http://10.0.0.2:2380",
            "--initial-advertise-peer-urls=http://10.0.0.1:2380",
            "--peer-crl-file=/etc/crl.pem",
        ],
        &[],
    ));
    assert!(m.contains("need https:// peer URLs"), "{m}");
    let m = invalid(load(
        &[
            "--name=m1",
            "--initial-cluster=m1=http://10.0.0.1:2380,m2=http://10.0.0.2:2380",
            "--initial-advertise-peer-urls=http://10.0.0.1:2380",
            "--peer-cert-allowed-cn=etcd",
        ],
        &[],
    ));
    assert!(m.contains("need https://"), "{m}");
    // --data-dir is taken in cluster mode (cluster/member/saved_state.rs).
    let l = load(
        &[
            "--name=m1",
            "--initial-cluster=m1=http://10.0.0.1:2380,m2=http://10.0.0.2:2380",
            "--initial-advertise-peer-urls=http://10.0.0.1:2380",
            "--data-dir=/tmp/x",
        ],
        &[],
    )
    .unwrap();
    assert!(l.config.cluster.is_some() && l.config.data_dir.is_some());
}

#[test]
fn the_catchup_entries_flag_takes_etcd_3_6s_name_and_the_older_one() {
    let two = "--initial-cluster=m1=http://10.0.0.1:2380,m2=http://10.0.0.2:2380";
    let base = [
        "--name=m1",
        two,
        "--initial-advertise-peer-urls=http://10.0.0.1:2380",
    ];
    for flag in [
        "--snapshot-catchup-entries=123",
        "--experimental-snapshot-catchup-entries=123",
    ] {
        let args: Vec<&str> = base.iter().copied().chain([flag]).collect();
        let l = load(&args, &[]).unwrap();
        assert!(warnings(&l).is_empty(), "{flag}: used, not ignored");
        assert_eq!(l.config.cluster.unwrap().catchup_entries, 123, "{flag}");
    }
    let args: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--snapshot-catchup-entries=0"])
        .collect();
    let m = invalid(load(&args, &[]));
    assert!(
        m.contains("--snapshot-catchup-entries \"0\" must be a number above 0"),
        "{m}"
    );
}

#[test]
fn a_flag_given_twice_takes_the_last_value_as_in_go() {
    let l = load(&["--name=a", "--name=b"], &[]).unwrap();
    assert_eq!(l.config.name, "b");
}

#[test]
fn implemented_etcd_flags_change_the_config() {
    let l = load(
        &[
            "--max-concurrent-streams=100",
            "--grpc-keepalive-interval=30s",
            "--grpc-keepalive-timeout=0",
            "--log-outputs=stdout,stderr",
            "--debug",
        ],
        &[],
    )
    .unwrap();
    let c = l.config;
    assert_eq!(c.max_concurrent_streams, 100);
    assert_eq!(c.grpc_keepalive_interval, Duration::from_secs(30));
    assert_eq!(c.grpc_keepalive_timeout, Duration::ZERO);
    assert_eq!(c.log_outputs, ["stdout", "stderr"]);
    assert_eq!(c.log_filter(), "debug");
    assert!(c.json_logs(), "zap, etcd 3.5's only logger, is the default");
    let text = load(&["--logger=capnslog"], &[("ETCD_LOG_LEVEL", "warn")]).unwrap();
    assert!(!text.config.json_logs());
    assert_eq!(text.config.log_filter(), "warn");
    assert!(warnings(&text).is_empty(), "--logger is implemented");
    let fatal = load(&["--log-level=fatal"], &[]).unwrap();
    assert_eq!(fatal.config.log_filter(), "error");
    assert!(warnings(&fatal).is_empty());
}

fn write_file(text: &str) -> tempfile::NamedTempFile {
    use std::io::Write;
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

#[test]
fn a_config_file_is_the_whole_configuration() {
    let f = write_file(
        "name: 'yaml'\nlisten-client-urls: http://127.0.0.1:1\nmax-request-bytes: 2048\n\
         quota-backend-bytes: 4096\nsnapshot-count: 10000\n\
         experimental-watch-progress-notify-interval: 5000000000\n\
         client-transport-security:\n  client-cert-auth: true\n  trusted-ca-file: /ca.pem\n\
         self-signed-cert-validity: 1\nlog-outputs: [stderr]\nbogus: 1\n",
    );
    let path = f.path().to_str().unwrap();
    let l = load(
        &["--config-file", path, "--name=flag", "--max-txn-ops=7"],
        &[("ETCD_NAME", "env"), ("ETCD_QUOTA_BACKEND_BYTES", "1")],
    )
    .unwrap();
    let c = &l.config;
    assert_eq!(c.name, "yaml");
    assert_eq!(c.listen_client_urls, ["http://127.0.0.1:1"]);
    assert_eq!(c.max_request_bytes, 2048);
    assert_eq!(c.max_txn_ops, 128, "flags are ignored with a config file");
    assert_eq!(c.quota_backend_bytes, 4096);
    assert!(c.client_cert_auth);
    assert_eq!(c.trusted_ca_file, Some(PathBuf::from("/ca.pem")));
    assert_eq!(c.watch_progress_notify_interval, Duration::from_secs(5));
    assert_eq!(c.config_file.as_deref(), Some(f.path()));
    let w = warnings(&l);
    assert_eq!(w.len(), 3, "{w:?}");
    assert!(w[0].contains("\"bogus\""), "{w:?}");
    assert!(w[1].starts_with("flag --snapshot-count"), "{w:?}");
    assert!(
        w[2].starts_with("flag --self-signed-cert-validity"),
        "{w:?}"
    );
    assert!(matches!(&l.notices[0], Notice::Info(m) if m.contains("are ignored")));

    // ETCD_CONFIG_FILE names the file too.
    let l = load(&[], &[("ETCD_CONFIG_FILE", path)]).unwrap();
    assert_eq!(l.config.name, "yaml");
}

#[test]
fn config_file_errors_name_the_file_and_key() {
    let f = write_file("max-request-bytes: lots\n");
    let path = f.path().to_str().unwrap();
    let m = invalid(load(&["--config-file", path], &[]));
    assert!(m.contains("max-request-bytes in configuration file"), "{m}");
    let f = write_file("initial-cluster: a=http://a:2380,b=http://b:2380\nname: a\n");
    let m = invalid(load(&["--config-file", f.path().to_str().unwrap()], &[]));
    // Cluster mode, checked as etcd does: this member's peer URLs
    // there are not its advertised ones (etcd's default).
    assert!(m.contains("--initial-advertise-peer-urls"), "{m}");
    let m = invalid(load(&["--config-file", "/nonexistent/etcd.yml"], &[]));
    assert!(m.starts_with("cannot read configuration file"), "{m}");
}

/// `--client-crl-file` and `--peer-crl-file` (etcd's names) are settings:
/// from a flag, an `ETCD_*` variable or the configuration file's
/// `crl-file` keys of the two TLS sections.
#[test]
fn crl_files_come_from_flags_env_and_the_config_file() {
    let l = load(&["--client-crl-file=/crl.pem"], &[]).unwrap();
    assert_eq!(l.config.client_crl_file, Some(PathBuf::from("/crl.pem")));
    assert!(warnings(&l).is_empty(), "{:?}", warnings(&l));
    let l = load(&[], &[("ETCD_CLIENT_CRL_FILE", "/env.pem")]).unwrap();
    assert_eq!(l.config.client_crl_file, Some(PathBuf::from("/env.pem")));

    let cluster = [
        "--name=m1",
        "--initial-cluster=m1=https://10.0.0.1:2380,m2=https://10.0.0.2:2380",
        "--initial-advertise-peer-urls=https://10.0.0.1:2380",
        "--listen-peer-urls=https://10.0.0.1:2380",
        "--peer-cert-file=/p.crt",
        "--peer-key-file=/p.key",
        "--peer-trusted-ca-file=/ca.crt",
    ];
    let peer_crl = |l: Loaded| l.config.cluster.unwrap().peer_tls.unwrap().crl;
    assert_eq!(peer_crl(load(&cluster, &[]).unwrap()), None);
    let mut args = cluster.to_vec();
    args.push("--peer-crl-file=/peer-crl.pem");
    let l = load(&args, &[]).unwrap();
    assert!(warnings(&l).is_empty(), "{:?}", warnings(&l));
    assert_eq!(peer_crl(l), Some(PathBuf::from("/peer-crl.pem")));
    let l = load(&cluster, &[("ETCD_PEER_CRL_FILE", "/env-peer.pem")]).unwrap();
    assert_eq!(peer_crl(l), Some(PathBuf::from("/env-peer.pem")));
    // A single member has no peer listener: ignored with a warning.
    let l = load(&["--peer-crl-file=/peer-crl.pem"], &[]).unwrap();
    assert!(warnings(&l)[0].starts_with("flag --peer-crl-file is accepted"));

    let f = write_file(
        "name: m1\ninitial-cluster: m1=https://10.0.0.1:2380,m2=https://10.0.0.2:2380\n\
         initial-advertise-peer-urls: https://10.0.0.1:2380\n\
         listen-peer-urls: https://10.0.0.1:2380\n\
         client-transport-security:\n  trusted-ca-file: /ca.pem\n  crl-file: /yaml.pem\n\
         peer-transport-security:\n  cert-file: /p.crt\n  key-file: /p.key\n\
         \x20 trusted-ca-file: /ca.crt\n  crl-file: /yaml-peer.pem\n",
    );
    let l = load(&["--config-file", f.path().to_str().unwrap()], &[]).unwrap();
    assert_eq!(l.config.client_crl_file, Some(PathBuf::from("/yaml.pem")));
    assert_eq!(peer_crl(l), Some(PathBuf::from("/yaml-peer.pem")));
}

#[test]
fn help_says_what_ephd_is_and_lists_the_cluster_flags_under_their_heading() {
    let help = command().render_long_help().to_string();
    assert!(
        help.starts_with("In-memory, etcd-v3-compatible store"),
        "{}",
        help.lines().next().unwrap_or_default()
    );
    let heading = help
        .find(super::etcd::CLUSTER_HEADING)
        .expect("the cluster heading");
    let cluster_part = &help[heading..];
    for flag in [
        "--initial-cluster ",
        "--listen-peer-urls",
        "--initial-advertise-peer-urls",
        "--initial-cluster-state",
        "--election-timeout",
        "--peer-trusted-ca-file",
        "--force-new-cluster",
    ] {
        assert!(
            cluster_part.contains(flag),
            "{flag} under the cluster heading"
        );
    }
    // etcd flags that do nothing here stay out of the help.
    assert!(!help.contains("--discovery-srv"));
    assert!(!help.contains("--experimental-corrupt-check-time"));
}

#[test]
fn single_dash_long_flags_are_read_as_go_reads_them() {
    let l = load(
        &[
            "-name",
            "m1",
            "-data-dir=/var/lib/etcd",
            "-client-cert-auth",
            "-listen-client-urls",
            "http://127.0.0.1:2379",
            "-advertise-client-urls=http://127.0.0.1:2379",
            "-snapshot-count",
            "10000",
        ],
        &[],
    )
    .unwrap();
    assert_eq!(l.config.name, "m1");
    assert_eq!(
        l.config.data_dir.as_deref(),
        Some(std::path::Path::new("/var/lib/etcd"))
    );
    assert!(l.config.client_cert_auth);
    // An etcd flag ephd ignores is recognised in its Go form too.
    assert!(warnings(&l).iter().any(|w| w.contains("snapshot-count")));
}

#[test]
fn a_value_that_starts_with_a_dash_stays_a_value() {
    let l = load(&["-name", "-data-dir"], &[]).unwrap();
    assert_eq!(l.config.name, "-data-dir");
    assert_eq!(l.config.data_dir, None);
}

#[test]
fn a_single_dash_word_that_is_no_flag_is_refused() {
    let e = load(&["-no-such-flag"], &[]).unwrap_err();
    assert!(matches!(e, LoadError::Clap(_)), "{e}");
    assert!(e.to_string().contains("-no-such-flag"), "{e}");
}
