//! Who can reach the client listeners, checked before anything is bound.
//!
//! ephd has no users or roles: whoever can open a connection to a client
//! URL can read and write every key. On loopback that is only this machine,
//! which is why `cargo run` may serve plaintext there. On any other address
//! (a container's `0.0.0.0` above all) plaintext means anyone on the network,
//! so ephd refuses it unless the operator opts in with
//! `--allow-insecure-plaintext`, and then says so with a WARN at every start.
//! The message of the refusal names the flags (and `EPHD_*` variables) of
//! both ways out, so the secure one is as easy to take as the other.

use super::{listen_addr, Config};
use std::net::IpAddr;

/// What to do about the client listeners' exposure: `Ok` with the warnings
/// to log at startup, or `Err` with why ephd must not start.
///
/// Refused: a plaintext (`http://`) client URL on a non-loopback address
/// without `--allow-insecure-plaintext`, and an `https://` one whose
/// certificate or key file is not there (checked here, before any listener
/// is bound, so the error can say what to mount or set instead of only
/// "cannot read"). Warned: opted-in plaintext on a non-loopback address,
/// and TLS there without `--trusted-ca-file` (encrypted, yet every client
/// that can connect is served; with a CA, clients must present a
/// certificate it signed, as in etcd, whatever `--client-cert-auth`
/// says). The HTTP listener (`--listen-metrics-urls`) is not judged: it
/// serves health and metrics, never keys.
pub fn check_client_exposure(config: &Config) -> Result<Vec<String>, String> {
    let mut warnings = Vec::new();
    let mut tls_urls = Vec::new();
    for url in config
        .listen_client_urls
        .iter()
        .map(|u| u.trim())
        .filter(|u| !u.is_empty())
    {
        let (addr, tls) = listen_addr(url)?;
        let loopback = is_loopback(addr.ip());
        if tls {
            tls_urls.push(url);
            if !loopback && config.trusted_ca_file.is_none() {
                warnings.push(format!(
                    "serving {url} over TLS without client certificate authentication: \
                     every client that can reach it can read and write every key; set \
                     --trusted-ca-file (EPHD_TRUSTED_CA_FILE) so that clients must present \
                     a certificate it signed"
                ));
            }
        } else if !loopback {
            if !config.allow_insecure_plaintext {
                return Err(refusal(url, addr.port()));
            }
            warnings.push(format!(
                "INSECURE: serving unauthenticated plaintext gRPC on {url} \
                 (--allow-insecure-plaintext): anyone who can reach it can read and write \
                 every key and see all traffic; serve https:// with --cert-file, --key-file, \
                 --trusted-ca-file and --client-cert-auth=true instead"
            ));
        }
    }
    if let Some(url) = tls_urls.first() {
        for (flag, env, path) in [
            ("--cert-file", "EPHD_CERT_FILE", &config.cert_file),
            ("--key-file", "EPHD_KEY_FILE", &config.key_file),
        ] {
            let problem = match path {
                None => "is not set".to_string(),
                Some(p) if !p.is_file() => {
                    format!("{} does not exist or is not a file", p.display())
                }
                Some(_) => continue,
            };
            return Err(format!(
                "{flag} ({env}) {problem}, and {url} needs it: mount the server certificate \
                 and key there (the container image reads /etc/ephd/tls/tls.crt, tls.key and \
                 the client CA ca.crt) or point {flag} at them; to serve plaintext instead, \
                 listen on http://127.0.0.1, or on another address with \
                 --allow-insecure-plaintext (EPHD_ALLOW_INSECURE_PLAINTEXT=true)"
            ));
        }
    }
    check_peer_exposure(config, &mut warnings)?;
    Ok(warnings)
}

/// The same rules for cluster mode's peer listeners: whoever can send Raft
/// messages to a member can rewrite the whole store, so plaintext on a
/// non-loopback peer URL needs `--allow-insecure-plaintext` too (and gets a
/// WARN). Peer TLS needs no warning: https:// peer URLs always come with
/// `--peer-trusted-ca-file`, so connecting members must present a
/// certificate it signed, with or without `--peer-client-cert-auth`.
fn check_peer_exposure(config: &Config, warnings: &mut Vec<String>) -> Result<(), String> {
    let Some(cluster) = &config.cluster else {
        return Ok(());
    };
    for url in &cluster.listen_peer_urls {
        let (addr, _) = listen_addr(url)?;
        if is_loopback(addr.ip()) {
            continue;
        }
        match &cluster.peer_tls {
            Some(_) => {}
            None if config.allow_insecure_plaintext => warnings.push(format!(
                "INSECURE: serving raft peers in plaintext on {url} \
                 (--allow-insecure-plaintext): anyone who can reach it can rewrite the \
                 store; use https:// peer URLs with --peer-cert-file, --peer-key-file, \
                 --peer-trusted-ca-file and --peer-client-cert-auth=true"
            )),
            None => {
                return Err(format!(
                    "refusing to serve raft peers in plaintext on {url}: it is not a \
                     loopback address, and anyone who can reach it could rewrite the store. \
                     Use https:// peer URLs (--listen-peer-urls, \
                     --initial-advertise-peer-urls, --initial-cluster) with \
                     --peer-cert-file, --peer-key-file, --peer-trusted-ca-file and \
                     --peer-client-cert-auth=true, or add --allow-insecure-plaintext \
                     (a private test network)"
                ))
            }
        }
    }
    Ok(())
}

/// The refusal for plaintext on `url`: both ways out, as flags and as the
/// environment variables a container is configured with.
fn refusal(url: &str, port: u16) -> String {
    format!(
        "refusing to serve unauthenticated plaintext gRPC on {url}: it is not a loopback \
         address, and anyone who can reach it could read and write every key. Serve TLS with \
         client certificates instead: --listen-client-urls=https://0.0.0.0:{port} \
         --cert-file=FILE --key-file=FILE --trusted-ca-file=FILE --client-cert-auth=true \
         (EPHD_LISTEN_CLIENT_URLS, EPHD_CERT_FILE, EPHD_KEY_FILE, EPHD_TRUSTED_CA_FILE, \
         EPHD_CLIENT_CERT_AUTH=true), or listen on http://127.0.0.1:{port}. To serve \
         plaintext on it anyway (a private test network), add --allow-insecure-plaintext \
         (EPHD_ALLOW_INSECURE_PLAINTEXT=true)"
    )
}

/// Loopback, including IPv4-mapped `::ffff:127.x.y.z`, which
/// `Ipv6Addr::is_loopback` does not count.
fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn config(args: &[&str]) -> Config {
        Config::parse_from(std::iter::once("ephd").chain(args.iter().copied()))
    }

    #[test]
    fn plaintext_peers_off_loopback_need_the_opt_in() {
        let cluster = |extra: &[&str]| {
            let mut args = vec![
                "ephd",
                "--name=a",
                "--initial-cluster=a=http://10.0.0.1:2380,b=http://10.0.0.2:2380",
                "--initial-advertise-peer-urls=http://10.0.0.1:2380",
                "--listen-peer-urls=http://10.0.0.1:2380",
            ];
            args.extend_from_slice(extra);
            match crate::config::load::load_from(args, &[]) {
                Ok(loaded) => loaded.config,
                Err(_) => panic!("valid flags"),
            }
        };
        let err = check_client_exposure(&cluster(&[])).unwrap_err();
        assert!(
            err.starts_with("refusing to serve raft peers in plaintext on http://10.0.0.1:2380")
        );
        let warnings = check_client_exposure(&cluster(&["--allow-insecure-plaintext"])).unwrap();
        assert!(
            warnings[0].starts_with("INSECURE: serving raft peers"),
            "{warnings:?}"
        );
    }

    #[test]
    fn loopback_plaintext_is_allowed_silently_as_cargo_run_uses_it() {
        assert_eq!(check_client_exposure(&Config::defaults()), Ok(vec![]));
        for url in [
            "http://127.0.0.1:2379",
            "http://127.0.0.2:2379",
            "http://localhost:2379",
            "http://[::1]:2379",
            "http://[::ffff:127.0.0.1]:2379",
        ] {
            let c = config(&["--listen-client-urls", url]);
            assert_eq!(check_client_exposure(&c), Ok(vec![]), "{url}");
        }
    }

    #[test]
    fn plaintext_on_other_addresses_is_refused_naming_both_ways_out() {
        for url in [
            "http://0.0.0.0:2379",
            "http://[::]:2379",
            "http://10.1.2.3:2379",
        ] {
            let c = config(&["--listen-client-urls", &format!("http://127.0.0.1:1,{url}")]);
            let err = check_client_exposure(&c).unwrap_err();
            assert!(
                err.starts_with(&format!(
                    "refusing to serve unauthenticated plaintext gRPC on {url}"
                )),
                "{err}"
            );
            for named in [
                "--listen-client-urls=https://0.0.0.0:2379",
                "--cert-file",
                "--key-file",
                "--trusted-ca-file",
                "--client-cert-auth=true",
                "EPHD_CLIENT_CERT_AUTH=true",
                "--allow-insecure-plaintext",
                "EPHD_ALLOW_INSECURE_PLAINTEXT=true",
            ] {
                assert!(err.contains(named), "{named} missing from: {err}");
            }
        }
    }

    #[test]
    fn the_opt_in_serves_plaintext_with_a_warning() {
        let c = config(&[
            "--listen-client-urls",
            "http://0.0.0.0:2379",
            "--allow-insecure-plaintext",
        ]);
        let warnings = check_client_exposure(&c).unwrap();
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].starts_with(
            "INSECURE: serving unauthenticated plaintext gRPC on http://0.0.0.0:2379"
        ));
        assert!(!config(&["--allow-insecure-plaintext=false"]).allow_insecure_plaintext);
        assert!(!Config::defaults().allow_insecure_plaintext);
    }

    #[test]
    fn tls_needs_its_files_and_warns_without_client_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("tls.crt");
        let key = dir.path().join("tls.key");
        let (cert_s, key_s) = (cert.to_str().unwrap(), key.to_str().unwrap());
        let tls = |extra: &[&str]| {
            let mut args = vec!["--listen-client-urls", "https://0.0.0.0:2379"];
            args.extend_from_slice(extra);
            check_client_exposure(&config(&args))
        };
        let err = tls(&[]).unwrap_err();
        assert!(
            err.starts_with("--cert-file (EPHD_CERT_FILE) is not set"),
            "{err}"
        );
        assert!(err.contains("EPHD_ALLOW_INSECURE_PLAINTEXT=true"), "{err}");
        let err = tls(&["--cert-file", cert_s, "--key-file", key_s]).unwrap_err();
        assert!(
            err.starts_with(&format!(
                "--cert-file (EPHD_CERT_FILE) {cert_s} does not exist"
            )),
            "{err}"
        );
        std::fs::write(&cert, "x").unwrap();
        let err = tls(&["--cert-file", cert_s, "--key-file", key_s]).unwrap_err();
        assert!(err.starts_with("--key-file (EPHD_KEY_FILE)"), "{err}");
        std::fs::write(&key, "x").unwrap();
        let warnings = tls(&["--cert-file", cert_s, "--key-file", key_s]).unwrap();
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("without client certificate authentication"));
        assert!(warnings[0].contains("--trusted-ca-file"), "{warnings:?}");
        // A CA alone requires client certificates (as in etcd): no warning.
        assert_eq!(
            tls(&[
                "--cert-file",
                cert_s,
                "--key-file",
                key_s,
                "--trusted-ca-file",
                cert_s,
            ]),
            Ok(vec![])
        );
        // --client-cert-auth without a CA asks for no certificate (and is
        // refused when the files load): still warned here.
        let warnings = tls(&[
            "--cert-file",
            cert_s,
            "--key-file",
            key_s,
            "--client-cert-auth=true",
        ])
        .unwrap();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        // On loopback TLS without client certificates is not worth a warning.
        let c = config(&[
            "--listen-client-urls",
            "https://127.0.0.1:2379",
            "--cert-file",
            cert_s,
            "--key-file",
            key_s,
        ]);
        assert_eq!(check_client_exposure(&c), Ok(vec![]));
    }
}
