//! `ctl -N --watch [--interval MS]`: the `-N` view, redrawn only when the domain changes.
//!
//! Every interval ctl asks the daemon for the domain and compares the reply with the last one
//! drawn; only a different reply is drawn. On a terminal each drawing clears the screen first
//! (ANSI); to a pipe or file the drawings follow each other with a separator line between. With
//! `-j` each drawing is one `-N -j` document on one line, so a consumer can read the stream
//! line by line; with `--links` the `--links` view is drawn instead. A call that fails is
//! reported on stderr once (until it changes) and the watch goes on, so it survives a daemon
//! restart, and a watch started before its daemon listens waits for it. It stops on SIGINT
//! (Ctrl-C) or SIGTERM, when `-t` elapses, or when its standard output is closed (checked
//! every interval, not only when writing), each with exit code 0.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use openimex_proto::cmd::DomainReply;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::{Client, CtlError, render};

/// Printed between drawings when standard output is not a terminal.
pub const SEPARATOR: &str =
    "========================================================================";

/// Clear the screen and home the cursor.
const CLEAR: &str = "\x1b[H\x1b[2J";

/// What to watch and how to draw it.
#[derive(Debug, Clone)]
pub struct Options {
    /// Time between two calls.
    pub interval: Duration,
    /// One `-N -j` document per line.
    pub json: bool,
    /// `-H`.
    pub hostnames: bool,
    /// Draw `--links` instead of `-N` (the daemon then sends each link's reason).
    pub links: bool,
    /// Stop then (`-t`).
    pub deadline: Option<Instant>,
}

/// How a drawing is set apart from the previous one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// The first drawing.
    First,
    /// Clear the terminal first.
    Clear,
    /// Print [`SEPARATOR`] first.
    Separator,
    /// Nothing between drawings (JSON lines).
    None,
}

/// How drawing `n` (0-based) is set apart, for a terminal or not, JSON or not.
pub fn frame(n: u64, tty: bool, json: bool) -> Frame {
    match (json, tty, n) {
        (true, _, _) => Frame::None,
        (false, true, _) => Frame::Clear,
        (false, false, 0) => Frame::First,
        (false, false, _) => Frame::Separator,
    }
}

/// One drawing of `reply` into `out`.
pub fn draw(
    out: &mut impl Write,
    reply: &DomainReply,
    opts: &Options,
    frame: Frame,
    stamp: &str,
) -> std::io::Result<()> {
    match frame {
        Frame::Clear => out.write_all(CLEAR.as_bytes())?,
        Frame::Separator => writeln!(out, "{SEPARATOR}")?,
        Frame::First | Frame::None => {}
    }
    match (opts.links, opts.json) {
        (true, true) => writeln!(out, "{}", render::links_json(reply))?,
        (true, false) => {
            writeln!(out, "{stamp}")?;
            out.write_all(render::links_text(reply).as_bytes())?;
        }
        (false, true) => {
            render::write_json(out, reply, stamp, opts.hostnames)?;
            out.write_all(b"\n")?;
        }
        (false, false) => render::write_table(out, reply, stamp, opts.hostnames)?,
    }
    out.flush()
}

/// Whether standard output is closed: a pipe whose reader went away reports an error or hang-up
/// when polled, without anything written.
fn stdout_closed() -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let stdout = std::io::stdout();
    let fd = std::os::fd::AsFd::as_fd(&stdout);
    let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(_) => fds[0].revents().is_some_and(|r| {
            r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP | PollFlags::POLLNVAL)
        }),
        Err(_) => false,
    }
}

/// Watches until stopped; see the module docs.
pub async fn run(client: &mut Client, opts: &Options) -> Result<(), CtlError> {
    let sig = |kind: SignalKind, name: &'static str| {
        signal(kind).map_err(|cause| CtlError::Signal {
            signal: name,
            cause,
        })
    };
    let mut int = sig(SignalKind::interrupt(), "SIGINT")?;
    let mut term = sig(SignalKind::terminate(), "SIGTERM")?;
    let tty = std::io::stdout().is_terminal();
    let mut last: Option<DomainReply> = None;
    let mut last_error: Option<String> = None;
    let mut drawn = 0u64;
    let far = Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600);
    let deadline = opts.deadline.unwrap_or(far);
    loop {
        let fetched = tokio::select! {
            r = client.domain(opts.links) => r,
            _ = int.recv() => return Ok(()),
            _ = term.recv() => return Ok(()),
            () = tokio::time::sleep_until(deadline) => return Ok(()),
        };
        match fetched {
            Ok(mut reply) => {
                last_error = None;
                if !opts.links {
                    // Counts of refused peer messages are not in the -N view: a change of
                    // them alone is no change to draw.
                    for n in &mut reply.nodes {
                        n.refusals.clear();
                    }
                }
                if last.as_ref() != Some(&reply) {
                    let stamp = crate::stamp();
                    let frame = frame(drawn, tty, opts.json);
                    crate::write_out(|w| draw(w, &reply, opts, frame, &stamp))?;
                    drawn += 1;
                    last = Some(reply);
                }
            }
            Err(e) => {
                let msg = e.to_string();
                if last_error.as_deref() != Some(msg.as_str()) {
                    eprintln!(
                        "{}: {msg} (still watching: asking again every {} ms)",
                        crate::program(),
                        opts.interval.as_millis()
                    );
                    last_error = Some(msg);
                }
            }
        }
        if stdout_closed() {
            return Ok(());
        }
        tokio::select! {
            () = tokio::time::sleep(opts.interval) => {}
            _ = int.recv() => return Ok(()),
            _ = term.recv() => return Ok(()),
            () = tokio::time::sleep_until(deadline) => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(json: bool, links: bool) -> Options {
        Options {
            interval: Duration::from_millis(100),
            json,
            hostnames: false,
            links,
            deadline: None,
        }
    }

    fn reply(state: &str) -> DomainReply {
        DomainReply {
            local_node_id: 0,
            nodes: vec![openimex_proto::cmd::NodeReport {
                host: "10.0.0.1".into(),
                state: state.into(),
                reachable: true,
                cells: vec![openimex_core::ConnStatus::Connected.cell(true)],
                ..Default::default()
            }],
            status: if state == "READY" { "UP" } else { "DOWN" }.into(),
        }
    }

    fn drawn(frames: &[(Frame, &str)], o: &Options) -> String {
        let mut out = Vec::new();
        for (f, state) in frames {
            draw(&mut out, &reply(state), o, *f, "12/3/2026 10:00:00.000").expect("draw");
        }
        String::from_utf8(out).expect("UTF-8")
    }

    #[test]
    fn frames_clear_a_terminal_and_separate_a_pipe() {
        assert_eq!(frame(0, true, false), Frame::Clear);
        assert_eq!(frame(3, true, false), Frame::Clear);
        assert_eq!(frame(0, false, false), Frame::First);
        assert_eq!(frame(1, false, false), Frame::Separator);
        assert_eq!(frame(0, true, true), Frame::None);
        assert_eq!(frame(5, false, true), Frame::None);
        let o = opts(false, false);
        let text = drawn(
            &[(Frame::First, "READY"), (Frame::Separator, "SHUTTING_DOWN")],
            &o,
        );
        assert_eq!(text.matches(SEPARATOR).count(), 1, "{text}");
        assert_eq!(text.matches("Domain State:").count(), 2, "{text}");
        let tty = drawn(&[(Frame::Clear, "READY")], &o);
        assert!(tty.starts_with(CLEAR), "{tty:?}");
    }

    #[test]
    fn json_drawings_are_one_document_per_line() {
        let o = opts(true, false);
        let text = drawn(
            &[(Frame::None, "READY"), (Frame::None, "SHUTTING_DOWN")],
            &o,
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        for l in &lines {
            let v: serde_json::Value = serde_json::from_str(l).expect("each line is JSON");
            assert!(v["status"].is_string());
        }
        let links = drawn(&[(Frame::None, "SHUTTING_DOWN")], &opts(true, true));
        let v: serde_json::Value = serde_json::from_str(links.trim()).expect("JSON");
        assert!(
            v["nodes"][0]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("shutting down"))
        );
    }
}
