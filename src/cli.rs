//! The entry point both binaries share: dispatch by the name the binary was run under
//! (`nvidia-imex`, `nvidia-imex-ctl`), then by subcommand — verbatim subcommands first, whose
//! own parsers take NVIDIA's flags, then the clap-parsed ones — and turn an error into one
//! line on stderr and exit status 1.

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

use clap::Subcommand;

/// A subcommand whose own parser takes its arguments verbatim, with the program name that
/// parser expects: NVIDIA's flags (-nogpu, -i IP PORT, --u=PATH) are not clap-shaped, and these
/// parsers print their own help. Invoked through a link named like the program, the binary
/// behaves as that program.
#[derive(Debug, Clone, Copy)]
pub struct Passthrough {
    /// `openimex NAME`.
    pub name: &'static str,
    /// The program name its parser expects (also a link name when it has no space).
    pub program: &'static str,
    /// One line for `openimex --help`.
    pub about: &'static str,
    /// Its entry point, given its program name and arguments.
    pub run: fn(Vec<OsString>) -> ExitCode,
}

/// Runs the binary `program`: a [`Passthrough`] chosen by the name it was run under or by
/// its first argument, else the clap subcommands `C` (listed in the help beside the verbatim
/// ones) handed to `run`.
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
        args.splice(0..2, [OsString::from(p.program)]);
        return (p.run)(args);
    }
    let root = clap::Command::new(program)
        .version(env!("CARGO_PKG_VERSION"))
        .about(about)
        .subcommand_required(true)
        .arg_required_else_help(true);
    let command = passthrough
        .iter()
        .fold(C::augment_subcommands(root), |c, p| {
            c.subcommand(clap::Command::new(p.name).about(p.about))
        });
    let command = match C::from_arg_matches(&command.get_matches_from(args)) {
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
            ExitCode::from(1)
        }
    }
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
