//! The TLS material of `IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS`: reading the six
//! `IMEX_{SERVER,CLIENT}_{KEY,CERT,CERT_AUTH}` values per `IMEX_AUTH_SOURCE` (FILE: paths;
//! ENV_PATH: names of environment variables holding paths; ENV_VAL: names of environment
//! variables holding the PEM text), parsing the PEM, and checking that each key belongs to its
//! certificate and each CA file holds usable certificates.
//!
//! The daemon calls [`Config::tls_material`] at start (an error stops it, naming the file, the
//! line, the key, the value and the fix) and again on SIGUSR1 (an error keeps the old
//! material). Building rustls configurations from the material is the daemon's business.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use super::{AuthMode, AuthSource, Config};

#[cfg(test)]
mod tests;
use crate::ConfigError;

const SERVER_KEY: &str = "IMEX_SERVER_KEY";
const SERVER_CERT: &str = "IMEX_SERVER_CERT";
const SERVER_CA: &str = "IMEX_SERVER_CERT_AUTH";
const CLIENT_KEY: &str = "IMEX_CLIENT_KEY";
const CLIENT_CERT: &str = "IMEX_CLIENT_CERT";
const CLIENT_CA: &str = "IMEX_CLIENT_CERT_AUTH";

/// The six keys, in the order the config file documents them.
pub(super) const KEYS: [&str; 6] = [
    SERVER_KEY,
    SERVER_CERT,
    SERVER_CA,
    CLIENT_KEY,
    CLIENT_CERT,
    CLIENT_CA,
];

/// What makes `openimex certs` output work: said in every "missing" fix.
const MAKE_CERTS: &str = "`openimex certs --nodes nodes_config.cfg --out DIR` makes a CA and \
                          per-node keys and certificates";

/// A private key and the certificate chain it signs for.
pub struct TlsIdentity {
    /// The certificate first, then any intermediates.
    pub certs: Vec<CertificateDer<'static>>,
    /// The key, checked to belong to `certs[0]`.
    pub key: PrivateKeyDer<'static>,
}

/// Everything mutual TLS between daemons needs, read and checked.
pub struct TlsMaterial {
    /// What the accepting side presents (`IMEX_SERVER_KEY`, `IMEX_SERVER_CERT`).
    pub server: TlsIdentity,
    /// The CAs a dialling peer's certificate must chain to (`IMEX_SERVER_CERT_AUTH`).
    pub server_roots: Arc<RootCertStore>,
    /// What the dialling side presents (`IMEX_CLIENT_KEY`, `IMEX_CLIENT_CERT`).
    pub client: TlsIdentity,
    /// The CAs an accepting peer's certificate must chain to (`IMEX_CLIENT_CERT_AUTH`).
    pub client_roots: Arc<RootCertStore>,
    /// `IMEX_SECURITY_TARGET_OVERRIDE`: the name every peer's certificate is checked against
    /// instead of its nodes-file entry.
    pub target_override: Option<String>,
}

impl std::fmt::Debug for TlsMaterial {
    // Never prints key material.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("server_certs", &self.server.certs.len())
            .field("server_roots", &self.server_roots.len())
            .field("client_certs", &self.client.certs.len())
            .field("client_roots", &self.client_roots.len())
            .field("target_override", &self.target_override)
            .finish()
    }
}

/// Looks up an environment variable (the process environment, or a test's).
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<OsString>;

impl Config {
    /// Whether peers talk mutual TLS (`IMEX_ENABLE_AUTH_ENCRYPTION=1` with `SSL_TLS`).
    pub fn tls_enabled(&self) -> bool {
        self.imex_enable_auth_encryption && self.imex_auth_encryption_mode == Some(AuthMode::SslTls)
    }

    /// Whether SIGUSR1 can reload the material: it is read from files (`FILE`, `ENV_PATH`),
    /// not from the daemon's environment, which cannot change while it runs (`ENV_VAL`).
    pub fn tls_reloadable(&self) -> bool {
        self.tls_enabled() && self.imex_auth_source != Some(AuthSource::EnvVal)
    }

    /// The TLS material when [`Config::tls_enabled`], read from the files or environment
    /// variables the six keys name; `None` when TLS is off.
    pub fn tls_material(&self) -> Result<Option<TlsMaterial>, ConfigError> {
        self.tls_material_from(&|name| std::env::var_os(name))
    }

    /// [`Config::tls_material`] with the environment looked up through `env`.
    pub fn tls_material_from(
        &self,
        env: EnvLookup<'_>,
    ) -> Result<Option<TlsMaterial>, ConfigError> {
        if !self.tls_enabled() {
            return Ok(None);
        }
        let reader = Reader { cfg: self, env };
        // All six named before any is read: a config missing one says so first.
        for key in KEYS {
            reader.value(key)?;
        }
        // In the file's order: each key before its certificate.
        let server_key = reader.read(SERVER_KEY)?;
        let server_certs = reader.certs(SERVER_CERT)?;
        let server_key = reader.key(server_key, SERVER_CERT, &server_certs)?;
        let client_key = reader.read(CLIENT_KEY)?;
        let client_certs = reader.certs(CLIENT_CERT)?;
        let client_key = reader.key(client_key, CLIENT_CERT, &client_certs)?;
        let target_override = self.target_override()?;
        Ok(Some(TlsMaterial {
            server: TlsIdentity {
                certs: server_certs,
                key: server_key,
            },
            server_roots: Arc::new(reader.roots(SERVER_CA)?),
            client: TlsIdentity {
                certs: client_certs,
                key: client_key,
            },
            client_roots: Arc::new(reader.roots(CLIENT_CA)?),
            target_override,
        }))
    }

    /// `IMEX_SECURITY_TARGET_OVERRIDE` as the name certificates are checked against: NVIDIA's
    /// examples write it `CN=name`, so that prefix is dropped. It must be a DNS name or an IP
    /// address, since that is what a certificate's subject alternative names hold.
    fn target_override(&self) -> Result<Option<String>, ConfigError> {
        const KEY: &str = "IMEX_SECURITY_TARGET_OVERRIDE";
        let Some(raw) = &self.imex_security_target_override else {
            return Ok(None);
        };
        let name = raw.strip_prefix("CN=").unwrap_or(raw);
        if rustls::pki_types::ServerName::try_from(name).is_ok() {
            return Ok(Some(name.to_owned()));
        }
        Err(ConfigError::TlsMaterial {
            path: self
                .auth_enabled_at
                .as_ref()
                .map(|(p, _)| p.clone())
                .unwrap_or_default(),
            line: self.override_line,
            key: KEY,
            value: raw.clone(),
            problem: "it is neither a DNS name nor an IP address, so no certificate can carry it"
                .to_owned(),
            fix: "give the name the peers' certificates carry (e.g. localhost), or leave it \
                  empty to check each peer under its nodes-file entry"
                .to_owned(),
        })
    }

    fn tls_value(&self, key: &str) -> Option<&String> {
        match key {
            SERVER_KEY => self.imex_server_key.as_ref(),
            SERVER_CERT => self.imex_server_cert.as_ref(),
            SERVER_CA => self.imex_server_cert_auth.as_ref(),
            CLIENT_KEY => self.imex_client_key.as_ref(),
            CLIENT_CERT => self.imex_client_cert.as_ref(),
            CLIENT_CA => self.imex_client_cert_auth.as_ref(),
            _ => None,
        }
    }
}

/// Reads the values of one config.
struct Reader<'a> {
    cfg: &'a Config,
    env: EnvLookup<'a>,
}

/// One key's value, where it was set, and the PEM text it leads to.
struct Found {
    key: &'static str,
    value: String,
    line: usize,
    /// The file read, `None` for ENV_VAL.
    file: Option<PathBuf>,
    pem: Vec<u8>,
}

impl Found {
    fn error(&self, path: &Path, problem: String, fix: impl Into<String>) -> ConfigError {
        ConfigError::TlsMaterial {
            path: path.to_path_buf(),
            line: self.line,
            key: self.key,
            value: self.value.clone(),
            problem,
            fix: fix.into(),
        }
    }

    /// "file /etc/x.pem" or "the PEM text in $VAR".
    fn what(&self) -> String {
        match &self.file {
            Some(file) => format!("file {}", file.display()),
            None => format!("the PEM text in environment variable {}", self.value),
        }
    }
}

impl Reader<'_> {
    fn config_path(&self) -> PathBuf {
        self.cfg
            .auth_enabled_at
            .as_ref()
            .map(|(p, _)| p.clone())
            .unwrap_or_default()
    }

    fn line(&self, key: &str) -> usize {
        self.cfg
            .tls_key_lines
            .iter()
            .find(|(k, _)| *k == key)
            .map_or(0, |&(_, line)| line)
    }

    /// `key`'s value, or the error that it is needed.
    fn value(&self, key: &'static str) -> Result<&String, ConfigError> {
        let source = self.cfg.imex_auth_source.unwrap_or(AuthSource::File);
        let Some(value) = self.cfg.tls_value(key) else {
            let enable_line = self.cfg.auth_enabled_at.as_ref().map_or(0, |(_, l)| *l);
            let meaning = match source {
                AuthSource::File => "the path of a PEM file",
                AuthSource::EnvPath => {
                    "the name of an environment variable holding a PEM file's path"
                }
                AuthSource::EnvVal => "the name of an environment variable holding the PEM text",
            };
            return Err(ConfigError::Incomplete {
                path: self.config_path(),
                line: enable_line,
                key: "IMEX_ENABLE_AUTH_ENCRYPTION".to_owned(),
                value: "1".to_owned(),
                needs: format!(
                    "with IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS needs {key}: set it to {meaning} \
                     (IMEX_AUTH_SOURCE={source}); {MAKE_CERTS}"
                ),
            });
        };
        Ok(value)
    }

    /// The PEM text `key` leads to, per `IMEX_AUTH_SOURCE`.
    fn read(&self, key: &'static str) -> Result<Found, ConfigError> {
        let path = self.config_path();
        let source = self.cfg.imex_auth_source.unwrap_or(AuthSource::File);
        let value = self.value(key)?;
        let mut found = Found {
            key,
            value: value.clone(),
            line: self.line(key),
            file: None,
            pem: Vec::new(),
        };
        let file = match source {
            AuthSource::File => PathBuf::from(value),
            AuthSource::EnvPath | AuthSource::EnvVal => match (self.env)(value) {
                Some(v) if !v.is_empty() => match source {
                    AuthSource::EnvVal => {
                        found.pem = v.into_encoded_bytes();
                        return Ok(found);
                    }
                    _ => PathBuf::from(v),
                },
                _ => {
                    return Err(found.error(
                        &path,
                        format!(
                            "environment variable {value} is not set or empty \
                             (IMEX_AUTH_SOURCE={source}: the value names a variable holding {})",
                            if source == AuthSource::EnvVal {
                                "the PEM text"
                            } else {
                                "a file's path"
                            }
                        ),
                        "set it in the daemon's environment (systemd: Environment= or \
                         EnvironmentFile=), or use IMEX_AUTH_SOURCE=FILE with paths",
                    ));
                }
            },
        };
        found.pem = match std::fs::read(&file) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                found.file = Some(file.clone());
                return Err(found.error(
                    &path,
                    format!("file {} does not exist", file.display()),
                    format!("write the PEM file there or correct the path; {MAKE_CERTS}"),
                ));
            }
            Err(e) => {
                return Err(found.error(
                    &path,
                    format!("cannot read {}: {e}", file.display()),
                    "make it readable by the daemon's user (root), or correct the path",
                ));
            }
        };
        found.file = Some(file);
        Ok(found)
    }

    /// The certificates of `key`'s PEM; at least one.
    fn certs(&self, key: &'static str) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
        let found = self.read(key)?;
        parse_certs(&found).map_err(|problem| {
            found.error(
                &self.config_path(),
                problem,
                format!("give a PEM certificate (-----BEGIN CERTIFICATE-----); {MAKE_CERTS}"),
            )
        })
    }

    /// The private key in `found`, checked against the first of `certs` (from `cert_key`).
    fn key(
        &self,
        found: Found,
        cert_key: &str,
        certs: &[CertificateDer<'static>],
    ) -> Result<PrivateKeyDer<'static>, ConfigError> {
        let path = self.config_path();
        let der = PrivateKeyDer::from_pem_slice(&found.pem).map_err(|e| {
            found.error(
                &path,
                format!(
                    "{} holds no usable PEM private key ({})",
                    found.what(),
                    pem_problem(&e)
                ),
                "give a PEM private key (PKCS#8 -----BEGIN PRIVATE KEY-----, PKCS#1 or SEC1)",
            )
        })?;
        let signer = rustls::crypto::ring::sign::any_supported_type(&der).map_err(|e| {
            found.error(
                &path,
                format!("{}: the key cannot sign: {e}", found.what()),
                "use an ECDSA P-256/P-384, Ed25519 or RSA key",
            )
        })?;
        let cert_line = self.line(cert_key);
        match CertifiedKey::new(certs.to_vec(), signer).keys_match() {
            Ok(()) => Ok(der),
            // The provider cannot tell (no public key): the handshake will.
            Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(der),
            Err(_) => Err(found.error(
                &path,
                format!(
                    "the private key in {} does not belong to the certificate of {cert_key} \
                     (line {cert_line})",
                    found.what()
                ),
                format!("give the key that was made with that certificate, or the certificate of this key ({cert_key})"),
            )),
        }
    }

    /// The CA certificates of `key`'s PEM as a root store; at least one usable.
    fn roots(&self, key: &'static str) -> Result<RootCertStore, ConfigError> {
        let path = self.config_path();
        let found = self.read(key)?;
        let certs = parse_certs(&found).map_err(|problem| {
            found.error(
                &path,
                problem,
                format!("give the PEM certificate of the domain's CA; {MAKE_CERTS}"),
            )
        })?;
        let mut roots = RootCertStore::empty();
        for (i, cert) in certs.into_iter().enumerate() {
            roots.add(cert).map_err(|e| {
                found.error(
                    &path,
                    format!(
                        "certificate {} in {} is not a usable CA certificate: {e}",
                        i + 1,
                        found.what()
                    ),
                    "give the PEM certificate of the CA that signed the peers' certificates",
                )
            })?;
        }
        Ok(roots)
    }
}

/// Every certificate in `found`'s PEM, or why there is none.
fn parse_certs(found: &Found) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(&found.pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{} is not valid PEM ({})", found.what(), pem_problem(&e)))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", found.what()));
    }
    Ok(certs)
}

/// A PEM parse error in words.
fn pem_problem(e: &pem::Error) -> String {
    match e {
        pem::Error::NoItemsFound => "no PEM section of the expected kind".to_owned(),
        other => other.to_string(),
    }
}
