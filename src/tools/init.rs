//! `openimex init --nodes HOST,HOST... --out DIR`: a working domain's files, secure from the
//! start — for each node a directory to copy to its `--install-dir` (default
//! `/etc/nvidia-imex`) holding `config.cfg` (NVIDIA's keys, mutual TLS on, the command service
//! on a root-only unix socket and no TCP port), `nodes_config.cfg`, the domain's `ca.pem` and
//! the node's own `node.pem` / `node.key` (0600); and the domain CA's key, `DIR/ca.key`, which
//! stays off the nodes (it signs new certificates: `openimex certs`).
//!
//! An `--install-dir` holding `{id}` means several nodes on one host: then each node's config
//! also names its own bind address (its `--nodes` entry, which must be an IP address) and keeps
//! its log, stats file and persist record under its own directory, so no two daemons share a
//! file, a socket or an address. [`init_domain`] is the same as a library call, with extra
//! keys per node (`openimex-lab local up` starts a simulated domain on it).

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;

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
    /// in it becomes the node ID and means several nodes on one host (as in tests): each node
    /// then binds its own address (the --nodes entries must be IP addresses, e.g. 127.1.0.1,
    /// 127.1.0.2, ...) and keeps its log, stats and persist record in its own directory.
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

/// The command socket's name in a node's directory.
const CMD_SOCKET: &str = "imex_ctrl.sock";

/// The longest unix socket path Linux accepts (`sun_path` is 108 bytes with the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// The `{id}` of `--install-dir`, replaced by each node's ID.
const ID: &str = "{id}";

/// A domain to write: what `openimex init` takes, as a library call.
#[derive(Debug, Clone)]
pub struct InitPlan {
    /// The nodes file's entries, in node-ID order.
    pub nodes: Vec<String>,
    /// The output directory: `ca.key` and `node<ID>/`.
    pub out: PathBuf,
    /// Where each node's directory lives (`{id}`: several nodes on one host).
    pub install_dir: String,
    /// Validity of the CA and the certificates, in days.
    pub days: u32,
    /// Overwrite existing files.
    pub force: bool,
    /// More `KEY=value` lines for every node's config.cfg, `{id}` in a value replaced by the
    /// node's ID. A key init writes itself takes this value in its place.
    pub extra: Vec<(String, String)>,
}

/// One node as written by [`init_domain`].
#[derive(Debug, Clone)]
pub struct InitNode {
    /// Its node ID (line in the nodes file).
    pub id: usize,
    /// Its nodes-file entry.
    pub entry: String,
    /// The directory its files were written to (`out/node<ID>`).
    pub dir: PathBuf,
    /// Where that directory is meant to live: the paths its config.cfg names.
    pub install: PathBuf,
}

impl InitNode {
    /// `install/config.cfg`: what `daemon -c` and `ctl -c` take once installed.
    pub fn config(&self) -> PathBuf {
        self.install.join("config.cfg")
    }
    /// `install/imex_ctrl.sock`: the command service's unix socket.
    pub fn cmd_socket(&self) -> PathBuf {
        self.install.join(CMD_SOCKET)
    }
    /// The log file: `install/imex.log` on one host, else NVIDIA's `/var/log/nvidia-imex.log`.
    pub fn log_file(&self, one_host: bool) -> PathBuf {
        if one_host {
            self.install.join("imex.log")
        } else {
            PathBuf::from("/var/log/nvidia-imex.log")
        }
    }
}

/// True when `install_dir` holds `{id}`: several nodes on one host.
pub fn is_one_host(install_dir: &str) -> bool {
    install_dir.contains(ID)
}

/// Writes the files and says where each node's directory goes.
pub(crate) fn run(args: &InitArgs) -> Result<()> {
    let plan = InitPlan {
        nodes: args.nodes.clone(),
        out: args.out.clone(),
        install_dir: args.install_dir.clone(),
        days: args.days,
        force: args.force,
        extra: Vec::new(),
    };
    let nodes = init_domain(&plan)?;
    for node in &nodes {
        let (id, entry) = (node.id, &node.entry);
        if node.dir == node.install {
            println!("node {id} ({entry}): {} (in place)", node.dir.display());
        } else {
            println!(
                "node {id} ({entry}): copy {} to {}",
                node.dir.display(),
                node.install.display()
            );
        }
    }
    let out = std::path::absolute(&args.out).unwrap_or_else(|_| args.out.clone());
    println!(
        "The domain CA's key is {}: keep it off the nodes (it signs certificates for new nodes: \
         openimex certs).",
        out.join("ca.key").display()
    );
    if is_one_host(&args.install_dir) {
        println!(
            "Several nodes on one host: each binds its own address and keeps its log, stats, \
             persist record and command socket in its own directory. Each daemon opens the GPU \
             driver under OPENIMEX_DRIVER_ROOT (the environment variable, or that key in its \
             config.cfg; default /): give each its own, e.g. a simulated driver's --node-dir \
             (`openimex-lab local up` starts such a domain in one command). Start node N with \
             `openimex daemon -c <its directory>/config.cfg`."
        );
    }
    Ok(())
}

/// Writes `ca.key` and every node's directory for `plan`; returns the nodes in ID order.
/// Checks everything (entries, paths, existing files) before writing anything.
pub fn init_domain(plan: &InitPlan) -> Result<Vec<InitNode>> {
    let entries: Vec<String> = plan.nodes.iter().map(|n| n.trim().to_owned()).collect();
    check_nodes(&entries)?;
    if plan.days == 0 {
        bail!("--days 0 would make certificates that are never valid; pass a number of days >= 1");
    }
    let one_host = is_one_host(&plan.install_dir);
    if one_host {
        check_one_host(&entries)?;
    }
    let out = std::path::absolute(&plan.out)
        .with_context(|| format!("cannot resolve --out {}", plan.out.display()))?;
    let ca_key = out.join("ca.key");
    let nodes: Vec<InitNode> = entries
        .iter()
        .enumerate()
        .map(|(id, entry)| {
            let install = plan.install_dir.replace(ID, &id.to_string());
            InitNode {
                id,
                entry: entry.clone(),
                dir: out.join(format!("node{id}")),
                install: PathBuf::from(install),
            }
        })
        .collect();
    for node in &nodes {
        let socket = node.cmd_socket();
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            bail!(
                "node {}'s command socket {} is longer than the {MAX_SOCKET_PATH} bytes Linux \
                 allows a unix socket path; pass a shorter --install-dir",
                node.id,
                socket.display()
            );
        }
    }
    if !plan.force {
        let existing = std::iter::once(ca_key.clone())
            .chain(
                nodes
                    .iter()
                    .flat_map(|n| NODE_FILES.map(|(f, _)| n.dir.join(f))),
            )
            .find(|p| p.exists());
        if let Some(path) = existing {
            bail!(
                "{} exists; pass --force to overwrite the domain's files, or another --out",
                path.display()
            );
        }
    }
    let ca = Ca::new("openimex domain CA", plan.days)?;
    let ca_pem = ca.pem();
    std::fs::create_dir_all(&out)
        .with_context(|| format!("cannot create --out {}", out.display()))?;
    certs::write_file(&ca_key, &ca_pem.key, 0o600)?;
    let nodes_file = entries.join("\n") + "\n";
    for node in &nodes {
        let dir = &node.dir;
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let pem = ca.issue(&node.entry)?;
        let mut lines = config_lines(node, one_host);
        for (key, value) in &plan.extra {
            let value = value.replace(ID, &node.id.to_string());
            match lines.iter_mut().find(|(k, _)| k == key) {
                Some(slot) => slot.1 = value,
                None => lines.push((key.clone(), value)),
            }
        }
        let texts = [
            config_text(node, entries.len(), &lines),
            nodes_file.clone(),
            ca_pem.cert.clone(),
            pem.cert,
            pem.key,
        ];
        for ((name, mode), text) in NODE_FILES.iter().zip(texts) {
            certs::write_file(&dir.join(name), &text, *mode)?;
        }
    }
    Ok(nodes)
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

/// On one host every node binds its own address, so every entry must be one.
fn check_one_host(nodes: &[String]) -> Result<()> {
    for (id, entry) in nodes.iter().enumerate() {
        if entry.parse::<IpAddr>().is_err() {
            bail!(
                "--nodes: entry {id} is {entry}, not an IP address, but --install-dir holds \
                 {ID} (several nodes on one host), where each node's BIND_INTERFACE_IP must be \
                 its own address; list the nodes by address (e.g. 127.1.0.1,127.1.0.2), or \
                 drop {ID} from --install-dir for nodes on separate hosts"
            );
        }
    }
    Ok(())
}

/// Node `node`'s keys, in the order they are written: NVIDIA's keys with the node's files,
/// and on one host its own address, log, stats file and persist record.
fn config_lines(node: &InitNode, one_host: bool) -> Vec<(String, String)> {
    let at = |name: &str| node.install.join(name).display().to_string();
    let mut lines = vec![
        ("IMEX_NODE_CONFIG_FILE", at("nodes_config.cfg")),
        ("SERVER_PORT", "50000".to_owned()),
        ("LOG_LEVEL", "4".to_owned()),
        (
            "LOG_FILE_NAME",
            node.log_file(one_host).display().to_string(),
        ),
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
        ("IMEX_CMD_UNIX_DOMAIN_PATH", at(CMD_SOCKET)),
    ];
    if one_host {
        // What would collide between daemons on one host: the peer listener's address (empty,
        // every daemon would take the first nodes-file entry of this host), the stats file and
        // the persist record (the defaults are one per machine, under /var).
        lines.extend([
            ("BIND_INTERFACE_IP", node.entry.clone()),
            ("STATS_FILE_NAME", at("imex-stats.log")),
            ("OPENIMEX_PERSIST_FILE", at("persist.dat")),
        ]);
    }
    lines.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// Node `node`'s config.cfg from its `lines`.
fn config_text(node: &InitNode, count: usize, lines: &[(String, String)]) -> String {
    let (id, entry) = (node.id, &node.entry);
    let mut text = format!(
        "# openimex init: node {id} ({entry}) of a {count}-node domain; NVIDIA's config keys.\n\
         # Every key not set here has NVIDIA's default (docs/operator/configuration.md in openimex's repository).\n"
    );
    for (key, value) in lines {
        let _ = writeln!(text, "{key}={value}");
    }
    text
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn list(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| (*s).to_owned()).collect()
    }

    fn node(id: usize, entry: &str, install: &str) -> InitNode {
        InitNode {
            id,
            entry: entry.to_owned(),
            dir: PathBuf::from("/out").join(format!("node{id}")),
            install: PathBuf::from(install),
        }
    }

    fn parse(text: &str) -> openimex_config::Config {
        openimex_config::Config::parse(text, Path::new("config.cfg")).expect("parses")
    }

    #[test]
    fn bad_node_lists_are_refused_with_the_entry() {
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
        let n = node(2, "10.0.0.3", "/etc/nvidia-imex");
        let text = config_text(&n, 4, &config_lines(&n, false));
        let cfg = parse(&text);
        assert!(cfg.notices().is_empty(), "{:?}", cfg.notices());
        assert!(cfg.imex_enable_auth_encryption);
        assert!(text.contains("IMEX_SERVER_KEY=/etc/nvidia-imex/node.key\n"));
        assert!(text.contains("IMEX_CMD_UNIX_DOMAIN_PATH=/etc/nvidia-imex/imex_ctrl.sock\n"));
        assert!(!text.contains("IMEX_CMD_PORT"), "no TCP command port");
        assert!(
            !text.contains("BIND_INTERFACE_IP"),
            "one node per host: picked"
        );
    }

    #[test]
    fn nodes_on_one_host_share_no_address_file_or_socket() {
        assert!(is_one_host("/tmp/d/node{id}"));
        assert!(!is_one_host("/etc/nvidia-imex"));
        let configs: Vec<openimex_config::Config> = ["127.1.0.1", "127.1.0.2", "127.1.0.3"]
            .iter()
            .enumerate()
            .map(|(id, ip)| {
                let n = node(id, ip, &format!("/tmp/d/node{id}"));
                let cfg = parse(&config_text(&n, 3, &config_lines(&n, true)));
                assert!(cfg.notices().is_empty(), "{:?}", cfg.notices());
                assert_eq!(cfg.bind_interface_ip, ip.parse().ok());
                cfg
            })
            .collect();
        for (i, a) in configs.iter().enumerate() {
            for b in &configs[i + 1..] {
                assert_ne!(a.bind_interface_ip, b.bind_interface_ip);
                assert_ne!(a.log_file_name, b.log_file_name);
                assert_ne!(a.stats_file_name, b.stats_file_name);
                assert_ne!(a.persist_file, b.persist_file);
                assert_ne!(a.imex_cmd_unix_domain_path, b.imex_cmd_unix_domain_path);
            }
        }
        let e = check_one_host(&list(&["127.1.0.1", "tray-2"])).unwrap_err();
        assert!(
            e.to_string()
                .contains("entry 1 is tray-2, not an IP address"),
            "{e}"
        );
    }

    #[test]
    fn extra_keys_replace_inits_in_place_and_take_the_node_id() {
        let dir = std::env::temp_dir().join(format!("openimex-init-test-{}", std::process::id()));
        let plan = InitPlan {
            nodes: list(&["127.1.0.1", "127.1.0.2"]),
            out: dir.clone(),
            install_dir: dir.join("node{id}").display().to_string(),
            days: 1,
            force: true,
            extra: vec![
                ("SERVER_PORT".into(), "50100".into()),
                ("OPENIMEX_DRIVER_ROOT".into(), "/sim/node{id}".into()),
            ],
        };
        let nodes = init_domain(&plan).expect("write");
        let text = std::fs::read_to_string(nodes[1].dir.join("config.cfg")).expect("read");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(text.matches("SERVER_PORT=").count(), 1, "{text}");
        assert!(text.contains("SERVER_PORT=50100\n"), "{text}");
        assert!(text.contains("OPENIMEX_DRIVER_ROOT=/sim/node1\n"), "{text}");
        assert_eq!(nodes[1].install, dir.join("node1"));
        assert_eq!(nodes[1].dir, nodes[1].install, "installed in place");
    }
}
