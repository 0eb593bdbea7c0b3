//! Mutual TLS between daemons (`IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS`): the rustls
//! configurations of both sides built from the config crate's [`TlsMaterial`], swapped on
//! SIGUSR1 ([`Tls::reload`]), and the named reasons a failed handshake is refused and counted
//! under (`refusal`).
//!
//! TLS 1.3 only, ring as the only crypto provider. The accepting side requires a client
//! certificate that chains to `IMEX_SERVER_CERT_AUTH`; the dialling side presents its client
//! certificate and checks the peer's against `IMEX_CLIENT_CERT_AUTH` under the peer's
//! nodes-file entry (an IP SAN for an address, a DNS SAN for a name), or under
//! `IMEX_SECURITY_TARGET_OVERRIDE` when set. Connections already up keep the material they
//! were made with: a reload only changes what new connections use.

mod reload;
#[cfg(test)]
pub(crate) mod tests;

use std::sync::{Arc, RwLock};

use openimex_config::TlsMaterial;
use rustls::pki_types::ServerName;
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, ClientConfig, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::error::{DaemonError, DialError};

pub use reload::MIN_RELOAD_INTERVAL;
pub(crate) use reload::before_rereads;

/// Reads the material again (the config crate's [`openimex_config::Config::tls_material`]).
pub type Loader = Arc<dyn Fn() -> Result<TlsMaterial, String> + Send + Sync>;

/// Both sides' configurations as they are now. Public, with [`Tls::sides`], so the lab's
/// bench can time a bare gRPC mesh over exactly the daemon's TLS (same versions, provider,
/// verifiers and ALPN) as the floor of its TLS figures.
#[derive(Clone)]
pub struct Sides {
    pub(crate) acceptor: TlsAcceptor,
    pub(crate) connector: TlsConnector,
    /// `IMEX_SECURITY_TARGET_OVERRIDE`.
    target_override: Option<String>,
}

impl Sides {
    /// The accepting side: requires a client certificate that chains to
    /// `IMEX_SERVER_CERT_AUTH`.
    pub fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }

    /// The dialling side: presents the client certificate; check the peer under
    /// [`Sides::server_name`].
    pub fn connector(&self) -> &TlsConnector {
        &self.connector
    }

    /// The name a peer's certificate must carry: its nodes-file entry, or the override.
    pub fn server_name(&self, entry: &str) -> Result<ServerName<'static>, String> {
        let name = self.target_override.as_deref().unwrap_or(entry);
        ServerName::try_from(name.to_owned()).map_err(|_| {
            format!(
                "{name:?} cannot be checked against a certificate (neither an IP address nor a DNS name)"
            )
        })
    }
}

/// Whether `cert` names `entry` (or the override): the accepting side's check that a hello
/// naming node N comes with node N's certificate. rustls checks only the chain of a client
/// certificate; the name is ours to check, since only the hello says which node it claims.
pub(crate) fn names_entry(
    sides: &Sides,
    cert: &rustls::pki_types::CertificateDer<'_>,
    entry: &str,
) -> Result<(), String> {
    let name = sides.server_name(entry)?;
    let cert = webpki::EndEntityCert::try_from(cert).map_err(|e| format!("unreadable: {e}"))?;
    cert.verify_is_valid_for_subject_name(&name)
        .map_err(|e| format!("it is not valid for {name:?}: {e}"))
}

/// The TLS state of a daemon: shared by the listener, every dial and the SIGUSR1 path.
#[derive(Clone)]
pub struct Tls {
    current: Arc<RwLock<Sides>>,
    /// `None` with `IMEX_AUTH_SOURCE=ENV_VAL`: the environment cannot change, nothing to reload.
    loader: Option<Loader>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("reloadable", &self.loader.is_some())
            .finish()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// rustls configurations from `m`.
fn build(m: TlsMaterial) -> Result<Sides, String> {
    let verifier = WebPkiClientVerifier::builder_with_provider(m.server_roots, provider())
        .build()
        .map_err(|e| format!("IMEX_SERVER_CERT_AUTH cannot verify clients: {e}"))?;
    let mut server = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(m.server.certs, m.server.key)
        .map_err(|e| format!("IMEX_SERVER_KEY / IMEX_SERVER_CERT: {e}"))?;
    server.alpn_protocols = vec![b"h2".to_vec()];
    let mut client = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_root_certificates(m.client_roots)
        .with_client_auth_cert(m.client.certs, m.client.key)
        .map_err(|e| format!("IMEX_CLIENT_KEY / IMEX_CLIENT_CERT: {e}"))?;
    client.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Sides {
        acceptor: TlsAcceptor::from(Arc::new(server)),
        connector: TlsConnector::from(Arc::new(client)),
        target_override: m.target_override,
    })
}

impl Tls {
    /// TLS from `material`; `loader` reads it again on SIGUSR1 (`None`: not reloadable).
    pub fn new(material: TlsMaterial, loader: Option<Loader>) -> Result<Tls, DaemonError> {
        let sides = build(material).map_err(|cause| DaemonError::Tls {
            cause,
            fix: "check the six IMEX_SERVER_* / IMEX_CLIENT_* files (openimex certs makes a \
                  matching set)",
        })?;
        Ok(Tls {
            current: Arc::new(RwLock::new(sides)),
            loader,
        })
    }

    /// What new connections use now.
    pub fn sides(&self) -> Sides {
        match self.current.read() {
            Ok(s) => s.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Whether SIGUSR1 reads the material again.
    pub fn reloadable(&self) -> bool {
        self.loader.is_some()
    }

    /// Reads the material again and, if it is usable, makes new connections use it. On error
    /// the old material stays and the error says why.
    pub fn reload(&self) -> Result<(), String> {
        let Some(loader) = &self.loader else {
            return Err(
                "IMEX_AUTH_SOURCE=ENV_VAL: the material is in the daemon's environment, \
                        which cannot change while it runs; restart the daemon to use new material"
                    .to_owned(),
            );
        };
        let sides = build(loader()?)?;
        match self.current.write() {
            Ok(mut s) => *s = sides,
            Err(poisoned) => *poisoned.into_inner() = sides,
        }
        Ok(())
    }
}

/// The rustls error somewhere in `e`'s chain (also inside an `io::Error`, whose `source`
/// skips the error it wraps).
pub(crate) fn find_rustls<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::Error> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && let Some(r) = inner.downcast_ref::<rustls::Error>()
        {
            return Some(r);
        }
        cur = err.source();
    }
    None
}

/// Why a hello over TLS failed. With TLS 1.3 the server checks our certificate after our
/// side of the handshake is done, so its refusal arrives as an alert on the first call. HTTP/2
/// keeps only the text of the I/O error that carried it, so the alert is found by its words
/// when the rustls error itself is gone.
pub(crate) fn hello_failed(s: &tonic::Status) -> DialError {
    let cause = openimex_proto::root_cause(s);
    match find_rustls(s) {
        Some(e) => DialError::Tls {
            reason: refusal(Side::Dialling, Some(e)),
            detail: e.to_string(),
        },
        None if cause.contains("received fatal alert") => DialError::Tls {
            reason: refusal(
                Side::Dialling,
                Some(&rustls::Error::AlertReceived(
                    rustls::AlertDescription::BadCertificate,
                )),
            ),
            detail: cause,
        },
        None => DialError::Handshake(format!("{} ({cause})", s.message())),
    }
}

/// Which side of the handshake we were.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// We accepted: the peer is a client.
    Accepting,
    /// We dialled: the peer is a server.
    Dialling,
}

/// The named reason a handshake that failed with `e` is refused and counted under.
pub(crate) fn refusal(side: Side, e: Option<&rustls::Error>) -> &'static str {
    use Side::{Accepting, Dialling};
    let bad_cert = |c: &CertificateError| match c {
        CertificateError::UnknownIssuer
        | CertificateError::BadSignature
        | CertificateError::UnhandledCriticalExtension => Some(true),
        CertificateError::Expired
        | CertificateError::ExpiredContext { .. }
        | CertificateError::NotValidYet
        | CertificateError::NotValidYetContext { .. } => Some(false),
        _ => None,
    };
    match (side, e) {
        (Accepting, Some(rustls::Error::NoCertificatesPresented)) => "tls: no client certificate",
        (Accepting, Some(rustls::Error::InvalidCertificate(c))) => match bad_cert(c) {
            Some(true) => "tls: client certificate not signed by IMEX_SERVER_CERT_AUTH",
            Some(false) => "tls: client certificate expired or not yet valid",
            None => "tls: client certificate invalid",
        },
        (Dialling, Some(rustls::Error::InvalidCertificate(c))) => match (c, bad_cert(c)) {
            (
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
                _,
            ) => "tls: server certificate does not name the node's entry",
            (_, Some(true)) => "tls: server certificate not signed by IMEX_CLIENT_CERT_AUTH",
            (_, Some(false)) => "tls: server certificate expired or not yet valid",
            _ => "tls: server certificate invalid",
        },
        (Accepting, Some(rustls::Error::AlertReceived(_))) => "tls: client refused our certificate",
        (Dialling, Some(rustls::Error::AlertReceived(_))) => "tls: server refused our certificate",
        (
            _,
            Some(
                rustls::Error::InvalidMessage(_)
                | rustls::Error::InappropriateMessage { .. }
                | rustls::Error::InappropriateHandshakeMessage { .. },
            ),
        ) => "tls: not a TLS 1.3 peer",
        _ => "tls: handshake failed",
    }
}
