//! `openimex init --nodes HOST,HOST... --out DIR`: a working domain's files, secure from the
//! start — for each node a directory to copy to its `--install-dir` (default
//! `/etc/nvidia-imex`) holding `config.cfg` (NVIDIA's keys, mutual TLS on, the command service
//! on a root-only unix socket and no TCP port), `nodes_config.cfg`, the domain's `ca.pem` and
//! the node's own `node.pem` / `node.key` (0600); and the domain CA's key, `DIR/ca.key`, which
//! stays off the nodes (it signs new certificates: `openimex certs`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use openimex_certs::{self as certs, Ca};
use openimex_config::is_placeholder;

/// `openimex init` arguments.
#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// The nodes' addresses or DNS names in node-ID order, comma-separated (or repeated).
    #[arg(long, value_name = "HOST,...", value_delimiter = ',', required = true)]
    nodes: Vec<String>,
    /// Output directory: `ca.key` and one `node<ID>/` directory per node (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Where each node's directory will live on that node: the paths in its config.cfg. `{id}`
    /// in it becomes the node ID (several nodes on one host, as in tests).
    #[arg(long, value_name = "DIR", default_value = "/etc/nvidia-imex")]
    install_dir: String,
    /// Validity of the CA and the certificates, in days.
    #[arg(long, default_value_t = certs::DEFAULT_DAYS)]
    days: u32,
    /// Overwrite existing files.
    #[arg(long)]
    force: bool,
}

/// Files of one node's directory, by name, with their modes.
const NODE_FILES: [(&str, u32); 5] = [
    ("config.cfg", 0o644),
    ("nodes_config.cfg", 0o644),
    ("ca.pem", 0o644),
    ("node.pem", 0o644),
    ("node.key", 0o600),
];

/// Writes the files and says where each node's directory goes.
pub(crate) fn run(args: &InitArgs) -> Result<()> {
    let nodes: Vec<String> = args.nodes.iter().map(|n| n.trim().to_owned()).collect();
    check_nodes(&nodes)?;
    if args.days == 0 {
        bail!("--days 0 would make certificates that are never valid; pass a number of days >= 1");
    }
    let out = std::path::absolute(&args.out)
        .with_context(|| format!("cannot resolve --out {}", args.out.display()))?;
    let ca_key = out.join("ca.key");
    let dirs: Vec<PathBuf> = (0..nodes.len())
        .map(|id| out.join(format!("node{id}")))
        .collect();
    if !args.force {
        let existing = std::iter::once(ca_key.clone())
            .chain(dirs.iter().flat_map(|d| NODE_FILES.map(|(f, _)| d.join(f))))
            .find(|p| p.exists());
        if let Some(path) = existing {
            bail!(
                "{} exists; pass --force to overwrite the domain's files, or another --out",
                path.display()
            );
        }
    }
    let ca = Ca::new("openimex domain CA", args.days)?;
    let ca_pem = ca.pem();
    std::fs::create_dir_all(&out)
        .with_context(|| format!("cannot create --out {}", out.display()))?;
    certs::write_file(&ca_key, &ca_pem.key, 0o600)?;
    let nodes_file = nodes.join("\n") + "\n";
    for (id, entry) in nodes.iter().enumerate() {
        let dir = &dirs[id];
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let pem = ca.issue(entry)?;
        let install = args.install_dir.replace("{id}", &id.to_string());
        let texts = [
            config_text(id, entry, nodes.len(), Path::new(&install)),
            nodes_file.clone(),
            ca_pem.cert.clone(),
            pem.cert,
            pem.key,
        ];
        for ((name, mode), text) in NODE_FILES.iter().zip(texts) {
            certs::write_file(&dir.join(name), &text, *mode)?;
        }
        println!("node {id} ({entry}): copy {} to {install}", dir.display());
    }
    println!(
        "The domain CA's key is {}: keep it off the nodes (it signs certificates for new nodes: \
         openimex certs).",
        ca_key.display()
    );
    Ok(())
}

/// Every entry must be a real, distinct address or name: a certificate names it.
fn check_nodes(nodes: &[String]) -> Result<()> {
    for (id, entry) in nodes.iter().enumerate() {
        if entry.is_empty() {
            bail!("--nodes: entry {id} is empty; list each node's address or name once");
        }
        if is_placeholder(entry) {
            bail!(
                "--nodes: entry {id} is the placeholder {entry}, which no certificate can name; \
                 give every node's real address or name"
            );
        }
        if let Some(first) = nodes[..id].iter().position(|e| e == entry) {
            bail!("--nodes: {entry} is listed twice (nodes {first} and {id}); list each node once");
        }
    }
    Ok(())
}

/// Node `id`'s config.cfg, with its files under `install`.
fn config_text(id: usize, entry: &str, count: usize, install: &Path) -> String {
    let at = |name: &str| install.join(name).display().to_string();
    let mut text = format!(
        "# openimex init: node {id} ({entry}) of a {count}-node domain; NVIDIA's config keys.\n\
         # Every key not set here has NVIDIA's default (see the README's Configuration).\n"
    );
    let lines = [
        ("IMEX_NODE_CONFIG_FILE", at("nodes_config.cfg")),
        ("SERVER_PORT", "50000".to_owned()),
        ("LOG_LEVEL", "4".to_owned()),
        ("LOG_FILE_NAME", "/var/log/nvidia-imex.log".to_owned()),
        ("LOG_MAX_ROTATE_COUNT", "3".to_owned()),
        ("IMEX_WAIT_FOR_QUORUM", "RECOVERY".to_owned()),
        // Mutual TLS: each daemon proves its node entry with node.pem, signed by the domain CA.
        ("IMEX_ENABLE_AUTH_ENCRYPTION", "1".to_owned()),
        ("IMEX_AUTH_ENCRYPTION_MODE", "SSL_TLS".to_owned()),
        ("IMEX_AUTH_SOURCE", "FILE".to_owned()),
        ("IMEX_SERVER_KEY", at("node.key")),
        ("IMEX_SERVER_CERT", at("node.pem")),
        ("IMEX_SERVER_CERT_AUTH", at("ca.pem")),
        ("IMEX_CLIENT_KEY", at("node.key")),
        ("IMEX_CLIENT_CERT", at("node.pem")),
        ("IMEX_CLIENT_CERT_AUTH", at("ca.pem")),
        // The command service on a root-only unix socket (DRA's path); no TCP port.
        ("IMEX_CMD_ENABLED", "1".to_owned()),
        ("IMEX_CMD_UNIX_DOMAIN_PATH", at("imex_ctrl.sock")),
    ];
    for (key, value) in lines {
        let _ = writeln!(text, "{key}={value}");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_node_lists_are_refused_with_the_entry() {
        let list = |s: &[&str]| s.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let e = check_nodes(&list(&["10.0.0.1", "10.0.0.1"])).unwrap_err();
        assert!(
            e.to_string().contains("listed twice (nodes 0 and 1)"),
            "{e}"
        );
        let e = check_nodes(&list(&["10.0.0.1", "0.0.0.0"])).unwrap_err();
        assert!(e.to_string().contains("placeholder"), "{e}");
        let e = check_nodes(&list(&["10.0.0.1", ""])).unwrap_err();
        assert!(e.to_string().contains("entry 1 is empty"), "{e}");
        assert!(check_nodes(&list(&["10.0.0.1", "tray-2"])).is_ok());
    }

    #[test]
    fn the_config_turns_tls_on_with_the_installed_paths() {
        let text = config_text(2, "10.0.0.3", 4, Path::new("/etc/nvidia-imex"));
        let cfg = openimex_config::Config::parse(&text, Path::new("config.cfg")).expect("parses");
        assert!(cfg.notices().is_empty(), "{:?}", cfg.notices());
        assert!(cfg.imex_enable_auth_encryption);
        assert!(text.contains("IMEX_SERVER_KEY=/etc/nvidia-imex/node.key\n"));
        assert!(text.contains("IMEX_CMD_UNIX_DOMAIN_PATH=/etc/nvidia-imex/imex_ctrl.sock\n"));
        assert!(!text.contains("IMEX_CMD_PORT"), "no TCP command port");
    }
}
