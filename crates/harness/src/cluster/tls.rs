//! Test clusters with mutual TLS ([`ClusterSpec::with_tls`](super::ClusterSpec::with_tls)):
//! the certificates made for them, and rotation (new certificates written over the files,
//! from the same CA or from a new one), after which a test decides whom to send SIGUSR1.

use std::path::Path;

use super::Cluster;
use crate::HarnessError;
use openimex_certs::{self as certs, Ca, CertsError, DomainFiles};

/// Validity of test certificates, in days.
const DAYS: u32 = 30;

/// A CA and one certificate per nodes-file line in `<dir>/certs`.
pub(super) fn make(lines: &[String], dir: &Path) -> Result<(DomainFiles, Ca), HarnessError> {
    Ok(certs::write_domain(lines, &dir.join("certs"), DAYS, false)?)
}

fn tls_off() -> HarnessError {
    HarnessError::Certs(CertsError::Make {
        what: "new certificates for this cluster".to_owned(),
        cause: "it was started without TLS".to_owned(),
        hint: "build the ClusterSpec with .with_tls()",
    })
}

impl Cluster {
    /// The certificate files, when the cluster has TLS.
    pub fn tls_files(&self) -> Option<&DomainFiles> {
        self.tls.as_ref().map(|(files, _)| files)
    }

    /// The CA that signed the current certificates, when the cluster has TLS.
    pub fn tls_ca(&self) -> Option<&Ca> {
        self.tls.as_ref().map(|(_, ca)| ca)
    }

    /// Writes new keys and certificates over every node's files: from the same CA, or with
    /// `new_ca` from a new CA that is also written over `ca.pem`. Signals nobody.
    pub fn rotate_tls(&mut self, new_ca: bool) -> Result<(), HarnessError> {
        let (files, ca) = self.tls.as_mut().ok_or_else(tls_off)?;
        if new_ca {
            *ca = Ca::new("openimex test CA (rotated)", DAYS)?;
            certs::write_file(&files.ca_cert, &ca.pem().cert, 0o644)?;
            certs::write_file(&files.ca_key, &ca.pem().key, 0o600)?;
        }
        for node in &files.nodes {
            certs::write_node(ca, node)?;
        }
        Ok(())
    }
}
