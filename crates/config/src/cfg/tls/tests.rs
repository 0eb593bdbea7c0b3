//! Tests of reading the TLS material: the three sources, and every error naming the file, the
//! line, the key, the value and the fix.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;

use super::*;

/// A CA and a certificate + key it signed for `127.0.0.1`, as PEM.
struct Made {
    ca: String,
    cert: String,
    key: String,
}

fn make() -> Made {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    Made {
        ca: ca.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    }
}

/// A config with auth on, `source`, and the six keys set to `values` (server and client the
/// same), on lines 4-9.
fn config(source: &str, key: &str, cert: &str, ca: &str) -> Config {
    let text = format!(
        "LOG_LEVEL=4\nIMEX_ENABLE_AUTH_ENCRYPTION=1\nIMEX_AUTH_SOURCE={source}\n\
         IMEX_SERVER_KEY={key}\nIMEX_SERVER_CERT={cert}\nIMEX_SERVER_CERT_AUTH={ca}\n\
         IMEX_CLIENT_KEY={key}\nIMEX_CLIENT_CERT={cert}\nIMEX_CLIENT_CERT_AUTH={ca}\n"
    );
    Config::parse(&text, Path::new("cfg")).unwrap()
}

fn no_env(_: &str) -> Option<OsString> {
    None
}

/// Writes `made` into a fresh directory: key.pem, cert.pem, ca.pem.
fn files(made: &Made, tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("openimex-cfg-tls-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text) in [
        ("key.pem", &made.key),
        ("cert.pem", &made.cert),
        ("ca.pem", &made.ca),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
    }
    dir
}

fn paths(dir: &Path) -> [String; 3] {
    ["key.pem", "cert.pem", "ca.pem"].map(|n| dir.join(n).display().to_string())
}

#[test]
fn tls_off_reads_nothing() {
    let c = Config::parse("IMEX_SERVER_KEY=/nonexistent", Path::new("cfg")).unwrap();
    assert!(c.tls_material_from(&no_env).unwrap().is_none());
}

#[test]
fn file_source_reads_and_checks_the_six_files() {
    let made = make();
    let dir = files(&made, "file");
    let [key, cert, ca] = paths(&dir);
    let c = config("FILE", &key, &cert, &ca);
    assert!(c.tls_reloadable());
    let m = c.tls_material_from(&no_env).unwrap().expect("tls on");
    assert_eq!(m.server.certs.len(), 1);
    assert_eq!(m.client_roots.len(), 1);

    // A missing file: the line of the key, the key, the value, and the fix.
    let c = config("FILE", &format!("{key}.gone"), &cert, &ca);
    let msg = c.tls_material_from(&no_env).unwrap_err().to_string();
    assert!(
        msg.starts_with(&format!("cfg:4: IMEX_SERVER_KEY=\"{key}.gone\": file ")),
        "{msg}"
    );
    assert!(
        msg.contains("does not exist") && msg.contains("openimex certs"),
        "{msg}"
    );

    // Not PEM.
    std::fs::write(dir.join("junk"), "not a certificate").unwrap();
    let junk = dir.join("junk").display().to_string();
    let c = config("FILE", &key, &cert, &junk);
    let msg = c.tls_material_from(&no_env).unwrap_err().to_string();
    assert!(msg.starts_with("cfg:6: IMEX_SERVER_CERT_AUTH="), "{msg}");
    assert!(msg.contains("holds no PEM certificate"), "{msg}");
    let c = config("FILE", &junk, &cert, &ca);
    let msg = c.tls_material_from(&no_env).unwrap_err().to_string();
    assert!(msg.starts_with("cfg:4: IMEX_SERVER_KEY="), "{msg}");
    assert!(msg.contains("no usable PEM private key"), "{msg}");

    // A key that is not the certificate's.
    let other = make();
    std::fs::write(dir.join("other.key"), &other.key).unwrap();
    let other_key = dir.join("other.key").display().to_string();
    let c = config("FILE", &other_key, &cert, &ca);
    let msg = c.tls_material_from(&no_env).unwrap_err().to_string();
    assert!(msg.starts_with("cfg:4: IMEX_SERVER_KEY="), "{msg}");
    assert!(
        msg.contains("does not belong to the certificate of IMEX_SERVER_CERT (line 5)"),
        "{msg}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn env_sources_name_variables() {
    let made = make();
    let dir = files(&made, "env");
    let [key, cert, ca] = paths(&dir);
    let by_path: HashMap<&str, String> = [("K", key), ("C", cert), ("A", ca)].into();
    let c = config("ENV_PATH", "K", "C", "A");
    assert!(c.tls_reloadable());
    let env = |n: &str| by_path.get(n).map(OsString::from);
    assert!(c.tls_material_from(&env).unwrap().is_some());

    let by_value: HashMap<&str, String> = [
        ("K", made.key.clone()),
        ("C", made.cert.clone()),
        ("A", made.ca.clone()),
    ]
    .into();
    let c = config("ENV_VAL", "K", "C", "A");
    assert!(
        !c.tls_reloadable(),
        "the environment cannot change under a running daemon"
    );
    let env = |n: &str| by_value.get(n).map(OsString::from);
    assert!(c.tls_material_from(&env).unwrap().is_some());

    // An unset variable: named, with the way to set it.
    let msg = c.tls_material_from(&no_env).unwrap_err().to_string();
    assert!(
        msg.starts_with("cfg:4: IMEX_SERVER_KEY=\"K\": environment variable K is not set"),
        "{msg}"
    );
    assert!(msg.contains("Environment="), "{msg}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_missing_key_is_named_at_the_enable_line() {
    let c = Config::parse(
        "IMEX_ENABLE_AUTH_ENCRYPTION=1\nIMEX_AUTH_SOURCE=FILE\nIMEX_SERVER_CERT=/c\n",
        Path::new("cfg"),
    )
    .unwrap();
    let msg = c.tls_material_from(&no_env).unwrap_err().to_string();
    assert!(msg.starts_with("cfg:1: IMEX_ENABLE_AUTH_ENCRYPTION=1 with IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS needs IMEX_SERVER_KEY"), "{msg}");
}

#[test]
fn the_target_override_is_a_name_a_certificate_can_carry() {
    let made = make();
    let dir = files(&made, "override");
    let [key, cert, ca] = paths(&dir);
    let with = |value: &str| {
        let mut c = config("FILE", &key, &cert, &ca);
        let text = format!("IMEX_SECURITY_TARGET_OVERRIDE={value}\n");
        c.imex_security_target_override = Config::parse(&text, Path::new("cfg"))
            .unwrap()
            .imex_security_target_override;
        c.override_line = 10;
        c
    };
    let m = with("CN=localhost")
        .tls_material_from(&no_env)
        .unwrap()
        .unwrap();
    assert_eq!(m.target_override.as_deref(), Some("localhost"));
    let msg = with("not a name!")
        .tls_material_from(&no_env)
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("cfg:10: IMEX_SECURITY_TARGET_OVERRIDE=\"not a name!\": it is neither"),
        "{msg}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
