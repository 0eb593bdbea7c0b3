//! `openimex-lab local up|status|down`: a simulated domain started in one command and left
//! running; the `ctl` command it prints shows every node READY and the domain UP; `down`
//! leaves no process and no socket. Run as `nobody` when the test runs as root (newcomers are
//! not root), on a random `127.1.B.x` block (the harness's are `127.16.0.0` and above).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use openimex_harness::process::{find_pids_with_args, process_alive, send_signal};
use openimex_harness::{Runnable, Signal, runnable_by_everyone};

use crate::common::{COMMAND, lab_binary, run_long, text};

/// Time for `local up` (which waits for the domain itself) on a loaded machine.
const UP: Duration = Duration::from_secs(150);
/// Time for `local down` (10 s for daemons, 5 s for drivers, then SIGKILL).
const DOWN: Duration = Duration::from_secs(40);

/// The user the commands run as: `nobody` when the test is root, else the test's own.
fn as_nobody() -> bool {
    std::fs::metadata("/proc/self").map(|m| m.uid()).ok() == Some(0)
}

/// A fresh directory for one local domain, that its user may write; and on drop, `local down`
/// and a SIGKILL of anything still running from it, then the directory removed.
struct Scratch {
    base: PathBuf,
    lab: Runnable,
}

impl Scratch {
    fn new(name: &str) -> Self {
        let base =
            std::env::temp_dir().join(format!("openimex-local-e2e-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).expect("create the test directory");
        if as_nobody() {
            std::os::unix::fs::chown(&base, Some(65534), Some(65534)).expect("chown to nobody");
        }
        let lab = runnable_by_everyone(&lab_binary()).expect("the lab binary for nobody");
        Self { base, lab }
    }

    /// The domain directory (`local up` creates it).
    fn dir(&self) -> PathBuf {
        self.base.join("d")
    }

    /// `openimex-lab ARGS` as the domain's user.
    fn lab(&self, args: &[&str], limit: Duration) -> Output {
        let mut cmd = Command::new(self.lab.path());
        cmd.args(args);
        user(&mut cmd);
        run_long(&mut cmd, limit)
    }
}

fn user(cmd: &mut Command) {
    if as_nobody() {
        cmd.uid(65534).gid(65534);
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let dir = self.dir().display().to_string();
        let _ = self.lab(&["local", "down", "--dir", &dir], DOWN);
        for i in 0..8 {
            let node = format!("{dir}/node{i}");
            for args in [
                vec!["--node-dir".to_owned(), node.clone()],
                vec!["-c".to_owned(), format!("{node}/config.cfg")],
            ] {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                for pid in find_pids_with_args(&args) {
                    let _ = send_signal(pid, Signal::SIGKILL);
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// A random `127.1.B.1` whose block of `n` is free on port 50000 now.
fn free_block(n: u8) -> Ipv4Addr {
    for _ in 0..50 {
        let mut h = RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let b = 100 + (h.finish() % 156) as u8;
        let first = Ipv4Addr::new(127, 1, b, 1);
        let free = (1..=n).all(|k| {
            TcpListener::bind(SocketAddrV4::new(Ipv4Addr::new(127, 1, b, k), 50000)).is_ok()
        });
        if free {
            return first;
        }
    }
    panic!("no free 127.1.B.x block on port 50000 in 50 tries");
}

/// Pids recorded in the domain's `local.pids` (`KIND NODE PID ARG`).
fn recorded_pids(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("local.pids"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(2)?.parse().ok())
        .collect()
}

#[test]
fn local_up_gives_a_domain_ctl_sees_up_and_local_down_leaves_nothing() {
    let scratch = Scratch::new("up");
    let dir = scratch.dir();
    let dir_arg = dir.display().to_string();
    let first = free_block(3).to_string();
    let up = scratch.lab(
        &[
            "local",
            "up",
            "--nodes",
            "3",
            "--gpus",
            "2",
            "--first-ip",
            &first,
            "--timeout",
            "90",
            "--dir",
            &dir_arg,
        ],
        UP,
    );
    let said = text(&up.stdout);
    assert!(
        up.status.success(),
        "local up: {}\n{said}",
        text(&up.stderr)
    );
    assert!(
        said.contains(&format!("is UP in {dir_arg}: 3 nodes")),
        "{said}"
    );
    let pids = recorded_pids(&dir);
    assert_eq!(pids.len(), 6, "3 drivers and 3 daemons recorded");
    assert!(pids.iter().all(|&p| process_alive(p)), "{pids:?}");

    // The ctl command exactly as printed (up to its comment), as the domain's user.
    let printed = said
        .lines()
        .find(|l| l.contains(" ctl -c ") && l.contains("-N ") && !l.contains("-j"))
        .unwrap_or_else(|| panic!("no `ctl -N` command printed:\n{said}"));
    let words: Vec<&str> = printed
        .split('#')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(words[0], scratch.lab.path().display().to_string());
    let mut ctl = Command::new(words[0]);
    ctl.args(&words[1..]);
    user(&mut ctl);
    let table = run_long(&mut ctl, COMMAND);
    let table_text = text(&table.stdout);
    assert!(table.status.success(), "{printed}: {}", text(&table.stderr));
    for i in 0..3u8 {
        let ip = format!("127.1.{}.{}", first.split('.').nth(2).unwrap_or("?"), i + 1);
        let line = table_text
            .lines()
            .find(|l| l.starts_with(&format!("Node #{i} ")))
            .unwrap_or_else(|| panic!("no line for node {i}:\n{table_text}"));
        assert!(
            line.contains(&ip) && line.contains("READY"),
            "node {i} ({ip}) not READY:\n{table_text}"
        );
    }
    let matrix_rows: Vec<&str> = table_text
        .lines()
        .skip_while(|l| !l.contains("Nodes From\\To"))
        .skip(1)
        .take(3)
        .collect();
    assert_eq!(matrix_rows.len(), 3, "{table_text}");
    for row in &matrix_rows {
        let cells: Vec<&str> = row.split_whitespace().skip(1).collect();
        assert_eq!(cells, ["C", "C", "C"], "{table_text}");
    }
    assert!(table_text.contains("Domain State: UP"), "{table_text}");

    let status = scratch.lab(&["local", "status", "--dir", &dir_arg], COMMAND * 4);
    let status_text = text(&status.stdout);
    assert!(
        status.status.success() && status_text.contains("domain UP"),
        "{status_text}{}",
        text(&status.stderr)
    );

    // A second `up` on the running domain is refused, and starts nothing.
    let again = scratch.lab(&["local", "up", "--nodes", "3", "--dir", &dir_arg], UP);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("already runs in")
            && text(&again.stderr).contains("local down --dir"),
        "{}",
        text(&again.stderr)
    );
    assert_eq!(recorded_pids(&dir), pids);

    let down = scratch.lab(&["local", "down", "--dir", &dir_arg], DOWN);
    let down_text = text(&down.stdout);
    assert!(
        down.status.success(),
        "local down: {}\n{down_text}",
        text(&down.stderr)
    );
    assert!(down_text.contains("Stopped 6 processes"), "{down_text}");
    let left: Vec<u32> = pids.iter().copied().filter(|&p| process_alive(p)).collect();
    assert!(left.is_empty(), "still running after local down: {left:?}");
    for i in 0..3 {
        let node = dir.join(format!("node{i}"));
        assert!(
            find_pids_with_args(&["--node-dir", &node.display().to_string()]).is_empty()
                && find_pids_with_args(&["-c", &node.join("config.cfg").display().to_string()])
                    .is_empty(),
            "a process of node {i} remains"
        );
        for socket in [node.join("imex_ctrl.sock"), node.join("dev/nvidiactl")] {
            assert!(
                std::fs::symlink_metadata(&socket).is_err(),
                "{} remains",
                socket.display()
            );
        }
    }
    assert!(!dir.join("local.pids").exists());
    let twice = scratch.lab(&["local", "down", "--dir", &dir_arg], DOWN);
    assert!(twice.status.success(), "{}", text(&twice.stderr));
    assert!(text(&twice.stdout).contains("Nothing was running"));
}

#[test]
fn local_up_that_fails_names_the_node_and_leaves_no_process() {
    let scratch = Scratch::new("fail");
    let dir = scratch.dir();
    let dir_arg = dir.display().to_string();
    // Node 1's command socket path is taken by a directory: its daemon cannot bind and exits.
    let first = scratch.lab(&["local", "down", "--dir", &dir_arg], DOWN);
    assert!(
        text(&first.stderr).contains("no local domain in"),
        "down without a domain: {}",
        text(&first.stderr)
    );
    let blocker = dir.join("node1/imex_ctrl.sock");
    std::fs::create_dir_all(&blocker).expect("mkdir");
    std::fs::write(dir.join("openimex-local"), "").expect("marker");
    if as_nobody() {
        for p in [
            dir.clone(),
            dir.join("node1"),
            blocker.clone(),
            dir.join("openimex-local"),
        ] {
            std::os::unix::fs::chown(&p, Some(65534), Some(65534)).expect("chown");
        }
    }
    let ip = free_block(2).to_string();
    let up = scratch.lab(
        &[
            "local",
            "up",
            "--nodes",
            "2",
            "--gpus",
            "1",
            "--first-ip",
            &ip,
            "--dir",
            &dir_arg,
        ],
        UP,
    );
    let stderr = text(&up.stderr);
    assert!(
        !up.status.success(),
        "local up must fail: {}",
        text(&up.stdout)
    );
    assert!(
        stderr.contains("the IMEX daemon of node 1 stopped during start-up")
            && stderr.contains(&format!("{dir_arg}/node1/daemon.out"))
            && stderr.contains("everything started was stopped"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!dir.join("local.pids").exists(), "the record is removed");
    for i in 0..2 {
        let node = dir.join(format!("node{i}"));
        assert!(
            find_pids_with_args(&["--node-dir", &node.display().to_string()]).is_empty()
                && find_pids_with_args(&["-c", &node.join("config.cfg").display().to_string()])
                    .is_empty(),
            "a process of node {i} remains after the failed up"
        );
        assert!(
            !node.join("dev/nvidiactl").exists(),
            "node {i}'s driver socket remains"
        );
    }
}
