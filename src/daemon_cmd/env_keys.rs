//! `OPENIMEX_*` config keys set in the environment: they read like environment variables, but
//! the daemon takes them only from its config.cfg, so such a variable changes nothing. This
//! module finds them, so that the daemon warns at start (on stderr and in its log) with the
//! file to put the key in. The one key the daemon does read from the environment,
//! `OPENIMEX_DRIVER_ROOT` (when the config does not set it), is left alone.

use std::ffi::OsString;
use std::path::Path;

use openimex_config::Config;
use openimex_driver::nvidia::files::DRIVER_ROOT_ENV;

/// The longest value quoted in a warning.
const MAX_VALUE: usize = 120;

/// One warning per `OPENIMEX_*` variable of this process's environment that is a config key
/// the daemon ignores there; `cfg` is the config read from `config_path`.
pub(super) fn warnings(cfg: &Config, config_path: &Path) -> Vec<String> {
    ignored(std::env::vars_os(), cfg.driver_root.is_some(), config_path)
}

/// The warnings for `vars`; `config_sets_driver_root`: the config has `OPENIMEX_DRIVER_ROOT`,
/// whose value then wins over the environment's.
fn ignored(
    vars: impl Iterator<Item = (OsString, OsString)>,
    config_sets_driver_root: bool,
    config_path: &Path,
) -> Vec<String> {
    let config = config_path.display();
    // The parser's own table: a name is a config.cfg key when it has it.
    let keys = openimex_config::reference::parser_keys();
    let mut out: Vec<String> = vars
        .filter_map(|(name, value)| {
            let name = name.into_string().ok()?;
            if !name.starts_with("OPENIMEX_") || !keys.contains(&name.as_str()) {
                return None;
            }
            let value = clip(&value.to_string_lossy());
            if name == DRIVER_ROOT_ENV {
                // Read from the environment only when the config leaves it out.
                return config_sets_driver_root.then(|| {
                    format!(
                        "{name}={value} is set in the environment and also in {config}; the \
                         config file's value is used; unset the variable or remove the key \
                         from the config to stop this warning"
                    )
                });
            }
            Some(format!(
                "{name}={value} is set in the environment, but {name} is a config.cfg key, not \
                 an environment variable: the daemon ignores it there; put the line \
                 {name}={value} in {config} (and unset the variable)"
            ))
        })
        .collect();
    out.sort();
    out
}

/// `value`, cut to [`MAX_VALUE`] characters.
fn clip(value: &str) -> String {
    match value.char_indices().nth(MAX_VALUE) {
        Some((i, _)) => format!("{}...", &value[..i]),
        None => value.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Iterator<Item = (OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn config_keys_in_the_environment_are_named_with_the_file() {
        let w = ignored(
            vars(&[
                ("OPENIMEX_PEER_TIMEOUT_MS", "3000"),
                ("OPENIMEX_PERSIST_FILE", "/tmp/p.dat"),
                // Not config keys: other tools' variables, a lower-case name, the driver root.
                ("OPENIMEX_REQUIRE_SLURM", "1"),
                ("openimex_peer_timeout_ms", "1"),
                ("OPENIMEX_DRIVER_ROOT", "/sim/node0"),
                ("PATH", "/usr/bin"),
            ]),
            false,
            Path::new("/etc/nvidia-imex/config.cfg"),
        );
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].starts_with("OPENIMEX_PEER_TIMEOUT_MS=3000 is set in the environment")
                && w[0].contains(
                    "put the line OPENIMEX_PEER_TIMEOUT_MS=3000 in /etc/nvidia-imex/config.cfg"
                ),
            "{w:?}"
        );
        assert!(
            w[1].starts_with("OPENIMEX_PERSIST_FILE=/tmp/p.dat"),
            "{w:?}"
        );
    }

    #[test]
    fn the_driver_root_is_warned_about_only_when_the_config_sets_it() {
        let env = [("OPENIMEX_DRIVER_ROOT", "/sim/node0")];
        assert!(ignored(vars(&env), false, Path::new("c.cfg")).is_empty());
        let w = ignored(vars(&env), true, Path::new("c.cfg"));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("also in c.cfg"), "{w:?}");
    }

    #[test]
    fn long_values_are_clipped() {
        let long = "x".repeat(500);
        let w = ignored(
            vars(&[("OPENIMEX_HOSTNAME", &long)]),
            false,
            Path::new("c.cfg"),
        );
        assert!(!w[0].contains(&long), "{}", w[0]);
        assert!(
            w[0].contains(&format!("{}...", "x".repeat(MAX_VALUE))),
            "{}",
            w[0]
        );
    }
}
