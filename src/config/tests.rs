//! Unit tests of the flags (`src/config.rs`).

use super::*;

#[test]
fn etcd_compat_gives_etcds_behaviour_unless_a_flag_says_otherwise() {
    let kube = Config::defaults();
    assert!(kube.revision_continuity);
    assert_eq!(kube.lease_adopt_unknown_ttl, 3660);
    assert_eq!(kube.compaction_safety_net, Duration::from_secs(3600));

    let exact = Config::etcd_compat();
    assert!(exact.etcd_compat);
    assert!(!exact.revision_continuity);
    assert_eq!(exact.lease_adopt_unknown_ttl, 0);
    assert!(exact.compaction_safety_net.is_zero());

    let mut mixed =
        Config::parse_from(["ephd", "--etcd-compat", "--lease-adopt-unknown-ttl", "60"]);
    let kept = mixed.apply_etcd_compat(|id| id == "lease_adopt_unknown_ttl");
    assert_eq!(kept, vec!["--lease-adopt-unknown-ttl"]);
    assert_eq!(mixed.lease_adopt_unknown_ttl, 60);
    assert!(!mixed.revision_continuity);

    let mut off = Config::defaults();
    assert!(off.apply_etcd_compat(|_| false).is_empty());
    assert!(off.revision_continuity, "nothing changes without the flag");
}

#[test]
fn durations_follow_go_syntax() {
    assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
    assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
    assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
    assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
    assert!(parse_duration("10").is_err());
    assert!(parse_duration("5x").is_err());
}

#[test]
fn auto_compaction_follows_etcd_conventions() {
    let parse = |mode: &str, r: &str| {
        Config::parse_from([
            "ephd",
            "--auto-compaction-mode",
            mode,
            "--auto-compaction-retention",
            r,
        ])
        .auto_compaction()
    };
    assert_eq!(
        Config::defaults().auto_compaction(),
        Ok(AutoCompaction::Off)
    );
    assert_eq!(
        parse("periodic", "1"),
        Ok(AutoCompaction::Periodic(Duration::from_secs(3600)))
    );
    assert_eq!(
        parse("periodic", "30m"),
        Ok(AutoCompaction::Periodic(Duration::from_secs(1800)))
    );
    assert_eq!(
        parse("revision", "1000"),
        Ok(AutoCompaction::Revisions(1000))
    );
    assert!(parse("revision", "1h").is_err());
}

#[test]
fn the_compaction_safety_net_is_on_by_default_and_0_turns_it_off() {
    assert_eq!(
        Config::defaults().compaction_safety_net,
        Duration::from_secs(3600)
    );
    let net = |v: &str| Config::parse_from(["ephd", "--compaction-safety-net", v]);
    assert_eq!(net("0").compaction_safety_net, Duration::ZERO);
    assert_eq!(net("90m").compaction_safety_net, Duration::from_secs(5400));
    assert!(Config::try_parse_from(["ephd", "--compaction-safety-net", "1"]).is_err());
}

#[test]
fn durations_print_as_go_prints_them_and_parse_back() {
    for (d, text) in [
        (Duration::ZERO, "0s"),
        (Duration::from_nanos(1500), "1.5µs"),
        (Duration::from_millis(250), "250ms"),
        (Duration::from_micros(1_500), "1.5ms"),
        (Duration::from_secs(20), "20s"),
        (Duration::from_millis(1_500), "1.5s"),
        (Duration::from_secs(600), "10m0s"),
        (Duration::from_secs(7200), "2h0m0s"),
        (Duration::from_secs(3723), "1h2m3s"),
    ] {
        assert_eq!(go_duration(d), text);
        assert_eq!(parse_duration(text), Ok(d), "{text}");
    }
}

/// The startup line shows every setting: each flag of [`Config`] is a
/// key of [`Config::effective`], under its own name.
#[test]
fn the_effective_configuration_has_every_flag() {
    use clap::CommandFactory;
    let c = Config::parse_from(["ephd", "--key-file", "/etc/ephd/server.key"]);
    let v = c.effective();
    let object = v.as_object().expect("an object");
    let mut flags = 0;
    for arg in Config::command().get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if long == "help" || long == "version" {
            continue;
        }
        flags += 1;
        assert!(object.contains_key(long), "--{long} missing from {v}");
    }
    assert_eq!(object.len(), flags, "{v}");
    assert_eq!(v["key-file"], "/etc/ephd/server.key");
    assert_eq!(v["experimental-watch-progress-notify-interval"], "10m0s");
    assert_eq!(v["listen-client-urls"][0], "http://127.0.0.1:2379");
    assert_eq!(v["logger"], "zap");
    assert_eq!(v["quota-backend-bytes"], 0);
    assert_eq!(v["client-cert-auth"], false);
    assert!(v["data-dir"].is_null());
}

#[test]
fn defaults_listen_on_loopback_2379() {
    let c = Config::defaults();
    assert_eq!(c.listen_client_urls, vec!["http://127.0.0.1:2379"]);
    assert_eq!(
        listen_addr(&c.listen_client_urls[0]).unwrap(),
        ("127.0.0.1:2379".parse().unwrap(), false)
    );
    assert!(listen_addr("https://127.0.0.1:1").unwrap().1);
    assert!(listen_addr("unix:///x").is_err());
    assert_eq!(c.max_request_bytes, 1_572_864);
    assert_eq!(c.max_txn_ops, 128);
}

#[test]
fn max_request_bytes_goes_up_to_one_gib_and_no_further() {
    let c = Config::try_parse_from(["ephd", "--max-request-bytes", "1073741824"]).unwrap();
    assert_eq!(c.max_request_bytes, 1 << 30);
    let e = Config::try_parse_from(["ephd", "--max-request-bytes", "1073741825"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("1 GiB") && e.contains("4 GiB"), "{e}");
    assert!(Config::try_parse_from(["ephd", "--max-request-bytes", "lots"]).is_err());
}

#[test]
fn help_starts_with_what_ephd_is() {
    use clap::CommandFactory;
    for help in [
        Config::command().render_help().to_string(),
        Config::command().render_long_help().to_string(),
    ] {
        assert!(
            help.starts_with("In-memory, etcd-v3-compatible store"),
            "help opens with: {}",
            help.lines().next().unwrap_or_default()
        );
        assert!(!help.contains("Serialize"), "{help}");
    }
}

#[test]
fn the_write_ahead_log_is_buffered_with_a_data_dir_and_off_without() {
    assert_eq!(Config::defaults().wal_mode(), WalMode::None);
    let with_dir = Config::parse_from(["ephd", "--data-dir", "/tmp/d"]);
    assert_eq!(with_dir.wal_mode(), WalMode::Buffered);
    let synced = Config::parse_from(["ephd", "--data-dir", "/tmp/d", "--wal", "fsync"]);
    assert_eq!(synced.wal_mode(), WalMode::Fsync);
    let no_dir = Config::parse_from(["ephd", "--wal", "fsync"]);
    assert_eq!(no_dir.wal_mode(), WalMode::None, "no directory, no log");
    let err = Config::try_parse_from(["ephd", "--wal", "always"]).unwrap_err();
    assert!(
        err.to_string()
            .contains("invalid value \"always\" for --wal: expected none, buffered or fsync"),
        "{err}"
    );
}

#[test]
fn the_peer_transport_is_framed_unless_grpc_is_asked_for() {
    assert_eq!(Config::defaults().peer_transport, "framed");
    let grpc = Config::parse_from(["ephd", "--peer-transport", "grpc"]);
    assert_eq!(grpc.peer_transport, "grpc");
    // EPHD_PEER_TRANSPORT, read by clap from the process environment, is
    // driven by the integration test `cluster::framed`.
    let e = Config::try_parse_from(["ephd", "--peer-transport", "udp"]).unwrap_err();
    assert!(e.to_string().contains("invalid value 'udp'"), "{e}");
}
