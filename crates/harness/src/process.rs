//! Small process utilities: run a command with a time limit, spawn children that die with the
//! harness, and find processes by an argument (for daemons that forked away from us).

use std::fs;
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::HarnessError;

/// How often a waiting loop looks at a child.
pub(crate) const POLL: Duration = Duration::from_millis(10);

/// Renders a command line for messages: program and arguments separated by spaces.
pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Renders an exit status as `exit code 3` or `killed by signal 9`.
pub fn describe_status(status: &ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => status.to_string(),
    }
}

/// Asks the kernel to SIGKILL the child when the thread that spawned it dies, so that a test
/// process killed by a runner's timeout leaves no daemon behind holding its addresses.
///
/// Linux ties this to the spawning *thread*: keep a `Cluster` on the thread that created it.
pub(crate) fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec in the child and only makes two
    // async-signal-safe system calls (prctl, getppid); it allocates nothing (the error is a
    // raw OS error code) and touches no lock.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(|e| std::io::Error::from_raw_os_error(e as i32))?;
            // The parent may have died before prctl took effect.
            if nix::unistd::getppid().as_raw() as u32 != parent {
                return Err(std::io::Error::from_raw_os_error(
                    nix::errno::Errno::ESRCH as i32,
                ));
            }
            Ok(())
        });
    }
}

/// Runs `cmd` to completion with stdin closed and stdout/stderr captured, killing it if it
/// takes longer than `timeout`. A non-zero exit is *not* an error here: check `Output.status`.
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Result<Output, HarnessError> {
    let command = describe(cmd);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|source| HarnessError::Spawn {
        program: cmd.get_program().into(),
        source,
        hint: "check that the binary exists and is executable (cargo build)",
    })?;
    let out_rx = read_in_background(child.stdout.take());
    let err_rx = read_in_background(child.stderr.take());
    let start = Instant::now();
    // The command's stdout, once its pipe has closed.
    let mut stdout: Option<Vec<u8>> = None;
    // After the pipe closed: how long to sleep before looking at the child again.
    let mut reap_poll = Duration::from_micros(100);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() >= timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(HarnessError::CommandTimeout {
                    command,
                    waited: timeout,
                    stdout: match stdout {
                        Some(b) => String::from_utf8_lossy(&b).into_owned(),
                        None => collect(&out_rx, Duration::from_millis(500)),
                    },
                    stderr: collect(&err_rx, Duration::from_millis(500)),
                });
            }
            // A command's pipe closes when it exits: waiting on the pipe rather than sleeping
            // between looks sees a quick command done as soon as it is (`ctl` polls in a
            // loop; a 10 ms sleep here was a third of the time a 3-node domain takes to form).
            Ok(None) if stdout.is_none() => match out_rx.recv_timeout(POLL) {
                Ok(bytes) => stdout = Some(bytes),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => stdout = Some(Vec::new()),
            },
            // Closed but not yet reapable: the exit is under way, or the command closed its
            // stdout and runs on; look again soon, then less and less often.
            Ok(None) => {
                thread::sleep(reap_poll);
                reap_poll = (reap_poll * 2).min(POLL);
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(HarnessError::CommandFailed {
                    command,
                    status: format!("cannot wait for it: {e}"),
                    stdout: String::new(),
                    stderr: String::new(),
                });
            }
        }
    };
    // The pipes close when the process exits, unless it left a child holding them.
    let grace = Duration::from_secs(2);
    let stdout = stdout.map_or_else(|| out_rx.recv_timeout(grace), Ok);
    match (stdout, err_rx.recv_timeout(grace)) {
        (Ok(stdout), Ok(stderr)) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        _ => Err(HarnessError::CommandTimeout {
            command,
            waited: timeout,
            stdout: String::new(),
            stderr: format!(
                "({}, but a process it left behind still holds its stdout/stderr open)",
                describe_status(&status)
            ),
        }),
    }
}

/// Reads a pipe to its end on a helper thread; the bytes arrive on the returned channel.
fn read_in_background<R: Read + Send + 'static>(pipe: Option<R>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        let _ = tx.send(buf);
    });
    rx
}

/// Waits a little for a background read and renders it lossily.
fn collect(rx: &mpsc::Receiver<Vec<u8>>, wait: Duration) -> String {
    match rx.recv_timeout(wait) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(_) => "(not collected)".into(),
    }
}

/// Waits for `child` up to `timeout`, polling every 10 ms. `None` if it is still running.
pub(crate) fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if start.elapsed() >= timeout => return None,
            Ok(None) => thread::sleep(POLL),
            Err(_) => return None,
        }
    }
}

/// Pids of live processes (other than this one) whose arguments include every one of `args`
/// exactly, found through `/proc/*/cmdline`. Used to find a daemon that forked away from its
/// parent (DAEMONIZE=1), e.g. `find_pids_with_args(&["daemon", "/path/config.cfg"])`.
pub fn find_pids_with_args(args: &[&str]) -> Vec<u32> {
    let me = std::process::id();
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|&pid| {
            fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let argv: Vec<&[u8]> = c.split(|&b| b == 0).collect();
                args.iter().all(|a| argv.contains(&a.as_bytes()))
            })
        })
        .filter(|&pid| process_alive(pid))
        .collect();
    pids.sort_unstable();
    pids
}

/// Sends `sig` to process `pid` (one not started through a [`crate::Cluster`]).
pub fn send_signal(pid: u32, sig: nix::sys::signal::Signal) -> nix::Result<()> {
    let pid = i32::try_from(pid).map_err(|_| nix::errno::Errno::ESRCH)?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig)
}

/// True if `pid` exists and is not a zombie (a zombie has exited; only its parent's reap is
/// missing, which under some container inits never comes).
pub fn process_alive(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (comm) S ...": comm may hold spaces and parentheses, so look after the last ')'.
    match stat.rfind(')') {
        Some(i) => !matches!(stat[i + 1..].trim_start().chars().next(), Some('Z' | 'X')),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_output_and_status() {
        let out = run_with_timeout(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(10),
        )
        .expect("run sh");
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
        assert_eq!(out.status.code(), Some(3));
    }

    #[test]
    fn a_command_that_closes_its_stdout_is_still_waited_for() {
        // The wait follows stdout's end first; a command that closes it early and runs on is
        // still waited for to its exit, and what it printed before is kept.
        let start = Instant::now();
        let out = run_with_timeout(
            Command::new("sh").args([
                "-c",
                "echo early; exec >&-; sleep 0.3; echo late >&2; exit 4",
            ]),
            Duration::from_secs(10),
        )
        .expect("run sh");
        assert!(start.elapsed() >= Duration::from_millis(300));
        assert_eq!(out.stdout, b"early\n");
        assert_eq!(out.stderr, b"late\n");
        assert_eq!(out.status.code(), Some(4));
        // And one that closes it, then outlives the limit, is killed as any other.
        let err = run_with_timeout(
            Command::new("sh").args(["-c", "echo before; exec >&-; sleep 30"]),
            Duration::from_millis(300),
        )
        .expect_err("must time out");
        let text = err.to_string();
        assert!(
            text.contains("did not finish") && text.contains("before"),
            "{text}"
        );
    }

    #[test]
    fn kills_on_timeout() {
        let start = Instant::now();
        let err = run_with_timeout(
            Command::new("sh").args(["-c", "echo partial; sleep 30"]),
            Duration::from_millis(300),
        )
        .expect_err("must time out");
        assert!(start.elapsed() < Duration::from_secs(5));
        let text = err.to_string();
        assert!(text.contains("did not finish"), "{text}");
        assert!(text.contains("partial"), "{text}");
    }

    #[test]
    fn finds_a_process_by_argument() {
        let marker = format!("openimex-harness-marker-{}", std::process::id());
        // `cat - <marker>` blocks reading its stdin (kept open) and never forks.
        let mut child = Command::new("cat")
            .args(["-", &marker])
            .stdin(Stdio::piped())
            .spawn()
            .expect("spawn cat");
        // Until the child has exec'd, its cmdline is still ours.
        let start = Instant::now();
        let mut found = find_pids_with_args(&["-", &marker]);
        while found.is_empty() && start.elapsed() < Duration::from_secs(5) {
            thread::sleep(POLL);
            found = find_pids_with_args(&["-", &marker]);
        }
        assert_eq!(found, vec![child.id()]);
        assert!(find_pids_with_args(&["-", &marker, "absent-arg"]).is_empty());
        child.kill().expect("kill");
        child.wait().expect("wait");
        assert!(!process_alive(child.id()));
        assert!(find_pids_with_args(&[&marker]).is_empty());
    }
}
