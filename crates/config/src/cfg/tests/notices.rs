//! Tests of what `config.cfg` warns about: authentication keys checked only when in force,
//! keys not supported yet, unknown and repeated keys, and the DRA driver's stock template,
//! which must start without a word (issue 32).

use super::*;

#[test]
fn auth_checks_only_when_enabled() {
    // Off: unknown values are ignored with a notice.
    let c = parse("IMEX_AUTH_ENCRYPTION_MODE=KERBEROS\nIMEX_AUTH_SOURCE=DISK").unwrap();
    assert_eq!(c.imex_auth_encryption_mode, None);
    assert_eq!(
        notice_keys(&c),
        [(1, "IMEX_AUTH_ENCRYPTION_MODE"), (2, "IMEX_AUTH_SOURCE")]
    );
    assert!(
        c.notices()[0]
            .message
            .contains("ignored because IMEX_ENABLE_AUTH_ENCRYPTION is 0")
    );
    assert!(
        parse("IMEX_AUTH_ENCRYPTION_MODE=")
            .unwrap()
            .notices()
            .is_empty()
    );

    // On: empty or unknown mode is an error, SSL_TLS needs a source.
    let msg = err("IMEX_ENABLE_AUTH_ENCRYPTION=1\nIMEX_AUTH_ENCRYPTION_MODE=");
    assert!(
        msg.starts_with(
            "cfg:2: IMEX_AUTH_ENCRYPTION_MODE=\"\" is not a valid value: expected one of SSL_TLS, \
             GSS_AUTH_ENCRYPT, GSS_AUTH_ONLY (required because IMEX_ENABLE_AUTH_ENCRYPTION=1 at \
             line 1)"
        ),
        "{msg}"
    );
    let msg = err("IMEX_ENABLE_AUTH_ENCRYPTION=1");
    assert!(msg.starts_with("cfg:1: IMEX_ENABLE_AUTH_ENCRYPTION=1 with IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS needs IMEX_AUTH_SOURCE"));
    let msg = err("IMEX_AUTH_SOURCE=\nIMEX_ENABLE_AUTH_ENCRYPTION=1");
    assert!(
        msg.starts_with("cfg:1: IMEX_AUTH_SOURCE=\"\" is not a valid value"),
        "{msg}"
    );

    let c =
        parse("IMEX_ENABLE_AUTH_ENCRYPTION=1\nIMEX_AUTH_SOURCE=FILE\nIMEX_SERVER_KEY=/k").unwrap();
    assert_eq!(c.imex_auth_source, Some(AuthSource::File));
    assert_eq!(c.imex_server_key.as_deref(), Some("/k"));
    // The TLS keys are built: no "not supported yet" notice; their lines are kept.
    assert!(notice_keys(&c).is_empty(), "{:?}", c.notices());
    assert_eq!(c.tls_key_lines, [("IMEX_SERVER_KEY", 3)]);
    let c =
        parse("IMEX_ENABLE_AUTH_ENCRYPTION=1\nIMEX_AUTH_ENCRYPTION_MODE=GSS_AUTH_ONLY").unwrap();
    assert_eq!(c.imex_auth_encryption_mode, Some(AuthMode::GssAuthOnly));
}

#[test]
fn only_gssapi_is_refused_as_not_built() {
    // Off (the default, or 0): nothing to refuse.
    assert!(parse("").unwrap().refuse_unbuilt_features().is_ok());
    let off = parse("IMEX_ENABLE_AUTH_ENCRYPTION=0\nIMEX_AUTH_SOURCE=FILE").unwrap();
    assert_eq!(off.auth_enabled_at, None);
    assert!(off.refuse_unbuilt_features().is_ok());
    assert!(!off.tls_enabled());

    // SSL_TLS is built: not refused here (its material is checked by `tls_material`).
    let c = parse("LOG_LEVEL=4\nIMEX_ENABLE_AUTH_ENCRYPTION=1\nIMEX_AUTH_SOURCE=FILE").unwrap();
    assert_eq!(c.auth_enabled_at, Some((PathBuf::from("cfg"), 2)));
    assert!(c.refuse_unbuilt_features().is_ok());
    assert!(c.tls_enabled());

    // GSSAPI is not built: refused, naming the line and the way out.
    let c =
        parse("IMEX_AUTH_ENCRYPTION_MODE=GSS_AUTH_ONLY\nIMEX_ENABLE_AUTH_ENCRYPTION=1").unwrap();
    let e = c.refuse_unbuilt_features().unwrap_err();
    assert!(matches!(e, ConfigError::NotBuilt { line: 2, .. }), "{e:?}");
    let msg = e.to_string();
    for needle in [
        "cfg:2: IMEX_ENABLE_AUTH_ENCRYPTION=1 asks for authenticated",
        "IMEX_AUTH_ENCRYPTION_MODE=GSS_AUTH_ONLY",
        "GSSAPI (Kerberos) is not built",
        "use IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS",
        "set IMEX_ENABLE_AUTH_ENCRYPTION=0",
    ] {
        assert!(msg.contains(needle), "{needle:?} in {msg}");
    }
    assert!(!c.tls_enabled());
}

#[test]
fn unknown_key_is_a_notice() {
    let c = parse("LOG_LEVEL=3\nIMEX_FUTURE_KEY=7\nlog_level=2\n").unwrap();
    assert_eq!(c.log_level, 3);
    let shown: Vec<String> = c.notices().iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "cfg:2: unknown key IMEX_FUTURE_KEY ignored",
            "cfg:3: unknown key log_level ignored (keys are case-sensitive: did you mean LOG_LEVEL?)",
        ]
    );
    // Misspelled as in NVIDIA's comment: just unknown.
    let c = parse("IMEX_AUTH_ENCRYPTIPON_MODE=SSL_TLS").unwrap();
    assert_eq!(notice_keys(&c), [(1, "IMEX_AUTH_ENCRYPTIPON_MODE")]);
}

#[test]
fn duplicate_key_later_wins_with_notice() {
    let c = parse("SERVER_PORT=1\n# x\nSERVER_PORT=2\nSERVER_PORT=3\n").unwrap();
    assert_eq!(c.server_port, 3);
    let shown: Vec<String> = c.notices().iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "cfg:3: SERVER_PORT is set twice (lines 1 and 3); the later value is used",
            "cfg:4: SERVER_PORT is set twice (lines 3 and 4); the later value is used",
        ]
    );
}

#[test]
fn not_supported_only_when_not_default() {
    let c = parse("LOG_USE_SYSLOG=0\nLOG_FILE_MAX_SIZE=1024\nNETWORK_INTERFACE=\n").unwrap();
    assert!(c.notices().is_empty(), "{:?}", c.notices());
    // NETWORK_INTERFACE and IMEX_CONN_WAIT_TIMEOUT are implemented: no notice for them. A
    // GSS key matters only in a GSSAPI mode: notice there, and only there.
    let keys = "NETWORK_INTERFACE=eth0\nIMEX_GSS_TIMEOUT_SEC=30\nIMEX_CONN_WAIT_TIMEOUT=70\n";
    let c = parse(&format!(
        "{keys}IMEX_ENABLE_AUTH_ENCRYPTION=1\nIMEX_AUTH_ENCRYPTION_MODE=GSS_AUTH_ENCRYPT\n"
    ))
    .unwrap();
    assert_eq!(notice_keys(&c), [(2, "IMEX_GSS_TIMEOUT_SEC")]);
    assert_eq!(
        c.notices()[0].message,
        "IMEX_GSS_TIMEOUT_SEC is not supported yet by openimex; the value is accepted and ignored"
    );
    assert_eq!(c.network_interface_at, Some((Path::new("cfg").into(), 1)));
    let c = parse(keys).unwrap();
    assert!(
        c.notices().is_empty(),
        "authentication off: {:?}",
        c.notices()
    );
}

/// Issue 32: the Kubernetes DRA driver's stock template sets GSS keys away from their
/// defaults with authentication off; NVIDIA's daemon says nothing, and neither does openimex.
/// Where the same values would act (a GSSAPI mode), they are still reported.
#[test]
fn dra_stock_template_gives_no_notice() {
    let c = Config::parse(DRA_CFG, Path::new("/imexd/config.cfg")).unwrap();
    assert!(!c.imex_enable_auth_encryption);
    assert!(c.notices().is_empty(), "{:?}", c.notices());

    // SSL_TLS: GSS keys still have no effect.
    let tls = DRA_CFG.replace(
        "IMEX_ENABLE_AUTH_ENCRYPTION=0",
        "IMEX_ENABLE_AUTH_ENCRYPTION=1",
    );
    let tls = tls.replace("IMEX_AUTH_SOURCE=\n", "IMEX_AUTH_SOURCE=FILE\n");
    let c = Config::parse(&tls, Path::new("/imexd/config.cfg")).unwrap();
    let gss: Vec<String> = c
        .notices()
        .iter()
        .map(|n| n.key.clone())
        .filter(|k| k.starts_with("IMEX_GSS_"))
        .collect();
    assert!(gss.is_empty(), "SSL_TLS: {:?}", c.notices());

    for mode in ["GSS_AUTH_ONLY", "GSS_AUTH_ENCRYPT"] {
        let text = DRA_CFG
            .replace(
                "IMEX_ENABLE_AUTH_ENCRYPTION=0",
                "IMEX_ENABLE_AUTH_ENCRYPTION=1",
            )
            .replace(
                "IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS",
                &format!("IMEX_AUTH_ENCRYPTION_MODE={mode}"),
            );
        let c = Config::parse(&text, Path::new("/imexd/config.cfg")).unwrap();
        let keys: Vec<&str> = c.notices().iter().map(|n| n.key.as_str()).collect();
        assert!(
            keys.contains(&"IMEX_GSS_TIMEOUT_SEC")
                && keys.contains(&"IMEX_GSS_SHUTDOWN_ON_FAILURE"),
            "{mode}: {keys:?}"
        );
        // Still at their defaults: no notice.
        assert!(
            !keys.contains(&"IMEX_GSS_RETRY_INTERVAL_SEC"),
            "{mode}: {keys:?}"
        );
    }
}
