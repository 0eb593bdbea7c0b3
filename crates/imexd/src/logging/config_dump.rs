//! The configuration dump the daemon logs at start, in NVIDIA's words (imex-guide §9:
//! `Logging level = 4`, `Max Log file size = 1024 (MBs)`, `Use Syslog file = 0`, …), with
//! the values in effect, then a few lines of openimex's own.

use std::path::Path;

use openimex_config::Config;

/// The lines to log at INFO, in order. `config_path` is the file the config was read from.
pub fn config_dump(cfg: &Config, config_path: &Path) -> Vec<String> {
    let path = |p: Option<&Path>| p.map(|p| p.display().to_string()).unwrap_or_default();
    vec![
        format!(
            "IMEX version {} (openimex) is running with the following configuration options",
            env!("CARGO_PKG_VERSION")
        ),
        format!("Logging level = {}", cfg.log_level),
        format!(
            "Logging file name/path = {}",
            path(cfg.log_file_name.as_deref())
        ),
        format!("Append to log file = {}", u8::from(cfg.log_append_to_log)),
        format!("Max Log file size = {} (MBs)", cfg.log_file_max_size_mb),
        format!("Use Syslog file = {}", u8::from(cfg.log_use_syslog)),
        format!(
            "IMEX Library communication bind interface = {}",
            cfg.bind_interface_ip
                .map(|ip| ip.to_string())
                .unwrap_or_default()
        ),
        format!("IMEX library communication bind port = {}", cfg.server_port),
        format!("Max rotated log files = {}", cfg.log_max_rotate_count),
        format!("Config file = {}", config_path.display()),
        format!("Node config file = {}", cfg.imex_node_config_file.display()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_nvidia_lines_with_the_values_in_effect() {
        let lines = config_dump(&Config::default(), Path::new("/etc/nvidia-imex/config.cfg"));
        for want in [
            "Logging level = 4",
            "Logging file name/path = /var/log/nvidia-imex.log",
            "Append to log file = 1",
            "Max Log file size = 1024 (MBs)",
            "Use Syslog file = 0",
            "IMEX Library communication bind interface = ",
            "IMEX library communication bind port = 50000",
        ] {
            assert!(lines.iter().any(|l| l == want), "{want} in {lines:#?}");
        }
        let cfg = Config::parse(
            "LOG_FILE_MAX_SIZE=7\nLOG_USE_SYSLOG=1\nLOG_FILE_NAME=\nLOG_MAX_ROTATE_COUNT=2\n\
             BIND_INTERFACE_IP=10.0.0.5\n",
            Path::new("c.cfg"),
        )
        .expect("parse");
        let lines = config_dump(&cfg, Path::new("c.cfg"));
        for want in [
            "Max Log file size = 7 (MBs)",
            "Use Syslog file = 1",
            "Logging file name/path = ",
            "Max rotated log files = 2",
            "IMEX Library communication bind interface = 10.0.0.5",
        ] {
            assert!(lines.iter().any(|l| l == want), "{want} in {lines:#?}");
        }
    }
}
