//! A bad config never half-starts a daemon: `openimex daemon -c FILE` exits non-zero at once,
//! before binding anything, and its message names the file and line to edit and how to fix
//! it. Each case runs on its own free loopback address, which must still be free afterwards.

use std::fs;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;

use openimex_harness::process::run_with_timeout;
use openimex_harness::{AddrBlock, ScratchDir};

use crate::common::{COMMAND, binary, text};

const SERVER_PORT: u16 = 50000;
const CMD_PORT: u16 = 50005;

/// One malformed configuration.
struct Case {
    name: &'static str,
    /// Keys replacing (in place) or added to the valid base config.
    overrides: Vec<(&'static str, String)>,
    /// Nodes file contents, with `{ip}` / `{peer}` standing for this node's address and the
    /// next one, `{foreign0}` / `{foreign1}` for addresses this host does not have; `None`:
    /// the valid `{ip}\n{peer}\n`.
    nodes: Option<String>,
    /// What stderr must contain, computed from the written files.
    must_contain: fn(&Written) -> Vec<String>,
    /// At least one of these (case-insensitive) must appear: the hint.
    hint_any: &'static [&'static str],
}

/// The files of one case.
struct Written {
    cfg: PathBuf,
    nodes: PathBuf,
    ip: Ipv4Addr,
    /// Two documentation addresses that are not addresses of this host.
    foreign: [Ipv4Addr; 2],
    /// Config keys in file order; key `k` at index `i` is on line `i + 2` (a comment first).
    keys: Vec<&'static str>,
}

impl Written {
    /// `<config path>:<line of key>`.
    fn at(&self, key: &str) -> String {
        let i = self
            .keys
            .iter()
            .position(|k| *k == key)
            .expect("key in config");
        format!("{}:{}", self.cfg.display(), i + 2)
    }
    fn nodes_at(&self, line: usize) -> String {
        format!("{}:{line}", self.nodes.display())
    }
}

/// Two addresses from the documentation ranges (RFC 5737) that this host does not have.
/// Probed, not assumed: some sandboxes give their own interface a TEST-NET address (e.g.
/// 192.0.2.2 on eth0).
fn foreign_addrs() -> [Ipv4Addr; 2] {
    let candidates = [
        Ipv4Addr::new(198, 51, 100, 1),
        Ipv4Addr::new(198, 51, 100, 2),
        Ipv4Addr::new(203, 0, 113, 1),
        Ipv4Addr::new(203, 0, 113, 2),
        Ipv4Addr::new(192, 0, 2, 201),
        Ipv4Addr::new(192, 0, 2, 202),
    ];
    let foreign: Vec<Ipv4Addr> = candidates
        .into_iter()
        .filter(|ip| TcpListener::bind((*ip, 0)).is_err())
        .collect();
    assert!(
        foreign.len() >= 2,
        "every documentation address is local here?"
    );
    [foreign[0], foreign[1]]
}

/// Writes the case's files into `dir`.
fn write(case: &Case, dir: &Path, ip: Ipv4Addr) -> Written {
    let cfg = dir.join("config.cfg");
    let nodes = dir.join("nodes_config.cfg");
    let foreign = foreign_addrs();
    let o = ip.octets();
    let peer = Ipv4Addr::new(o[0], o[1], o[2], o[3] + 1);
    let mut pairs: Vec<(&'static str, String)> = vec![
        ("DAEMONIZE", "0".into()),
        ("LOG_LEVEL", "4".into()),
        ("LOG_FILE_NAME", dir.join("imex.log").display().to_string()),
        ("BIND_INTERFACE_IP", ip.to_string()),
        ("SERVER_PORT", SERVER_PORT.to_string()),
        ("IMEX_NODE_CONFIG_FILE", nodes.display().to_string()),
        ("IMEX_WAIT_FOR_QUORUM", "NONE".into()),
        ("IMEX_CMD_ENABLED", "1".into()),
        ("IMEX_CMD_BIND_INTERFACE_IP", ip.to_string()),
        ("IMEX_CMD_PORT", CMD_PORT.to_string()),
        (
            "IMEX_CMD_UNIX_DOMAIN_PATH",
            dir.join("imex.sock").display().to_string(),
        ),
        ("OPENIMEX_DRIVER", "nogpu".into()),
    ];
    for (k, v) in &case.overrides {
        match pairs.iter_mut().find(|(pk, _)| pk == k) {
            Some(slot) => slot.1 = v.clone(),
            None => pairs.push((k, v.clone())),
        }
    }
    let mut body = format!("# malformed-config test: {}\n", case.name);
    for (k, v) in &pairs {
        body.push_str(&format!("{k}={v}\n"));
    }
    fs::write(&cfg, body).expect("write config");
    let node_text = match &case.nodes {
        Some(t) => t
            .replace("{ip}", &ip.to_string())
            .replace("{peer}", &peer.to_string())
            .replace("{foreign0}", &foreign[0].to_string())
            .replace("{foreign1}", &foreign[1].to_string()),
        None => format!("{ip}\n{peer}\n"),
    };
    fs::write(&nodes, node_text).expect("write nodes file");
    Written {
        cfg,
        nodes,
        ip,
        foreign,
        keys: pairs.iter().map(|(k, _)| *k).collect(),
    }
}

/// Runs one case; returns what was wrong, if anything.
fn check(case: &Case) -> Vec<String> {
    let dir = ScratchDir::new("cfgerr").expect("scratch dir");
    let block = AddrBlock::allocate(1, &[SERVER_PORT, CMD_PORT]).expect("free address");
    let w = write(case, dir.path(), block.ip(0));
    let mut problems = Vec::new();
    let mut cmd = Command::new(binary());
    cmd.arg("daemon").arg("-c").arg(&w.cfg);
    let out = match run_with_timeout(&mut cmd, COMMAND) {
        Ok(out) => out,
        Err(e) => return vec![format!("did not exit at once: {e}")],
    };
    let stderr = text(&out.stderr);
    if out.status.success() {
        problems.push(format!("exited successfully ({:?})", out.status));
    }
    if stderr.contains("panicked") {
        problems.push("panicked".into());
    }
    for needle in (case.must_contain)(&w) {
        if !stderr.contains(&needle) {
            problems.push(format!("stderr lacks {needle:?}"));
        }
    }
    let lower = stderr.to_lowercase();
    if !case
        .hint_any
        .iter()
        .any(|h| lower.contains(&h.to_lowercase()))
    {
        problems.push(format!("stderr has no hint (one of {:?})", case.hint_any));
    }
    for port in [SERVER_PORT, CMD_PORT] {
        if let Err(e) = TcpListener::bind((w.ip, port)) {
            problems.push(format!("{}:{port} was left bound ({e})", w.ip));
        }
    }
    if dir.path().join("imex.sock").exists() {
        problems.push("the command socket was created".into());
    }
    if !problems.is_empty() {
        problems.push(format!("stderr was:\n{stderr}"));
    }
    problems
}

#[test]
fn malformed_configs_fail_with_file_line() {
    let cases = [
        Case {
            name: "unknown value",
            overrides: vec![("IMEX_WAIT_FOR_QUORUM", "SOMETIMES".into())],
            nodes: None,
            must_contain: |w| vec![w.at("IMEX_WAIT_FOR_QUORUM"), "IMEX_WAIT_FOR_QUORUM".into()],
            hint_any: &["expected"],
        },
        Case {
            name: "bad port",
            overrides: vec![("SERVER_PORT", "70000".into())],
            nodes: None,
            must_contain: |w| vec![w.at("SERVER_PORT"), "SERVER_PORT".into()],
            hint_any: &["expected"],
        },
        Case {
            name: "bad metrics address",
            overrides: vec![("OPENIMEX_METRICS_ADDR", "localhost:9464".into())],
            nodes: None,
            must_contain: |w| {
                vec![
                    w.at("OPENIMEX_METRICS_ADDR"),
                    "OPENIMEX_METRICS_ADDR".into(),
                ]
            },
            hint_any: &["127.0.0.1:9464"],
        },
        Case {
            name: "missing node file",
            overrides: vec![(
                "IMEX_NODE_CONFIG_FILE",
                "/nonexistent/openimex-test/nodes_config.cfg".into(),
            )],
            nodes: None,
            // The missing file, and the config line that names it.
            must_contain: |w| {
                vec![
                    "/nonexistent/openimex-test/nodes_config.cfg".into(),
                    w.at("IMEX_NODE_CONFIG_FILE"),
                ]
            },
            hint_any: &["IMEX_NODE_CONFIG_FILE"],
        },
        Case {
            name: "duplicate node",
            overrides: vec![],
            nodes: Some("{ip}\n{peer}\n{peer}\n".into()),
            // The duplicate is the third line.
            must_contain: |w| vec![w.nodes_at(3)],
            hint_any: &["once", "duplicate", "twice", "remove"],
        },
        Case {
            name: "no local address",
            overrides: vec![("BIND_INTERFACE_IP", String::new())],
            nodes: Some("{foreign0}\n{foreign1}\n".into()),
            // No single line is wrong: the message names the nodes file and what was tried.
            must_contain: |w| {
                let mut v = vec![w.nodes.display().to_string()];
                v.extend(w.foreign.iter().map(ToString::to_string));
                v
            },
            hint_any: &["set BIND_INTERFACE_IP"],
        },
    ];
    let mut report = String::new();
    for case in &cases {
        let problems = check(case);
        if !problems.is_empty() {
            report.push_str(&format!(
                "\n== {}:\n  {}\n",
                case.name,
                problems.join("\n  ")
            ));
        }
    }
    assert!(
        report.is_empty(),
        "malformed configs handled badly:{report}"
    );
}

/// Fail closed on auth (issue 7, item 5; issue 10): `IMEX_ENABLE_AUTH_ENCRYPTION=1` with a
/// key file that does not exist used to bring the daemon up, and the domain UP, in plaintext
/// with only a warning. With TLS built, the daemon reads the six files before binding anything
/// and refuses to start on a missing one, naming the file and line of its key, the key, the
/// path and how to make the files.
#[test]
fn auth_with_a_missing_key_file_refuses_to_start() {
    let key_file = "/nonexistent/openimex-test/server.key";
    let case = Case {
        name: "auth with a missing key file",
        overrides: vec![
            ("IMEX_ENABLE_AUTH_ENCRYPTION", "1".into()),
            ("IMEX_AUTH_ENCRYPTION_MODE", "SSL_TLS".into()),
            ("IMEX_AUTH_SOURCE", "FILE".into()),
            ("IMEX_SERVER_KEY", key_file.into()),
            (
                "IMEX_SERVER_CERT",
                "/nonexistent/openimex-test/server.pem".into(),
            ),
            (
                "IMEX_SERVER_CERT_AUTH",
                "/nonexistent/openimex-test/ca.pem".into(),
            ),
            ("IMEX_CLIENT_KEY", key_file.into()),
            (
                "IMEX_CLIENT_CERT",
                "/nonexistent/openimex-test/server.pem".into(),
            ),
            (
                "IMEX_CLIENT_CERT_AUTH",
                "/nonexistent/openimex-test/ca.pem".into(),
            ),
        ],
        nodes: None,
        must_contain: |w| {
            vec![
                format!("{}: IMEX_SERVER_KEY=", w.at("IMEX_SERVER_KEY")),
                "/nonexistent/openimex-test/server.key does not exist".into(),
            ]
        },
        hint_any: &["openimex certs"],
    };
    assert!(!std::path::Path::new(key_file).exists());
    let problems = check(&case);
    assert!(
        problems.is_empty(),
        "auth with a missing key file handled badly:\n  {}",
        problems.join("\n  ")
    );
}
