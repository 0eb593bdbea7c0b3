//! Tests of the TLS state: the hello's name check, reload keeping the old material on error,
//! and the named reasons of failed handshakes.

use std::sync::Arc;

use openimex_config::{TlsIdentity, TlsMaterial};
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::*;

/// Material whose certificate names `names`, signed by a fresh CA.
pub(crate) fn material(names: &[&str], target_override: Option<&str>) -> TlsMaterial {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let cert = rcgen::CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let mut roots = RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let roots = Arc::new(roots);
    let identity = || TlsIdentity {
        certs: vec![cert.der().clone()],
        key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    };
    TlsMaterial {
        server: identity(),
        server_roots: roots.clone(),
        client: identity(),
        client_roots: roots,
        target_override: target_override.map(str::to_owned),
    }
}

fn cert_of(m: &TlsMaterial) -> CertificateDer<'static> {
    m.server.certs[0].clone()
}

#[test]
fn a_hello_must_come_with_a_certificate_naming_its_entry() {
    let m = material(&["127.0.0.1", "node-a.example"], None);
    let cert = cert_of(&m);
    let tls = Tls::new(m, None).unwrap();
    let sides = tls.sides();
    assert!(names_entry(&sides, &cert, "127.0.0.1").is_ok());
    assert!(names_entry(&sides, &cert, "node-a.example").is_ok());
    let why = names_entry(&sides, &cert, "127.0.0.2").unwrap_err();
    assert!(why.contains("not valid for"), "{why}");
    assert!(names_entry(&sides, &cert, "no name!").is_err());

    // IMEX_SECURITY_TARGET_OVERRIDE: every peer is checked against that one name.
    let m = material(&["localhost"], Some("localhost"));
    let cert = cert_of(&m);
    let sides = Tls::new(m, None).unwrap().sides();
    assert!(names_entry(&sides, &cert, "10.9.8.7").is_ok());
}

#[test]
fn a_failed_reload_keeps_the_material_in_use() {
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let loader: Loader = {
        let calls = calls.clone();
        Arc::new(
            move || match calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                0 => Err("IMEX_SERVER_KEY: file /x does not exist".to_owned()),
                _ => Ok(material(&["127.0.0.2"], None)),
            },
        )
    };
    let m = material(&["127.0.0.1"], None);
    let old = cert_of(&m);
    let tls = Tls::new(m, Some(loader)).unwrap();
    assert!(tls.reloadable());
    let e = tls.reload().unwrap_err();
    assert!(e.contains("/x does not exist"), "{e}");
    // Still the old material: a certificate for .1 passes the name check of .1 only.
    assert!(names_entry(&tls.sides(), &old, "127.0.0.1").is_ok());
    tls.reload().unwrap();
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);

    let env_val = Tls::new(material(&["127.0.0.1"], None), None).unwrap();
    assert!(!env_val.reloadable());
    assert!(env_val.reload().unwrap_err().contains("ENV_VAL"));
}

#[test]
fn failed_handshakes_have_named_reasons() {
    use rustls::{AlertDescription, CertificateError, Error};
    let cases = [
        (
            Side::Accepting,
            Error::NoCertificatesPresented,
            "tls: no client certificate",
        ),
        (
            Side::Accepting,
            Error::InvalidCertificate(CertificateError::UnknownIssuer),
            "tls: client certificate not signed by IMEX_SERVER_CERT_AUTH",
        ),
        (
            Side::Dialling,
            Error::InvalidCertificate(CertificateError::UnknownIssuer),
            "tls: server certificate not signed by IMEX_CLIENT_CERT_AUTH",
        ),
        (
            Side::Dialling,
            Error::InvalidCertificate(CertificateError::NotValidForName),
            "tls: server certificate does not name the node's entry",
        ),
        (
            Side::Dialling,
            Error::InvalidCertificate(CertificateError::Expired),
            "tls: server certificate expired or not yet valid",
        ),
        (
            Side::Dialling,
            Error::AlertReceived(AlertDescription::UnknownCA),
            "tls: server refused our certificate",
        ),
    ];
    for (side, e, reason) in cases {
        assert_eq!(refusal(side, Some(&e)), reason, "{side:?} {e:?}");
        // Found inside an io::Error too, as tokio-rustls hands it over.
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, e.clone());
        assert_eq!(refusal(side, find_rustls(&io)), reason);
    }
    assert_eq!(refusal(Side::Accepting, None), "tls: handshake failed");
}
