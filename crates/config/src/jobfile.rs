//! Job files: one small file per job in `OPENIMEX_JOBS_DIR`, written by whatever starts the job
//! on a node (a Slurm prolog, a Kubernetes node agent) and deleted to end it.
//!
//! # Format
//!
//! The file is `<job name>.job`; the name is the file's stem (letters, digits, `-`, `_`, `.`,
//! at most 64), so one file is one job and deleting it ends exactly that job. Lines are
//! `KEY=value` as in `config.cfg`, with `#` comments and blank lines:
//!
//! ```text
//! # written by the prolog of Slurm job 1234
//! CHANNEL=7
//! MEMBERS=node-a,node-b,10.0.0.3
//! OWNER=1000:1000
//! ```
//!
//! - `CHANNEL` (required): the IMEX channel the job's processes open (`channelN`).
//! - `MEMBERS` (required): the member nodes, as the nodes file writes them (names compare
//!   case-insensitively, addresses by value), comma-separated; may repeat to continue a long
//!   list. A member must be an entry of the nodes file: a job is a part of the domain, and a
//!   node's ID is its line there.
//! - `OWNER` (optional): `uid:gid` that may open the channel (mode 0660); without it the
//!   channel is root's (0600).
//!
//! Every problem is an error naming the file, the line and the value, with the fix; the daemon
//! ignores that job (and says so) and goes on with the others.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::ConfigError;
use crate::nodes::NodeConfig;

/// The suffix of a job file.
pub const JOB_FILE_SUFFIX: &str = ".job";
/// Longest job name.
pub const MAX_JOB_NAME: usize = 64;
/// The most IMEX channels a driver can have (`NVreg_ImexChannelCount` at its maximum, 2^20,
/// docs/reference/driver-interface.md §2): a channel at or past it names no device on any node.
pub const MAX_CHANNELS: u32 = 1 << 20;
/// Largest job file read (a job file is a few lines; anything bigger is not one).
pub const MAX_JOB_FILE: u64 = 64 * 1024;

/// A job as its file defines it, its members resolved to node IDs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobFile {
    /// The file.
    pub path: PathBuf,
    /// The job's name (the file's stem).
    pub name: String,
    /// `CHANNEL`.
    pub channel: u32,
    /// `MEMBERS`, as node IDs of the nodes file.
    pub members: BTreeSet<u16>,
    /// `OWNER` (uid, gid).
    pub owner: Option<(u32, u32)>,
}

impl JobFile {
    /// The job name a file at `path` would define: its stem, when the file ends in `.job` and
    /// the stem is a valid name.
    pub fn name_of(path: &Path) -> Option<String> {
        let file = path.file_name()?.to_str()?;
        let stem = file.strip_suffix(JOB_FILE_SUFFIX)?;
        valid_name(stem).then(|| stem.to_string())
    }

    /// Reads and parses the job file at `path` against `nodes`.
    pub fn load(path: &Path, nodes: &NodeConfig) -> Result<JobFile, ConfigError> {
        let io = |source| ConfigError::JobFileIo {
            path: path.to_owned(),
            source,
        };
        let len = std::fs::metadata(path).map_err(io)?.len();
        if len > MAX_JOB_FILE {
            return Err(ConfigError::JobFile {
                path: path.to_owned(),
                line: 0,
                problem: format!("{len} bytes is no job file (at most {MAX_JOB_FILE})"),
                fix: "write CHANNEL=, MEMBERS= and OWNER= lines only".into(),
            });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        Self::parse(&text, path, nodes)
    }

    /// Parses `text`, the contents of the job file at `path`, against `nodes`.
    pub fn parse(text: &str, path: &Path, nodes: &NodeConfig) -> Result<JobFile, ConfigError> {
        let err = |line: usize, problem: String, fix: &str| ConfigError::JobFile {
            path: path.to_owned(),
            line,
            problem,
            fix: fix.into(),
        };
        let name = Self::name_of(path).ok_or_else(|| {
            err(
                0,
                "the file name is no job name".into(),
                "name the file <job>.job, the job name of 1 to 64 letters, digits, '-', '_' or '.'",
            )
        })?;
        let (mut channel, mut members, mut owner) = (None, BTreeSet::new(), None);
        let mut any_members = false;
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let content = raw.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            let Some((key, value)) = content.split_once('=') else {
                return Err(err(
                    line,
                    format!("line {:?} is not KEY=value", clip(content)),
                    "write CHANNEL=, MEMBERS= or OWNER= lines, # for a comment",
                ));
            };
            let (key, value) = (key.trim(), value.trim());
            match key {
                "CHANNEL" => {
                    let c = value.parse::<u32>().map_err(|_| {
                        err(
                            line,
                            format!("CHANNEL={:?} is not a channel number", clip(value)),
                            "write the channel's number, e.g. CHANNEL=7 for channel7",
                        )
                    })?;
                    if c >= MAX_CHANNELS {
                        return Err(err(
                            line,
                            format!("CHANNEL={c} is past the last channel the driver can have"),
                            "give a channel below the driver's NVreg_ImexChannelCount (2048 by \
                             default, at most 1048576)",
                        ));
                    }
                    if channel.replace(c).is_some() {
                        return Err(err(
                            line,
                            "CHANNEL is set twice".into(),
                            "a job has one channel: keep one CHANNEL line",
                        ));
                    }
                }
                "MEMBERS" => {
                    any_members = true;
                    for member in value.split(',').map(str::trim).filter(|m| !m.is_empty()) {
                        let id = node_id(nodes, member).ok_or_else(|| {
                            err(
                                line,
                                format!(
                                    "member {:?} is not an entry of the nodes file {}",
                                    clip(member),
                                    nodes.path.display()
                                ),
                                "list members as the nodes file writes them (a name or an \
                                 address of one of its lines)",
                            )
                        })?;
                        members.insert(id);
                    }
                }
                "OWNER" => {
                    let parsed = value.split_once(':').and_then(|(u, g)| {
                        Some((u.trim().parse::<u32>().ok()?, g.trim().parse::<u32>().ok()?))
                    });
                    let Some(o) = parsed else {
                        return Err(err(
                            line,
                            format!("OWNER={:?} is not uid:gid", clip(value)),
                            "write the numeric user and group IDs, e.g. OWNER=1000:1000",
                        ));
                    };
                    owner = Some(o);
                }
                other => {
                    return Err(err(
                        line,
                        format!("unknown key {:?}", clip(other)),
                        "a job file has CHANNEL=, MEMBERS= and OWNER= only",
                    ));
                }
            }
        }
        let Some(channel) = channel else {
            return Err(err(
                0,
                "no CHANNEL line".into(),
                "add CHANNEL=<n>, the channel the job's processes open",
            ));
        };
        if !any_members || members.is_empty() {
            return Err(err(
                0,
                "no members".into(),
                "add MEMBERS=<node>,<node>,… naming the job's nodes as the nodes file does",
            ));
        }
        Ok(JobFile {
            path: path.to_owned(),
            name,
            channel,
            members,
            owner,
        })
    }
}

/// Whether `name` is a job name: 1 to [`MAX_JOB_NAME`] letters, digits, `-`, `_`, `.`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_JOB_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The node ID of `member` in `nodes`: the entry written the same way (names
/// case-insensitively, addresses by value); placeholders name no node.
fn node_id(nodes: &NodeConfig, member: &str) -> Option<u16> {
    let ip = member.parse::<IpAddr>().ok().map(|ip| ip.to_canonical());
    let index = nodes.entries.iter().position(|e| {
        !e.is_placeholder()
            && match (ip, e.ip()) {
                (Some(a), Some(b)) => a == b.to_canonical(),
                (None, None) => e.host.eq_ignore_ascii_case(member),
                _ => false,
            }
    })?;
    u16::try_from(index).ok()
}

/// At most 120 characters of a value for a message.
fn clip(s: &str) -> String {
    crate::error::Clip(s).to_string()
}

#[cfg(test)]
mod tests {
    use super::{JobFile, MAX_JOB_NAME};
    use crate::nodes::NodeConfig;
    use std::path::Path;

    fn nodes() -> NodeConfig {
        let text = "node-a\nNode-B\n0.0.0.0\n10.0.0.3\n";
        NodeConfig::parse(text, Path::new("/etc/nvidia-imex/nodes_config.cfg")).unwrap()
    }

    fn parse(name: &str, text: &str) -> Result<JobFile, String> {
        JobFile::parse(text, &Path::new("/run/jobs").join(name), &nodes())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_job_file_names_its_channel_members_and_owner() {
        let job = parse(
            "1234.job",
            "# prolog of job 1234\nCHANNEL=7\nMEMBERS=node-a, node-b # two\nMEMBERS=10.0.0.3\n\
             OWNER=1000:100\n",
        )
        .unwrap();
        assert_eq!(job.name, "1234");
        assert_eq!(job.channel, 7);
        assert_eq!(job.members.into_iter().collect::<Vec<_>>(), [0, 1, 3]);
        assert_eq!(job.owner, Some((1000, 100)));
        let root = parse("k8s-domain.1.job", "CHANNEL=0\nMEMBERS=node-a\n").unwrap();
        assert_eq!((root.name.as_str(), root.owner), ("k8s-domain.1", None));
    }

    #[test]
    fn a_file_that_vanished_or_is_too_big_is_refused_with_its_path() {
        let dir = std::env::temp_dir().join(format!("openimex-jobfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let gone = JobFile::load(&dir.join("gone.job"), &nodes()).unwrap_err();
        assert!(
            gone.to_string().starts_with("cannot read job file "),
            "{gone}"
        );
        let big = dir.join("big.job");
        std::fs::write(&big, "#".repeat(100_000)).unwrap();
        let e = JobFile::load(&big, &nodes()).unwrap_err().to_string();
        assert!(e.contains("100000 bytes is no job file"), "{e}");
        let ok = dir.join("ok.job");
        std::fs::write(&ok, "CHANNEL=3\nMEMBERS=node-a\n").unwrap();
        assert_eq!(JobFile::load(&ok, &nodes()).unwrap().channel, 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn each_mistake_names_the_file_the_line_and_the_fix() {
        let cases = [
            (
                "j.job",
                "CHANNEL=7\nMEMBERS=node-z\n",
                "/run/jobs/j.job:2: member \"node-z\" is not an entry of the nodes file /etc/nvidia-imex/nodes_config.cfg; list members",
            ),
            (
                "j.job",
                "CHANNEL=7\nMEMBERS=0.0.0.0\n",
                "j.job:2: member \"0.0.0.0\" is not an entry",
            ),
            (
                "j.job",
                "CHANNEL=seven\nMEMBERS=node-a\n",
                "j.job:1: CHANNEL=\"seven\" is not a channel number; write the channel's number",
            ),
            (
                "j.job",
                "CHANNEL=1048576\nMEMBERS=node-a\n",
                "j.job:1: CHANNEL=1048576 is past the last channel the driver can have; give a \
                 channel below the driver's NVreg_ImexChannelCount",
            ),
            (
                "j.job",
                "CHANNEL=1\nCHANNEL=2\nMEMBERS=node-a\n",
                "j.job:2: CHANNEL is set twice",
            ),
            (
                "j.job",
                "MEMBERS=node-a\n",
                "j.job: no CHANNEL line; add CHANNEL=",
            ),
            (
                "j.job",
                "CHANNEL=1\nMEMBERS= , \n",
                "j.job: no members; add MEMBERS=",
            ),
            (
                "j.job",
                "CHANNEL=1\nMEMBERS=node-a\nOWNER=alice\n",
                "j.job:3: OWNER=\"alice\" is not uid:gid",
            ),
            (
                "j.job",
                "CHANNEL=1\nMEMBER=node-a\n",
                "j.job:2: unknown key \"MEMBER\"",
            ),
            (
                "j.job",
                "CHANNEL 1\n",
                "j.job:1: line \"CHANNEL 1\" is not KEY=value",
            ),
            (
                "bad name.job",
                "CHANNEL=1\nMEMBERS=node-a\n",
                "bad name.job: the file name is no job name; name the file <job>.job",
            ),
            (
                "j.txt",
                "CHANNEL=1\nMEMBERS=node-a\n",
                "j.txt: the file name is no job name",
            ),
        ];
        for (name, text, want) in cases {
            let got = parse(name, text).unwrap_err();
            assert!(
                got.contains(want),
                "{name} {text:?}:\n got {got}\nwant {want}"
            );
        }
        let long = format!("{}.job", "x".repeat(MAX_JOB_NAME + 1));
        assert!(parse(&long, "CHANNEL=1\nMEMBERS=node-a\n").is_err());
    }
}
