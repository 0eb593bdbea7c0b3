//! Certificates for mutual TLS between daemons (`IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS`): a
//! per-domain CA and, per nodes-file entry, a key and a certificate usable both to accept
//! (server) and to dial (client), whose subject alternative name is the entry itself (an IP
//! SAN for an address, a DNS SAN for a name), since that is what a dialling daemon checks.
//!
//! Used by `openimex certs` and `openimex init` ([`write_domain`]) and by the lab's test
//! clusters, which keep the [`Ca`] in memory to issue more certificates later (rotation).
//! Keys are ECDSA P-256; key files are written mode 0600.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

mod error;

pub use error::CertsError;

/// The default validity of `openimex certs`, in days.
pub const DEFAULT_DAYS: u32 = 365;

/// A key and its certificate, as PEM text.
#[derive(Debug, Clone)]
pub struct Pem {
    /// `-----BEGIN CERTIFICATE-----`.
    pub cert: String,
    /// `-----BEGIN PRIVATE KEY-----` (PKCS#8).
    pub key: String,
}

/// A certificate authority that signs node certificates.
pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
    days: u32,
}

fn failed(what: impl Into<String>, e: rcgen::Error) -> CertsError {
    CertsError::Make {
        what: what.into(),
        cause: e.to_string(),
        hint: "a node entry must be an IP address or a DNS name to appear in a certificate",
    }
}

/// `not_before` an hour ago (clocks of a domain differ a little), `not_after` in `days`.
fn validity(params: &mut CertificateParams, days: u32) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(i64::from(days));
}

impl std::fmt::Debug for Ca {
    // Never prints the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").field("days", &self.days).finish()
    }
}

impl Ca {
    /// A new CA named `name` (its common name), valid for `days`; certificates it issues are
    /// valid as long.
    pub fn new(name: &str, days: u32) -> Result<Ca, CertsError> {
        let key = KeyPair::generate().map_err(|e| failed("the CA key", e))?;
        let mut params = CertificateParams::new(Vec::new()).map_err(|e| failed("the CA", e))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, name.to_owned());
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params, days);
        let cert = params
            .self_signed(&key)
            .map_err(|e| failed("the CA certificate", e))?;
        Ok(Ca { cert, key, days })
    }

    /// The CA's certificate and key.
    pub fn pem(&self) -> Pem {
        Pem {
            cert: self.cert.pem(),
            key: self.key.serialize_pem(),
        }
    }

    /// A new key and a certificate for the nodes-file entry `entry` (an IP address or a DNS
    /// name), for both sides of a peer connection.
    pub fn issue(&self, entry: &str) -> Result<Pem, CertsError> {
        let what = || format!("the certificate of {entry}");
        // What a dialling daemon will check the certificate against (`ServerName`): a name
        // it cannot parse could never match.
        if rustls_pki_types::ServerName::try_from(entry).is_err() {
            return Err(CertsError::Make {
                what: what(),
                cause: "it is neither an IP address nor a valid DNS name".to_owned(),
                hint: "a node entry must be an IP address or a DNS name to appear in a certificate",
            });
        }
        let key = KeyPair::generate().map_err(|e| failed(what(), e))?;
        let mut params =
            CertificateParams::new(vec![entry.to_owned()]).map_err(|e| failed(what(), e))?;
        params
            .distinguished_name
            .push(DnType::CommonName, entry.to_owned());
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params, self.days);
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .map_err(|e| failed(what(), e))?;
        Ok(Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

/// The files of one node, as [`write_domain`] names them.
#[derive(Debug, Clone)]
pub struct NodeFiles {
    /// The nodes-file entry.
    pub entry: String,
    /// `node<ID>.pem`.
    pub cert: PathBuf,
    /// `node<ID>.key`.
    pub key: PathBuf,
}

/// What [`write_domain`] wrote.
#[derive(Debug, Clone)]
pub struct DomainFiles {
    /// `ca.pem`.
    pub ca_cert: PathBuf,
    /// `ca.key`.
    pub ca_key: PathBuf,
    /// One per entry, in node-ID order.
    pub nodes: Vec<NodeFiles>,
}

impl DomainFiles {
    /// The config.cfg lines that make node `id` use these files (FILE source, the same key
    /// and certificate on both sides, the domain's CA to check peers).
    pub fn config_lines(&self, id: usize) -> Option<Vec<(String, String)>> {
        let node = self.nodes.get(id)?;
        let ca = self.ca_cert.display().to_string();
        let (cert, key) = (
            node.cert.display().to_string(),
            node.key.display().to_string(),
        );
        let pairs = [
            ("IMEX_ENABLE_AUTH_ENCRYPTION", "1".to_owned()),
            ("IMEX_AUTH_ENCRYPTION_MODE", "SSL_TLS".to_owned()),
            ("IMEX_AUTH_SOURCE", "FILE".to_owned()),
            ("IMEX_SERVER_KEY", key.clone()),
            ("IMEX_SERVER_CERT", cert.clone()),
            ("IMEX_SERVER_CERT_AUTH", ca.clone()),
            ("IMEX_CLIENT_KEY", key),
            ("IMEX_CLIENT_CERT", cert),
            ("IMEX_CLIENT_CERT_AUTH", ca),
        ];
        Some(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
    }
}

/// The paths [`write_domain`] uses for `entries` in `out`.
pub fn domain_paths(entries: &[String], out: &Path) -> DomainFiles {
    DomainFiles {
        ca_cert: out.join("ca.pem"),
        ca_key: out.join("ca.key"),
        nodes: entries
            .iter()
            .enumerate()
            .map(|(id, entry)| NodeFiles {
                entry: entry.clone(),
                cert: out.join(format!("node{id}.pem")),
                key: out.join(format!("node{id}.key")),
            })
            .collect(),
    }
}

/// Makes a CA and one certificate per entry and writes them into `out` (created if missing):
/// `ca.pem`, `ca.key`, `node<ID>.pem`, `node<ID>.key`. Refuses to overwrite any existing file
/// unless `force`; checks all of them before writing any. Returns the paths and the CA.
pub fn write_domain(
    entries: &[String],
    out: &Path,
    days: u32,
    force: bool,
) -> Result<(DomainFiles, Ca), CertsError> {
    let files = domain_paths(entries, out);
    if !force {
        let all = [&files.ca_cert, &files.ca_key]
            .into_iter()
            .chain(files.nodes.iter().flat_map(|n| [&n.cert, &n.key]));
        for path in all {
            if path.exists() {
                return Err(CertsError::Exists { path: path.clone() });
            }
        }
    }
    std::fs::create_dir_all(out).map_err(|source| CertsError::Io {
        action: "create the certificate directory",
        path: out.to_path_buf(),
        source,
        hint: "pass an --out directory this user can write",
    })?;
    let ca = Ca::new("openimex domain CA", days)?;
    let pem = ca.pem();
    write_file(&files.ca_cert, &pem.cert, 0o644)?;
    write_file(&files.ca_key, &pem.key, 0o600)?;
    for node in &files.nodes {
        write_node(&ca, node)?;
    }
    Ok((files, ca))
}

/// Issues a new certificate and key for `node` from `ca` and writes them over its files.
pub fn write_node(ca: &Ca, node: &NodeFiles) -> Result<(), CertsError> {
    let pem = ca.issue(&node.entry)?;
    write_file(&node.cert, &pem.cert, 0o644)?;
    write_file(&node.key, &pem.key, 0o600)
}

/// Writes `text` to `path` with `mode` (also when the file exists: its mode is set again).
pub fn write_file(path: &Path, text: &str, mode: u32) -> Result<(), CertsError> {
    let io = |source| CertsError::Io {
        action: "write",
        path: path.to_path_buf(),
        source,
        hint: "check the directory exists and this user can write it",
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(io)?;
    // `mode` applies only to a new file: a key written over an old one must not stay readable.
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(io)?;
    f.write_all(text.as_bytes()).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_domain_has_a_ca_and_a_cert_per_entry_and_refuses_to_overwrite() {
        let dir = std::env::temp_dir().join(format!("openimex-certs-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let out = dir.join("certs");
        let entries = vec!["10.0.0.1".to_owned(), "node-b.example".to_owned()];
        let (files, _ca) = write_domain(&entries, &out, 30, false).expect("certs");
        for (path, mode) in [
            (&files.ca_cert, 0o644),
            (&files.ca_key, 0o600),
            (&files.nodes[1].key, 0o600),
        ] {
            let meta = std::fs::metadata(path).expect("written");
            assert_eq!(
                meta.permissions().mode() & 0o777,
                mode,
                "{}",
                path.display()
            );
        }
        let cert = std::fs::read_to_string(&files.nodes[0].cert).expect("cert");
        assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"), "{cert}");
        let key = std::fs::read_to_string(&files.nodes[0].key).expect("key");
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"), "{key}");
        // A second run refuses, naming the file; --force writes new ones.
        let e = write_domain(&entries, &out, 30, false).expect_err("refused");
        assert!(e.to_string().contains("ca.pem exists already"), "{e}");
        write_domain(&entries, &out, 30, true).expect("forced");
        assert_ne!(
            std::fs::read_to_string(&files.nodes[0].key).expect("key"),
            key
        );
        let lines = files.config_lines(1).expect("node 1");
        assert!(lines.contains(&(
            "IMEX_SERVER_CERT".to_owned(),
            files.nodes[1].cert.display().to_string()
        )));
        assert!(files.config_lines(2).is_none());
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn an_entry_that_is_no_name_is_refused() {
        let ca = Ca::new("test", 1).expect("ca");
        let e = ca.issue("not a name!").expect_err("refused");
        assert!(
            e.to_string().contains("the certificate of not a name!"),
            "{e}"
        );
    }
}
