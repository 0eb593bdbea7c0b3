//! Mutual TLS for the bench's bare probes (`bench mesh-probe --config`, `bench rpc-server
//! --config`): a CA, one key and certificate per probe address, and one config file per probe
//! holding only the TLS keys a daemon's config.cfg would hold for that node
//! ([`DomainFiles::config_lines`](crate::certs::DomainFiles::config_lines)). The probes load
//! it with the daemon's own config and TLS code, so the TLS floor differs from the daemons'
//! TLS figures only by what the daemons do, not by how TLS is set up.
//!
//! The certificates are made before a round's clock starts: they are the operator's
//! `openimex certs`, not part of forming a domain.

use std::path::{Path, PathBuf};

use crate::HarnessError;
use crate::certs;
use crate::node::render_config;
use crate::scratch::ScratchDir;

/// Validity of the probes' certificates, in days (they live for one round).
const DAYS: u32 = 1;

/// Certificates and config files for probes at `entries`, removed on drop.
#[derive(Debug)]
pub struct ProbeTls {
    dir: ScratchDir,
    configs: Vec<PathBuf>,
}

impl ProbeTls {
    /// A CA and one certificate per entry (an IP address, as a nodes-file entry; the same
    /// entry may appear twice, each gets its own key), and `probe<I>.cfg` per entry.
    pub fn make(entries: &[String]) -> Result<Self, HarnessError> {
        let dir = ScratchDir::new("bench-tls")?;
        let (files, _) = certs::write_domain(entries, &dir.path().join("certs"), DAYS, false)?;
        let mut configs = Vec::with_capacity(entries.len());
        for i in 0..entries.len() {
            // write_domain wrote one node per entry, so every index has its lines.
            let pairs = files.config_lines(i).unwrap_or_default();
            let path = dir.path().join(format!("probe{i}.cfg"));
            std::fs::write(&path, render_config(&pairs)).map_err(HarnessError::io(
                "write a probe's TLS config",
                &path,
                "check that the scratch root (TMPDIR) is writable",
            ))?;
            configs.push(path);
        }
        Ok(Self { dir, configs })
    }

    /// The config file of the probe at `entries[i]`.
    pub fn config(&self, i: usize) -> Option<&Path> {
        self.configs.get(i).map(PathBuf::as_path)
    }

    /// Where the files are.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_config_per_entry_naming_its_own_certificate() {
        let entries = ["127.0.0.1".to_owned(), "127.0.0.1".to_owned()];
        let tls = ProbeTls::make(&entries).expect("certificates");
        for i in 0..2 {
            let path = tls.config(i).expect("a config per entry");
            let text = std::fs::read_to_string(path).expect("readable");
            assert!(text.contains("IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS"), "{text}");
            assert!(text.contains(&format!("node{i}.pem")), "{text}");
        }
        assert!(tls.config(2).is_none());
        let dir = tls.dir().to_owned();
        drop(tls);
        assert!(!dir.exists(), "the files outlived their ProbeTls");
    }
}
