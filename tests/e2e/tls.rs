//! Mutual TLS between daemons (issue 10): a TLS domain forms and serves imports; a daemon
//! with a certificate of another CA, or with a certificate that does not name its nodes-file
//! entry, is refused with a named reason in `ctl --links -j` and the log, and counted, while
//! the others stay UP among themselves; new certificates (same CA, then a new CA) take effect
//! on SIGUSR1 with live imports intact.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use openimex_harness::certs::{self, Ca};
use openimex_harness::{Cluster, GpuSpec, LinksView, Signal};

use crate::apps::*;
use crate::common::{FORM, NOTICE, log, spec, wait_log_line};

/// How many connections node `node` (as `v` shows it) refused for `reason`.
fn refused(v: &LinksView, node: usize, reason: &str) -> u64 {
    crate::forged::refused(&v.raw, node, reason)
}

/// Every link among `nodes` is CONNECTED, as node `i` sees them.
fn connected_among(v: &LinksView, nodes: &[u32]) -> bool {
    nodes.iter().all(|&a| {
        nodes
            .iter()
            .filter(|&&b| b != a)
            .all(|&b| v.link(a, b).is_some_and(|l| l.status == "CONNECTED"))
    })
}

/// Writes `pem` as node `i`'s own key and certificate (`bad.key`, `bad.pem` in its directory)
/// and points both sides of its config at them; takes effect at its next start.
fn give_node(cluster: &mut Cluster, i: usize, pem: &certs::Pem) {
    let dir = cluster.node(i).dir().to_path_buf();
    let (key, cert) = (dir.join("bad.key"), dir.join("bad.pem"));
    certs::write_file(&key, &pem.key, 0o600).expect("write key");
    certs::write_file(&cert, &pem.cert, 0o644).expect("write cert");
    let (key, cert) = (key.display().to_string(), cert.display().to_string());
    for (k, v) in [
        ("IMEX_SERVER_KEY", &key),
        ("IMEX_SERVER_CERT", &cert),
        ("IMEX_CLIENT_KEY", &key),
        ("IMEX_CLIENT_CERT", &cert),
    ] {
        cluster.set_node_config(i, k, v).expect("node config");
    }
}

/// Starts every node of a prepared cluster.
fn start_all(cluster: &mut Cluster) {
    for i in 0..cluster.len() {
        cluster.start_node(i).expect("start node");
    }
}

#[test]
fn a_tls_domain_of_four_forms_and_serves_imports() {
    let cluster = gpu_cluster_from(spec(4).with_gpus(GpuSpec::default()).with_tls());
    let cfg = std::fs::read_to_string(cluster.node(0).dir().join("config.cfg")).expect("cfg");
    assert!(cfg.contains("IMEX_ENABLE_AUTH_ENCRYPTION=1"), "{cfg}");

    // The peer port speaks TLS only: a plaintext HTTP/2 client is closed and counted.
    let node = cluster.node(1);
    let peer = SocketAddr::from((node.ip(), node.server_port()));
    let mut plain = TcpStream::connect_timeout(&peer, NOTICE).expect("reach the peer port");
    plain.set_read_timeout(Some(NOTICE)).expect("timeout");
    plain
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .expect("send a plaintext preface");
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    // Nothing, or a TLS alert record (content type 21): never an HTTP/2 frame.
    assert!(
        answer.first().is_none_or(|&b| b == 21),
        "a plaintext client must get no HTTP/2 answer: {answer:?}"
    );
    let v = cluster
        .wait_links(1, NOTICE, "the plaintext client counted", |v| {
            refused(v, 1, "tls: not a TLS 1.3 peer") >= 1
        })
        .expect("counted");
    assert!(connected_among(&v, &[0, 1, 2, 3]), "{}", v.compact());

    // Imports across nodes, in both directions of two pairs.
    let (mut exp, mut imp) = held_import_0_to_1(&cluster, 7);
    let (d2, d3) = (cluster.node(2).dir(), cluster.node(3).dir());
    let (mut exp3, handle) = exporter(d3, &channel(&cluster, 3, 0), 8, "exporter on node 3");
    let mut imp2 = held_importer(d2, &channel(&cluster, 2, 0), &handle, 8, "importer on 2");
    assert_eq!(imp.ask("verify 7"), "ok");
    assert_eq!(imp2.ask("verify 8"), "ok");
    for held in [imp, imp2] {
        held.exit();
    }
    assert_eq!(exp.ask("verify 7"), "ok");
    assert_eq!(exp3.ask("verify 8"), "ok");
    exp.exit();
    exp3.exit();
    wait_all_released(&cluster, "after the imports and exports ended");
}

#[test]
fn a_daemon_with_a_certificate_of_another_ca_is_refused() {
    let mut cluster = Cluster::prepare(spec(4).with_tls()).expect("prepare");
    let foreign = Ca::new("another domain's CA", 30).expect("ca");
    let entry = cluster.node_name(3).expect("entry").to_owned();
    let pem = foreign.issue(&entry).expect("cert");
    give_node(&mut cluster, 3, &pem);
    start_all(&mut cluster);

    // Nodes 0-2 form among themselves; node 3 is connected to nobody, and node 0 says why.
    let reason_out = "tls: server certificate not signed by IMEX_CLIENT_CERT_AUTH";
    let reason_in = "tls: client certificate not signed by IMEX_SERVER_CERT_AUTH";
    let v = cluster
        .wait_links(
            0,
            FORM,
            "nodes 0-2 connected, node 3 refused both ways",
            |v| {
                connected_among(v, &[0, 1, 2])
                    && v.link(0, 3).is_some_and(|l| l.reason.contains(reason_out))
                    && refused(v, 0, reason_in) >= 1
                    && refused(v, 0, reason_out) >= 1
            },
        )
        .expect("node 3 refused");
    for i in 0..3 {
        let link = v.link(i, 3).expect("link to 3");
        assert_ne!(link.status, "CONNECTED", "{}", v.compact());
    }
    let mark = 0;
    let line = wait_log_line(&cluster, 0, mark, &["refused (", reason_in]);
    assert!(line.contains("TLS handshake failed"), "{line}");
    wait_log_line(&cluster, 0, mark, &["refused (", reason_out]);
    // Node 3's own view: its dials were refused over its certificate.
    let v3 = cluster
        .wait_links(3, FORM, "node 3 knows why", |v| {
            v.link(3, 0).is_some_and(|l| l.reason.contains("tls: "))
        })
        .expect("node 3's links");
    assert_ne!(v3.link(3, 0).expect("3->0").status, "CONNECTED");
    // Nodes 0-2 still are a domain among themselves.
    let d = cluster.domain(1).expect("ctl -N -j");
    for i in 0..3 {
        assert_eq!(d.node_status(i), Some("READY"), "{}", d.compact());
    }
    // `ctl -N` says why the domain is not UP, in the link's own words.
    let out = cluster.ctl(0, &["-N"]).expect("ctl -N");
    let table = String::from_utf8_lossy(&out.stdout);
    let why = &table[table.find("Why: ").expect("a Why line")..];
    assert!(
        why.contains("Node #3: ") && why.contains(reason_out),
        "ctl -N names the refusal:\n{table}"
    );
}

#[test]
fn a_certificate_that_does_not_name_the_node_entry_is_refused() {
    let mut cluster = Cluster::prepare(spec(3).with_tls()).expect("prepare");
    // Node 2's certificate is from the domain's CA but names another address.
    let pem = cluster
        .tls_ca()
        .expect("tls")
        .issue("192.0.2.77")
        .expect("cert");
    give_node(&mut cluster, 2, &pem);
    start_all(&mut cluster);

    let reason_out = "tls: server certificate does not name the node's entry";
    let reason_in = "tls: client certificate does not name the node's entry";
    let v = cluster
        .wait_links(0, FORM, "0-1 connected, node 2 refused both ways", |v| {
            connected_among(v, &[0, 1])
                && v.link(0, 2).is_some_and(|l| l.reason.contains(reason_out))
                && refused(v, 0, reason_in) >= 1
        })
        .expect("node 2 refused");
    assert_ne!(v.link(0, 2).expect("0->2").status, "CONNECTED");
    let line = wait_log_line(&cluster, 0, 0, &["refused (", reason_in]);
    assert!(line.contains("as node 2"), "{line}");
    let v2 = cluster
        .wait_links(2, FORM, "node 2 knows why", |v| {
            v.link(2, 0).is_some_and(|l| l.reason.contains(reason_in))
        })
        .expect("node 2's links");
    assert_ne!(v2.link(2, 0).expect("2->0").status, "CONNECTED");
}

/// Names mode (the nodes file lists host names): each certificate names its node's host name,
/// and the domain forms over TLS; a certificate that names the node's IP address instead is
/// refused, though the name resolves to that address, because the check is against the
/// nodes-file entry, as a dialler's `ServerName` is.
#[test]
fn in_names_mode_certificates_name_the_host_names_and_an_address_is_not_enough() {
    let mut cluster = Cluster::prepare(spec(3).with_names().with_tls()).expect("prepare");
    let entries = cluster.nodes_lines().to_vec();
    assert!(
        entries
            .iter()
            .all(|e| e.parse::<std::net::IpAddr>().is_err()),
        "names mode lists host names: {entries:?}"
    );
    let ip = cluster.node(2).ip().to_string();
    let pem = cluster.tls_ca().expect("tls").issue(&ip).expect("cert");
    give_node(&mut cluster, 2, &pem);
    start_all(&mut cluster);

    let reason_out = "tls: server certificate does not name the node's entry";
    let v = cluster
        .wait_links(0, FORM, "0-1 connected over TLS, node 2 refused", |v| {
            connected_among(v, &[0, 1])
                && v.link(0, 2).is_some_and(|l| l.reason.contains(reason_out))
        })
        .expect("node 2 refused");
    assert_ne!(v.link(0, 2).expect("0->2").status, "CONNECTED");
    let cfg = std::fs::read_to_string(cluster.node(0).dir().join("config.cfg")).expect("cfg");
    assert!(cfg.contains("IMEX_ENABLE_AUTH_ENCRYPTION=1"), "{cfg}");
}

#[test]
fn rotated_certificates_take_effect_on_sigusr1_with_live_imports_intact() {
    let mut cluster = gpu_cluster_from(spec(3).with_gpus(GpuSpec::default()).with_tls());
    let (mut exp, mut imp) = held_import_0_to_1(&cluster, 21);

    // A broken file first: the reload is refused, the old material kept, the domain untouched.
    let files = cluster.tls_files().expect("tls").clone();
    let good_key = std::fs::read_to_string(&files.nodes[0].key).expect("key");
    std::fs::write(&files.nodes[0].key, "not a key").expect("break the key");
    let mark = log(&cluster, 0).len();
    cluster.signal(0, Signal::SIGUSR1).expect("SIGUSR1");
    let line = wait_log_line(&cluster, 0, mark, &["cannot reload the TLS keys"]);
    assert!(line.contains("IMEX_SERVER_KEY"), "{line}");
    std::fs::write(&files.nodes[0].key, good_key).expect("restore the key");
    // The 5 s rate limit: a signal at once is ignored, and says so.
    cluster.signal(0, Signal::SIGUSR1).expect("SIGUSR1");
    wait_log_line(&cluster, 0, mark, &["SIGUSR1 ignored"]);
    std::thread::sleep(openimex_imexd::tls::MIN_RELOAD_INTERVAL);

    for new_ca in [false, true] {
        cluster.rotate_tls(new_ca).expect("new certificates");
        let marks: Vec<usize> = (0..3).map(|i| log(&cluster, i).len()).collect();
        for i in 0..3 {
            cluster.signal(i, Signal::SIGUSR1).expect("SIGUSR1");
        }
        for (i, &mark) in marks.iter().enumerate() {
            wait_log_line(&cluster, i, mark, &["TLS keys and certificates reloaded"]);
        }
        for i in 0..3 {
            cluster.wait_up(i, FORM).expect("UP after the reload");
        }
        // New connections use the new material: node 2 restarts and joins with it.
        cluster.restart(2).expect("restart node 2");
        cluster
            .wait_up(2, FORM)
            .expect("node 2 UP with the new certificates");
        cluster
            .wait_links(0, FORM, "all connected again", |v| {
                connected_among(v, &[0, 1, 2])
            })
            .expect("links");
        // The import made before the rotation still reads and writes node 0's memory.
        assert_eq!(imp.ask("verify 21"), "ok", "new_ca={new_ca}");
        let seed = if new_ca { 32 } else { 31 };
        assert!(
            imp.ask(&format!("write {seed}")).starts_with("written "),
            "new_ca={new_ca}"
        );
        assert_eq!(exp.ask(&format!("verify {seed}")), "ok", "new_ca={new_ca}");
        assert_eq!(exp.ask("write 21"), format!("written {SIZE_BYTES}"));
        // A new import works across the rotated domain.
        let (d0, d2) = (cluster.node(0).dir(), cluster.node(2).dir());
        wait_session(&cluster, 2);
        let (exp2, handle) = exporter(d2, &channel(&cluster, 2, 0), 22, "exporter on node 2");
        let imp2 = held_importer(d0, &channel(&cluster, 0, 0), &handle, 22, "importer on 0");
        imp2.exit();
        exp2.exit();
        std::thread::sleep(openimex_imexd::tls::MIN_RELOAD_INTERVAL);
    }
    imp.exit();
    exp.exit();
    wait_all_released(&cluster, "after the import and the export ended");
}

#[test]
fn openimex_certs_makes_a_domain_and_refuses_to_overwrite() {
    let dir = openimex_harness::ScratchDir::new("certs-cli").expect("scratch");
    let nodes = dir.path().join("nodes_config.cfg");
    std::fs::write(&nodes, "10.1.2.3\nnode-b.example\n").expect("nodes file");
    let out_dir = dir.path().join("certs");
    let certs_cmd = || {
        let mut cmd = std::process::Command::new(crate::common::binary());
        cmd.arg("certs")
            .arg("--nodes")
            .arg(&nodes)
            .arg("--out")
            .arg(&out_dir);
        cmd
    };
    let out = crate::common::run(certs_cmd().args(["--days", "7"]));
    let stdout = crate::common::text(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        crate::common::text(&out.stderr)
    );
    for needle in [
        "# node 1 (node-b.example)",
        "IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS",
        "IMEX_AUTH_SOURCE=FILE",
        &format!("IMEX_CLIENT_CERT={}", out_dir.join("node1.pem").display()),
        &format!("IMEX_SERVER_CERT_AUTH={}", out_dir.join("ca.pem").display()),
    ] {
        assert!(stdout.contains(needle), "{needle:?} in {stdout}");
    }
    use std::os::unix::fs::PermissionsExt;
    for key in ["ca.key", "node0.key", "node1.key"] {
        let mode = std::fs::metadata(out_dir.join(key))
            .expect(key)
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{key}");
    }
    let again = crate::common::run(&mut certs_cmd());
    let stderr = crate::common::text(&again.stderr);
    assert!(!again.status.success(), "must refuse to overwrite");
    assert!(
        stderr.contains("exists already") && stderr.contains("--force"),
        "{stderr}"
    );
    let forced = crate::common::run(certs_cmd().arg("--force"));
    assert!(
        forced.status.success(),
        "{}",
        crate::common::text(&forced.stderr)
    );
}
