//! Errors of the control client.

/// What went wrong, phrased for the operator.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// Bad command line.
    #[error("{0}")]
    Usage(String),
    /// The config file given with `-c` is unusable.
    #[error(transparent)]
    Config(Box<openimex_config::ConfigError>),
    /// The node file named by the config cannot be read (NVIDIA exits 255; DCGM greps the text).
    #[error(transparent)]
    NodeFile(Box<openimex_config::ConfigError>),
    /// The command service is not configured in the config file.
    #[error(
        "the command service is disabled in {path} (IMEX_CMD_ENABLED={enabled}, IMEX_CMD_PORT and IMEX_CMD_UNIX_DOMAIN_PATH {ports}): enable it there, or point ctl at the daemon with -i IP PORT or -u PATH"
    )]
    NoCommandService {
        /// The config file.
        path: String,
        /// IMEX_CMD_ENABLED.
        enabled: u8,
        /// Whether the endpoints are set.
        ports: &'static str,
    },
    /// No daemon answered.
    #[error(
        "cannot reach the IMEX daemon's command service at {target}: {cause}. Is the daemon running (systemctl status nvidia-imex, or openimex daemon -c CFG)? Check IMEX_CMD_PORT / IMEX_CMD_UNIX_DOMAIN_PATH"
    )]
    Connect {
        /// Where we tried.
        target: String,
        /// Why it failed.
        cause: String,
    },
    /// The daemon accepted the connection but did not answer in time.
    #[error(
        "the IMEX daemon's command service at {target} accepted the connection but did not answer within {secs} s. Is the daemon hung or overloaded (see its log, LOG_FILE_NAME)?"
    )]
    NoAnswer {
        /// Where we asked.
        target: String,
        /// How long we waited.
        secs: u64,
    },
    /// The daemon answered, but ctl could not take the reply (too large, undecodable).
    #[error("the IMEX daemon at {target} answered, but ctl rejected its reply: {cause}")]
    Rejected {
        /// Who answered.
        target: String,
        /// Why the reply was rejected, and what to do.
        cause: String,
    },
    /// The daemon answered with an error.
    #[error("the IMEX daemon at {target} answered with an error ({code}): {message}")]
    Daemon {
        /// Who answered.
        target: String,
        /// The gRPC status code.
        code: String,
        /// The daemon's message.
        message: String,
    },
    /// `ctl jobs NAME`: the daemon holds no such job.
    #[error(
        "no job {name} on this daemon (it holds {}): is its job file in OPENIMEX_JOBS_DIR on this node?",
        if known.is_empty() { "none".to_string() } else { known.join(", ") }
    )]
    NoSuchJob {
        /// The job asked for.
        name: String,
        /// The jobs it holds.
        known: Vec<String>,
    },
    /// `jobs wait`: the job did not stand as asked within the time given.
    #[error(
        "job {name} is {state}, not {want}, after {secs} s{}",
        if nodes.is_empty() { String::new() } else { format!(" (nodes {})", nodes.join(",")) }
    )]
    JobNotReached {
        /// The job.
        name: String,
        /// The state waited for (or GONE).
        want: String,
        /// Its state then ("not held on this daemon" when it holds no such job).
        state: String,
        /// The members the state names.
        nodes: Vec<String>,
        /// How long ctl waited.
        secs: u64,
    },
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    /// `--watch` cannot catch SIGINT/SIGTERM to stop cleanly.
    #[error("cannot watch for {signal} to stop --watch cleanly: {cause}")]
    Signal {
        /// The signal.
        signal: &'static str,
        /// Why.
        cause: std::io::Error,
    },
    /// `--svg FILE` cannot be written.
    #[error(
        "cannot write the domain picture to {path}: {cause}. Does its directory exist, and may this user write there?"
    )]
    WriteFile {
        /// The file.
        path: String,
        /// Why.
        cause: std::io::Error,
    },
    /// `domain-check`: the daemon answered, and not every host is a READY member.
    #[error(
        "{failed} of {total} host(s) are not READY members of node {local}'s domain (the lines above say why)"
    )]
    NotAllReady {
        /// Hosts that failed.
        failed: usize,
        /// Hosts asked about.
        total: usize,
        /// The node asked.
        local: u32,
    },
    /// Writing the output failed.
    #[error("cannot write output: {0}")]
    Output(std::io::Error),
}

impl CtlError {
    /// The process exit code for this error, as NVIDIA's ctl uses them.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::NodeFile(_) => 255,
            _ => 1,
        }
    }
}
