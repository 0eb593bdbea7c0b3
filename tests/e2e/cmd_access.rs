//! Issue 10, item 3: who can reach the command service. The unix socket is root's (uid 0,
//! gid 0, mode 0660: root-only unless a site gives the socket's group to a monitoring group),
//! and the TCP command port listens on `IMEX_CMD_BIND_INTERFACE_IP` only. Every command
//! (`State`, `Domain`, `Peers`, `Config`) only reads, so there is nothing state-changing to
//! guard further.

use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use openimex_harness::Cluster;

use crate::common::{FORM, binary, run, spec, text, wait_for};

/// The unprivileged user (and group) the tests connect as.
const NOBODY: u32 = 65534;

/// `ctl -q -u SOCKET`, as `uid`:`uid` if given.
fn ctl_q(sock: &std::path::Path, uid: Option<u32>) -> std::process::Output {
    // Held until the command ran: the link it may be offered through goes with it.
    let offered =
        uid.map(|_| openimex_harness::runnable_by_everyone(&binary()).expect("a reachable binary"));
    let exe = offered
        .as_ref()
        .map_or_else(binary, |r| r.path().to_path_buf());
    let mut cmd = Command::new(exe);
    cmd.args(["ctl", "-q", "-u"]).arg(sock);
    if let Some(id) = uid {
        cmd.uid(id).gid(id);
    }
    run(&mut cmd)
}

#[test]
fn the_command_socket_is_root_only_unless_its_group_is_given() {
    let cluster = Cluster::start(spec(1)).expect("start");
    let sock = cluster.node(0).socket_path();
    let ready = wait_for(FORM, || text(&ctl_q(&sock, None).stdout) == "READY\n");
    assert!(ready, "not READY\n{}", cluster.logs_tail(20));
    let meta = std::fs::metadata(&sock).expect("socket");
    assert!(meta.file_type().is_socket());
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777),
        (0, 0, 0o660),
        "root's, owner and group only"
    );

    let out = ctl_q(&sock, Some(NOBODY));
    let err = text(&out.stderr);
    assert!(
        !out.status.success() && text(&out.stdout).is_empty(),
        "an unprivileged user reached the daemon: {out:?}"
    );
    assert!(
        err.to_lowercase().contains("permission denied"),
        "the refusal says why: {err}"
    );

    // 0660, not 0600: a site can grant ctl to a group by giving it the socket.
    std::os::unix::fs::chown(&sock, None, Some(NOBODY)).expect("chgrp");
    let out = ctl_q(&sock, Some(NOBODY));
    assert_eq!(text(&out.stdout), "READY\n", "{}", text(&out.stderr));
}

#[test]
fn the_command_port_listens_on_the_configured_address_only() {
    let mut cluster = Cluster::prepare(spec(2)).expect("prepare");
    cluster.start_node(0).expect("start node 0");
    let (ip, other) = (cluster.node(0).ip(), cluster.node(1).ip());
    let port = cluster.node(0).cmd_port();
    let up = wait_for(FORM, || {
        run(Command::new(binary()).args(["ctl", "-q", "-i", &ip.to_string(), &port.to_string()]))
            .status
            .success()
    });
    assert!(
        up,
        "no command service on {ip}:{port}\n{}",
        cluster.logs_tail(20)
    );
    let connect =
        |addr: SocketAddr| TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map(drop);
    connect(SocketAddr::from((ip, port))).expect("the configured address answers");
    // Node 1's address is on the same host (loopback) and nothing else listens there: a
    // daemon bound to every interface would answer on it.
    let e = connect(SocketAddr::from((other, port)))
        .expect_err("the command port answered on another address of the host");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
}
