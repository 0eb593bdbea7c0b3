//! Issue 32, items 3 and 5: the command-line conventions of both binaries, on the real
//! binaries. `ctl` and `daemon` go by the name they run under (`openimex ctl`, or
//! `nvidia-imex-ctl` through the link `install-links` makes) in their usage and messages;
//! `help ctl` shows ctl's options; an unknown argument is named, with clap's exit status 2
//! (NVIDIA's 1 and short usage under NVIDIA's name); `-u` has a long name (`--unix-socket`)
//! and NVIDIA's `--u=PATH` still works; help is wrapped off a terminal; the demo's refusals say
//! what exists and what to do, and it says where its picture went; DRA's stock config gives
//! no warning; and `man --out DIR` writes a page per command.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use openimex_harness::{Cluster, ScratchDir};

use crate::common::{
    FORM, assert_clean_failure, binary, dead_endpoint, lab_binary, log, run, run_long, spec, text,
};

/// `install-links` into a scratch directory: (the directory, `nvidia-imex`, `nvidia-imex-ctl`).
fn links() -> (ScratchDir, PathBuf, PathBuf) {
    let dir = ScratchDir::new("cli-links").expect("scratch dir");
    let out = run(Command::new(binary()).arg("install-links").arg(dir.path()));
    assert!(out.status.success(), "install-links: {}", text(&out.stderr));
    let daemon = dir.path().join("nvidia-imex");
    let ctl = dir.path().join("nvidia-imex-ctl");
    (dir, daemon, ctl)
}

/// Runs `cmd` with no terminal and no COLUMNS, so help is laid out for 100 columns.
fn plain(cmd: &mut Command) -> Output {
    run(cmd.env_remove("COLUMNS"))
}

/// `--help` (or `help NAME`) output: exit 0, the text on stdout.
#[track_caller]
fn help(cmd: &mut Command) -> String {
    let out = plain(cmd);
    assert!(
        out.status.success(),
        "{cmd:?}: {:?}\n{}",
        out.status,
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The line of `stderr` that starts with `prefix`, if any.
fn line_starting<'a>(stderr: &'a str, prefix: &str) -> Option<&'a str> {
    stderr.lines().find(|l| l.starts_with(prefix))
}

#[test]
fn ctl_and_daemon_go_by_the_name_they_run_under() {
    let (_dir, daemon_link, ctl_link) = links();
    let (ip, port) = dead_endpoint();

    // Usage.
    let cases: [(Command, &str, &str); 5] = [
        (
            with_args(binary(), &["ctl", "--help"]),
            "Usage: openimex ctl ",
            "nvidia-imex-ctl [",
        ),
        (
            with_args(lab_binary(), &["ctl", "--help"]),
            "Usage: openimex-lab ctl ",
            "nvidia-imex-ctl [",
        ),
        (
            with_args(ctl_link.clone(), &["--help"]),
            "Usage: nvidia-imex-ctl ",
            "openimex ctl",
        ),
        (
            with_args(binary(), &["daemon", "--help"]),
            "Usage: openimex daemon ",
            "Usage: nvidia-imex",
        ),
        (
            with_args(daemon_link.clone(), &["--help"]),
            "Usage: nvidia-imex ",
            "openimex daemon",
        ),
    ];
    for (mut cmd, usage, not) in cases {
        let out = help(&mut cmd);
        assert!(out.contains(usage), "{cmd:?}: {usage:?} in:\n{out}");
        assert!(!out.contains(not), "{cmd:?}: no {not:?} in:\n{out}");
    }

    // Errors: ctl with no daemon to talk to, the daemon with no config file.
    let missing = "/nonexistent/openimex-cli-conventions/config.cfg";
    let cases: [(Command, &str, &str); 4] = [
        (
            with_args(binary(), &["ctl", "-i", &ip, &port, "-q"]),
            "openimex ctl: ",
            "nvidia-imex-ctl:",
        ),
        (
            with_args(ctl_link, &["-i", &ip, &port, "-q"]),
            "nvidia-imex-ctl: ",
            "openimex ctl:",
        ),
        (
            with_args(binary(), &["daemon", "-c", missing]),
            "openimex daemon: ",
            "nvidia-imex:",
        ),
        (
            with_args(daemon_link, &["-c", missing]),
            "nvidia-imex: ",
            "openimex daemon:",
        ),
    ];
    for (mut cmd, prefix, not) in cases {
        let out = run(&mut cmd);
        let stderr = assert_clean_failure(&out, &format!("{cmd:?}"));
        assert!(
            line_starting(&stderr, prefix).is_some(),
            "{cmd:?}: a line starting {prefix:?} in:\n{stderr}"
        );
        assert!(!stderr.contains(not), "{cmd:?}: no {not:?} in:\n{stderr}");
    }
}

fn with_args(program: PathBuf, args: &[&str]) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args);
    cmd
}

#[test]
fn help_ctl_shows_what_ctl_help_shows() {
    // Each binary's help opens with its own description.
    let root = help(Command::new(binary()).arg("--help"));
    assert!(root.starts_with(openimex::ABOUT), "{root}");
    let root = help(Command::new(lab_binary()).arg("--help"));
    assert!(root.starts_with("The openimex lab"), "{root}");

    for (name, options) in [
        (
            "ctl",
            &["-q", "-N", "-j", "-H", "--unix-socket", "--watch", "--svg"][..],
        ),
        ("daemon", &["-c", "--port", "--nogpu"][..]),
    ] {
        let via_help = help(Command::new(binary()).args(["help", name]));
        let own = help(Command::new(binary()).args([name, "--help"]));
        assert_eq!(
            via_help, own,
            "`openimex help {name}` is `openimex {name} --help`"
        );
        for option in options {
            assert!(
                via_help.contains(option),
                "{name}: {option} in:\n{via_help}"
            );
        }
    }
}

#[test]
fn ctl_names_an_unknown_argument_and_keeps_nvidias_flags() {
    let out = run(Command::new(binary()).args(["ctl", "--bogus"]));
    let stderr = assert_clean_failure(&out, "openimex ctl --bogus");
    assert_eq!(out.status.code(), Some(2), "clap's usage status: {stderr}");
    assert!(stderr.contains("--bogus"), "names the argument: {stderr}");
    assert!(stderr.contains("Usage: openimex ctl "), "{stderr}");

    // Under NVIDIA's name: the argument named too, then NVIDIA's short usage and status 1.
    let (_dir, _daemon, ctl_link) = links();
    let out = run(Command::new(&ctl_link).arg("--bogus"));
    let stderr = assert_clean_failure(&out, "nvidia-imex-ctl --bogus");
    assert_eq!(out.status.code(), Some(1), "NVIDIA's status: {stderr}");
    assert!(stderr.contains("--bogus"), "names the argument: {stderr}");
    assert!(
        stderr.contains(
            "Usage: nvidia-imex-ctl [-c <nvidia-imex config.cfg path>] <-n|-N|-q> [-j][-H]"
        ),
        "NVIDIA's short usage: {stderr}"
    );

    // NVIDIA's flags parse as before: each of these gets as far as the (absent) daemon.
    let (ip, port) = dead_endpoint();
    let sock = "/nonexistent/openimex-cli-conventions/imex_ctrl.sock";
    let unix_flag = format!("--u={sock}");
    let target = ["-i", ip.as_str(), port.as_str()];
    let mut lines: Vec<Vec<&str>> = [
        &["-q"][..],
        &["-a", "-q"],
        &["-N"],
        &["-N", "-j"],
        &["-N", "-H"],
        &["-n", "-t", "100"],
        &["-s", "-t", "100"],
        &["-d"],
        &["-m", "-j"],
    ]
    .iter()
    .map(|flags| target.iter().chain(flags.iter()).copied().collect())
    .collect();
    lines.push(vec![unix_flag.as_str(), "-q"]);
    lines.push(vec!["--u", sock, "-q"]);
    lines.push(vec!["-u", sock, "-q"]);
    lines.push(vec!["--unix-socket", sock, "-q"]);
    for args in &lines {
        for mut cmd in [
            with_args(ctl_link.clone(), args),
            with_args(binary(), &[&["ctl"][..], args].concat()),
        ] {
            let out = run(&mut cmd);
            let stderr = assert_clean_failure(&out, &format!("{cmd:?}"));
            assert_eq!(out.status.code(), Some(1), "{cmd:?}: {stderr}");
            assert!(
                !stderr.contains("Usage:") && !stderr.contains("unexpected argument"),
                "{cmd:?} must parse: {stderr}"
            );
            assert!(
                stderr.contains(&ip) || stderr.contains(sock),
                "{cmd:?} names the daemon it could not reach: {stderr}"
            );
        }
    }

    // The long name is in the help; NVIDIA's `--u` works without being shown.
    let out = help(Command::new(binary()).args(["ctl", "--help"]));
    assert!(out.contains("-u, --unix-socket <PATH>"), "{out}");
    assert!(!out.contains("--u "), "{out}");
}

#[test]
fn help_is_wrapped_to_100_columns_off_a_terminal() {
    let cases: [(PathBuf, &[&str]); 7] = [
        (binary(), &["--help"]),
        (binary(), &["ctl", "--help"]),
        (binary(), &["help", "ctl"]),
        (binary(), &["daemon", "--help"]),
        (binary(), &["channels", "create", "--help"]),
        (lab_binary(), &["demo", "--help"]),
        (lab_binary(), &["bench", "--help"]),
    ];
    for (program, args) in cases {
        let out = help(Command::new(&program).args(args));
        for line in out.lines() {
            assert!(
                line.chars().count() <= 100,
                "{} {args:?}: a line of {} columns:\n{line}\nin:\n{out}",
                program.display(),
                line.chars().count()
            );
        }
    }
}

/// The demo's stderr for `args`, which must be refused before anything starts.
fn demo_refused(args: &[&str]) -> (Output, String) {
    let out = run(Command::new(lab_binary()).arg("demo").args(args));
    let stderr = assert_clean_failure(&out, &format!("demo {args:?}"));
    (out, stderr)
}

#[test]
fn demo_refusals_name_what_exists_and_the_fix() {
    let (out, stderr) = demo_refused(&["--topology", "nvl99"]);
    assert_eq!(out.status.code(), Some(2), "a usage error: {stderr}");
    assert!(stderr.contains("nvl99"), "{stderr}");
    for preset in ["nvl72", "nvl36", "nvl36x2", "nvl576"] {
        assert!(
            stderr.contains(preset),
            "names the preset {preset}: {stderr}"
        );
    }
    assert!(stderr.contains("--topology-file FILE"), "{stderr}");
    assert!(
        !stderr.contains(" --file"),
        "the demo has no --file: {stderr}"
    );

    // 18 trays in 3 partitions of 6: the first 2 trays leave two partitions without a GPU.
    let (out, stderr) = demo_refused(&["--nodes", "2", "--partitions", "3"]);
    assert_eq!(out.status.code(), Some(2), "a usage error: {stderr}");
    for words in [
        "--nodes 2",
        "--partitions 3",
        "--nodes 13",
        "drop --partitions",
    ] {
        assert!(stderr.contains(words), "{words:?} in: {stderr}");
    }
    // With enough trays for two of the three: fewer partitions is the other fix.
    let (out, stderr) = demo_refused(&["--nodes", "10", "--partitions", "3"]);
    assert_eq!(out.status.code(), Some(2), "a usage error: {stderr}");
    assert!(stderr.contains("--partitions 2 or fewer"), "{stderr}");
}

/// One rack, one switch tray, two compute trays of two GPUs.
const TWO_TRAYS: &str = "topology lab\nrack r0\nswitch-tray r0-s0\ncompute-tray r0-c0 gpus=2\n\
                         compute-tray r0-c1 gpus=2\n";

/// Time allowed for a small demo.
const DEMO: Duration = Duration::from_secs(300);

/// Runs the text demo on two trays in `dir`, with `args`; its stdout.
fn small_demo(dir: &Path, topo: &Path, args: &[&str]) -> String {
    let out = run_long(
        Command::new(lab_binary())
            .current_dir(dir)
            .arg("demo")
            .arg("--topology-file")
            .arg(topo)
            .args(args),
        DEMO,
    );
    assert!(
        out.status.success(),
        "demo {args:?}: {:?}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

#[test]
fn demo_says_where_it_drew_the_domain_and_what_it_replaced() {
    let dir = ScratchDir::new("demo-picture").expect("scratch dir");
    let topo = dir.path().join("lab.topo");
    std::fs::write(&topo, TWO_TRAYS).expect("write the topology");
    let picture = dir.path().join("openimex-domain.svg");
    std::fs::write(&picture, "an older picture").expect("write an older picture");

    let stdout = small_demo(dir.path(), &topo, &[]);
    let line = stdout
        .lines()
        .find(|l| l.contains("domain picture"))
        .unwrap_or_else(|| panic!("a domain picture line in:\n{stdout}"));
    assert!(
        line.contains(&picture.display().to_string()) && line.contains("replaced"),
        "the absolute path, and that a file was replaced: {line}"
    );
    let svg = std::fs::read_to_string(&picture).expect("the picture");
    assert!(svg.contains("<svg"), "the picture was drawn: {svg:.80}");

    let fresh = dir.path().join("fresh.svg");
    let stdout = small_demo(dir.path(), &topo, &["--svg", "fresh.svg"]);
    let line = stdout
        .lines()
        .find(|l| l.contains("domain picture"))
        .unwrap_or_else(|| panic!("a domain picture line in:\n{stdout}"));
    assert!(
        line.contains(&fresh.display().to_string()) && !line.contains("replaced"),
        "a new file replaces nothing: {line}"
    );
    assert!(fresh.is_file(), "{}", fresh.display());
}

/// Issue 32 item 3: the Kubernetes DRA driver's stock config sets IMEX_GSS_TIMEOUT_SEC=30 and
/// IMEX_GSS_SHUTDOWN_ON_FAILURE=0 with authentication off. NVIDIA's daemon says nothing about
/// keys without effect, and neither does ours; a key it does not know is still warned about.
#[test]
fn dra_stock_gss_keys_give_the_daemon_no_warning() {
    let unknown = "IMEX_CLI_CONVENTIONS_UNKNOWN";
    let mut cluster = Cluster::prepare(
        spec(1)
            .config("IMEX_ENABLE_AUTH_ENCRYPTION", "0")
            .config("IMEX_AUTH_ENCRYPTION_MODE", "SSL_TLS")
            .config("IMEX_GSS_SERVICE_NAME", "host")
            .config("IMEX_GSS_TIMEOUT_SEC", "30")
            .config("IMEX_GSS_RETRY_INTERVAL_SEC", "5")
            .config("IMEX_GSS_SEC_CONTEXT_LIFETIME_SEC", "-1")
            .config("IMEX_GSS_SHUTDOWN_ON_FAILURE", "0")
            .config(unknown, "1"),
    )
    .expect("prepare");
    cluster.start_node(0).expect("start");
    cluster.wait_state(0, "READY", FORM).expect("READY");
    let text = log(&cluster, 0);
    assert!(
        text.contains(unknown),
        "the unknown key is still warned about:\n{text}"
    );
    let warned: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("IMEX_GSS") && (l.contains("WARN") || l.contains("not supported")))
        .collect();
    assert!(
        warned.is_empty(),
        "no warning about the GSS keys: {warned:?}"
    );
    assert!(!text.contains("not supported yet"), "{text}");
}

/// The pages `man --out DIR` wrote, each as plain text (roff's `\-` as `-`).
fn man_pages(program: PathBuf) -> (ScratchDir, Vec<(String, String)>) {
    let dir = ScratchDir::new("man-pages").expect("scratch dir");
    let out_dir = dir.path().join("man1");
    let out = run(Command::new(&program).args(["man", "--out"]).arg(&out_dir));
    assert!(
        out.status.success(),
        "{} man: {}",
        program.display(),
        text(&out.stderr)
    );
    let mut pages = Vec::new();
    for entry in std::fs::read_dir(&out_dir).expect("the pages' directory") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let body = std::fs::read_to_string(&path)
            .expect("a page")
            .replace("\\-", "-");
        pages.push((name, body));
    }
    (dir, pages)
}

#[track_caller]
fn expect_pages(pages: &[(String, String)], expected: &[(&str, &[&str])]) {
    let names: Vec<&str> = pages.iter().map(|(n, _)| n.as_str()).collect();
    for (page, options) in expected {
        let body = pages
            .iter()
            .find(|(n, _)| n == page)
            .map(|(_, b)| b)
            .unwrap_or_else(|| panic!("no page {page} among {names:?}"));
        assert!(
            body.starts_with(".ie") || body.contains(".TH"),
            "{page}: roff:\n{body}"
        );
        for option in *options {
            assert!(body.contains(option), "{page}: {option} in:\n{body}");
        }
    }
}

#[test]
fn man_pages_are_written_for_every_command() {
    let (_dir, pages) = man_pages(binary());
    expect_pages(
        &pages,
        &[
            ("openimex.1", &["daemon", "ctl", "install-links"]),
            ("openimex-daemon.1", &["-c", "--port", "--nogpu"]),
            (
                "openimex-ctl.1",
                &[
                    "-q",
                    "-N",
                    "--unix-socket",
                    "--watch",
                    "--svg",
                    "domain-check",
                ],
            ),
            ("openimex-ctl-domain-check.1", &["HOST"]),
            ("openimex-init.1", &["--nodes", "--out", "--force"]),
            ("openimex-certs.1", &["--nodes", "--out", "--days"]),
            ("openimex-channels.1", &["create"]),
            (
                "openimex-channels-create.1",
                &["--first", "--mode", "--allow-world"],
            ),
            ("openimex-driver-check.1", &["--json", "--driver-root"]),
            ("openimex-install-links.1", &["--force", "DIR"]),
        ],
    );
    let (_dir, pages) = man_pages(lab_binary());
    expect_pages(
        &pages,
        &[
            ("openimex-lab.1", &["demo", "bench", "fabric"]),
            (
                "openimex-lab-demo.1",
                &["--topology-file", "--partitions", "--chaos", "--svg"],
            ),
            ("openimex-lab-bench.1", &["formation"]),
            (
                "openimex-lab-bench-formation.1",
                &["--nodes", "--rounds", "--tls"],
            ),
            ("openimex-lab-fabric.1", &["topology", "serve"]),
            (
                "openimex-lab-fabric-topology.1",
                &["--file", "--partitions", "--json"],
            ),
            ("openimex-lab-ctl.1", &["--unix-socket"]),
            ("openimex-lab-daemon.1", &["--nogpu"]),
            ("openimex-lab-gpu.1", &["--node-dir", "--fabric-dir"]),
            ("openimex-lab-app.1", &["export", "import"]),
            ("openimex-lab-app-import.1", &["--handle", "--channel"]),
            ("openimex-lab-local-up.1", &["--nodes", "--dir"]),
        ],
    );
}
