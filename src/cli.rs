//! The entry point both binaries share: dispatch by the name the binary was run under
//! (`nvidia-imex`, `nvidia-imex-ctl`), then by subcommand — verbatim subcommands first, whose
//! own parsers take NVIDIA's flags, then the clap-parsed ones — and turn an error into one
//! line on stderr and exit status 1 (2 for a [`UsageError`], as clap's own). `man --out DIR`
//! writes a man page for every command from the same clap definitions ([`write_man_pages`]).

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;

/// A subcommand whose own parser takes its arguments verbatim: NVIDIA's flags (-nogpu,
/// -i IP PORT, --u=PATH) are not clap-shaped. Invoked through a link named like the program,
/// the binary behaves as that program.
#[derive(Debug, Clone, Copy)]
pub struct Passthrough {
    /// `openimex NAME`.
    pub name: &'static str,
    /// The program it stands for: run through a link of this name (when it has no space), the
    /// binary is that program.
    pub program: &'static str,
    /// Its command line as clap describes it, given the name it goes by (`openimex ctl`): its
    /// line in `openimex --help`, `help NAME` and its man page.
    pub command: fn(&str) -> clap::Command,
    /// Its entry point, given its arguments; the first is the name it goes by: `openimex NAME`
    /// (the binary's name and this one's) as a subcommand, the link's path through a link.
    pub run: fn(Vec<OsString>) -> ExitCode,
}

/// A command line that cannot run as given, found after clap parsed it (a value that does
/// not fit the others): `entry` prints it and exits with status 2, as clap does for its own.
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// The subcommand every binary has beside its own: `man --out DIR`.
const MAN: &str = "man";

/// Runs the binary `program`: a [`Passthrough`] chosen by the name it was run under or by
/// its first argument, else the clap subcommands `C` (listed in the help beside the verbatim
/// ones) handed to `run`, or `man`.
pub fn entry<C: Subcommand>(
    program: &'static str,
    about: &'static str,
    passthrough: &[Passthrough],
    run: impl FnOnce(C) -> anyhow::Result<ExitCode>,
) -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    let argv0 = args
        .first()
        .map(|a| Path::new(a).file_name().unwrap_or_default().to_owned())
        .unwrap_or_default();
    if let Some(p) = passthrough
        .iter()
        .find(|p| argv0 == p.program && !p.program.contains(' '))
    {
        return (p.run)(args);
    }
    let sub = args.get(1).and_then(|a| a.to_str()).unwrap_or_default();
    if let Some(p) = passthrough.iter().find(|p| p.name == sub) {
        args.splice(0..2, [OsString::from(format!("{program} {}", p.name))]);
        return (p.run)(args);
    }
    let command = root_command::<C>(program, about, passthrough);
    let matches = match command.clone().try_get_matches_from(args) {
        Ok(m) => m,
        Err(e) => e.exit(),
    };
    if let Some((MAN, m)) = matches.subcommand() {
        let dir = m.get_one::<PathBuf>("out").cloned().unwrap_or_default();
        return match write_man_pages(command, &dir) {
            Ok(pages) => {
                println!(
                    "{program}: wrote {} man pages to {}",
                    pages.len(),
                    dir.display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{program}: {}", error_text(&e));
                ExitCode::from(1)
            }
        };
    }
    let command = match C::from_arg_matches(&matches) {
        Ok(command) => command,
        Err(e) => e.exit(),
    };
    match run(command) {
        Ok(code) => code,
        Err(e) => {
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            eprintln!("{program}: {}", error_text(&e));
            if e.chain().any(|c| c.is::<UsageError>()) {
                return ExitCode::from(2);
            }
            ExitCode::from(1)
        }
    }
}

/// The binary `program`'s whole command line: the clap subcommands `C`, the verbatim ones
/// (each with its own definition) and `man`.
pub fn root_command<C: Subcommand>(
    program: &'static str,
    about: &'static str,
    passthrough: &[Passthrough],
) -> clap::Command {
    let root = clap::Command::new(program)
        .version(env!("CARGO_PKG_VERSION"))
        .subcommand_required(true)
        .arg_required_else_help(true);
    let command = passthrough
        .iter()
        .fold(C::augment_subcommands(root), |c, p| {
            c.subcommand((p.command)(&format!("{program} {}", p.name)).name(p.name))
        })
        // After the derived subcommands, whose enum's doc comment would be the about otherwise.
        .about(about);
    command.subcommand(
        clap::Command::new(MAN)
            .about("Write a man page (roff, section 1) for each command of this binary into DIR")
            .arg(
                clap::Arg::new("out")
                    .long("out")
                    .value_name("DIR")
                    .required(true)
                    .value_parser(clap::value_parser!(PathBuf))
                    .help(
                        "Directory for the pages, created if missing; existing pages are replaced",
                    ),
            ),
    )
}

/// Writes a man page for `command` and each of its subcommands, recursively (hidden ones
/// excepted), into `dir`: `openimex.1`, `openimex-ctl.1`, `openimex-channels-create.1`, ...
/// Returns the pages written.
pub fn write_man_pages(command: clap::Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    fn walk(
        cmd: &clap::Command,
        dir: &Path,
        source: &str,
        pages: &mut Vec<PathBuf>,
    ) -> std::io::Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(sub, dir, source, pages)?;
        }
        let page = clap_mangen::Man::new(cmd.clone())
            .source(source.to_owned())
            .manual("openimex");
        pages.push(page.generate_to(dir)?);
        Ok(())
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut command = command.disable_help_subcommand(true);
    command.build();
    let source = format!("{} {}", command.get_name(), env!("CARGO_PKG_VERSION"));
    let mut pages = Vec::new();
    walk(&command, dir, &source, &mut pages)
        .with_context(|| format!("cannot write the man pages into {}", dir.display()))?;
    pages.sort();
    Ok(pages)
}

/// The error and its causes on one line, skipping a cause whose text the message already holds
/// (several error types print their source themselves).
pub fn error_text(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
    }
    msg
}
