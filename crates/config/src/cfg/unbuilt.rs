//! Settings the daemon cannot honour in this build, refused instead of ignored.
//!
//! GSSAPI (Kerberos) peer authentication (`IMEX_AUTH_ENCRYPTION_MODE=GSS_AUTH_ENCRYPT` or
//! `GSS_AUTH_ONLY` with `IMEX_ENABLE_AUTH_ENCRYPTION=1`) is not built. A daemon asked for it
//! must not run the domain in plaintext with only a warning, so it refuses to start, before
//! binding anything, naming the file, the line, the key and the fix. Parsing the file still
//! succeeds (`ctl` reads the same file for the command port), so the refusal is the daemon's
//! call: [`Config::refuse_unbuilt_features`]. `SSL_TLS` is built (module `tls`).

use super::{AuthMode, Config};
use crate::ConfigError;

impl Config {
    /// Fails when the config asks for something this build cannot do safely: today, GSSAPI
    /// peer authentication. The daemon calls it before it binds or opens anything.
    pub fn refuse_unbuilt_features(&self) -> Result<(), ConfigError> {
        let Some((path, line)) = self.auth_enabled_at.clone() else {
            return Ok(());
        };
        let mode = match self.imex_auth_encryption_mode {
            Some(AuthMode::GssAuthEncrypt) => "GSS_AUTH_ENCRYPT",
            Some(AuthMode::GssAuthOnly) => "GSS_AUTH_ONLY",
            Some(AuthMode::SslTls) | None => return Ok(()),
        };
        Err(ConfigError::NotBuilt {
            path,
            line,
            key: "IMEX_ENABLE_AUTH_ENCRYPTION".to_owned(),
            value: "1".to_owned(),
            asked: format!("IMEX_AUTH_ENCRYPTION_MODE={mode}"),
            missing: "GSSAPI (Kerberos)",
        })
    }
}
