//! Settings the daemon cannot honour in this build, refused instead of ignored.
//!
//! Peer authentication and encryption (`IMEX_ENABLE_AUTH_ENCRYPTION=1`) is not built yet:
//! neither TLS nor GSSAPI. A daemon asked for it must not run the domain in plaintext with only
//! a warning, so it refuses to start, before binding anything, naming the file, the line, the
//! key and the fix. Parsing the file still succeeds (`ctl` reads the same file for the command
//! port), so the refusal is the daemon's call: [`Config::refuse_unbuilt_features`].

use super::{AuthMode, AuthSource, Config};
use crate::ConfigError;

impl Config {
    /// Fails when the config asks for something this build cannot do safely: today, peer
    /// authentication and encryption (`IMEX_ENABLE_AUTH_ENCRYPTION=1`; TLS and GSSAPI are not
    /// built yet). The daemon calls it before it binds or opens anything.
    pub fn refuse_unbuilt_features(&self) -> Result<(), ConfigError> {
        let Some((path, line)) = self.auth_enabled_at.clone() else {
            return Ok(());
        };
        let (mode, missing) = match self.imex_auth_encryption_mode {
            Some(AuthMode::GssAuthEncrypt) => ("GSS_AUTH_ENCRYPT", "GSSAPI (Kerberos)"),
            Some(AuthMode::GssAuthOnly) => ("GSS_AUTH_ONLY", "GSSAPI (Kerberos)"),
            Some(AuthMode::SslTls) | None => ("SSL_TLS", "TLS"),
        };
        let mut asked = format!("IMEX_AUTH_ENCRYPTION_MODE={mode}");
        if let Some(source) = self.imex_auth_source {
            asked.push_str(&format!(", IMEX_AUTH_SOURCE={source}"));
        }
        let keys = [
            ("IMEX_SERVER_KEY", &self.imex_server_key),
            ("IMEX_SERVER_CERT", &self.imex_server_cert),
            ("IMEX_CLIENT_KEY", &self.imex_client_key),
        ];
        for (key, value) in keys {
            if let Some(v) = value {
                let what = match self.imex_auth_source {
                    Some(AuthSource::File) | None => "file",
                    Some(AuthSource::EnvPath) | Some(AuthSource::EnvVal) => "variable",
                };
                asked.push_str(&format!(", {key} {what} {}", crate::error::Quoted(v)));
            }
        }
        Err(ConfigError::NotBuilt {
            path,
            line,
            key: "IMEX_ENABLE_AUTH_ENCRYPTION".to_owned(),
            value: "1".to_owned(),
            asked,
            missing,
        })
    }
}
