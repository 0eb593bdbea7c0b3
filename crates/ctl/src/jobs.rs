//! `ctl jobs [NAME]`: the jobs the local daemon holds (openimex's, from its job files) as a
//! table or JSON, or one job's state word; `ctl jobs create | end | wait` to define a job on
//! this node (the daemon writes its job file), end it (deletes the file) and wait, without
//! polling, until it is READY (or another state) here; `ctl jobs clear` to release an ended
//! job's channel from quarantine once its processes are gone.

use std::time::Duration;

use openimex_proto::cmd::{JobCreateRequest, JobReport, JobsReply};
use serde_json::json;

use crate::Client;
use crate::error::CtlError;

/// `ctl jobs` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Action {
    /// Every job on this daemon (as `ctl jobs`).
    List,
    /// Define job NAME on this node: the daemon writes NAME.job into its OPENIMEX_JOBS_DIR, as a
    /// prolog would, and answers once it holds the job (the same definition again changes
    /// nothing). Run it on every member. Taken only on the command unix socket (root).
    Create {
        /// The job's name (1 to 64 letters, digits, '-', '_', '.').
        #[arg(value_name = "NAME")]
        name: String,
        /// The IMEX channel its processes open.
        #[arg(long, value_name = "N")]
        channel: u32,
        /// Member nodes, as the nodes file writes them (comma-separated, or repeated).
        #[arg(long, value_name = "HOST,...", value_delimiter = ',', required = true)]
        members: Vec<String>,
        /// uid:gid that may open the channel (mode 0660); without it, root only (0600).
        #[arg(long, value_name = "UID:GID")]
        owner: Option<String>,
    },
    /// End job NAME on this node: the daemon deletes NAME.job; no new import under it from now.
    End {
        /// The job.
        #[arg(value_name = "NAME")]
        name: String,
    },
    /// Release CHANNEL from quarantine on this node: your word that no process of the job that
    /// ended holding it remains here (a Slurm epilog runs once the job's processes are gone).
    /// Until then, or a reboot, no other job gets the channel on this node: a stray process of
    /// the ended job could still export on it. Taken only on the command unix socket (root).
    Clear {
        /// The channel.
        #[arg(value_name = "CHANNEL")]
        channel: u32,
    },
    /// Wait until job NAME is READY on this daemon (or --state), then print the state word;
    /// exit 1 after --timeout naming its state and the nodes it waits on. A job not defined yet
    /// is waited for too. The daemon answers at once when the job gets there: no polling.
    Wait {
        /// The job.
        #[arg(value_name = "NAME")]
        name: String,
        /// FORMING, READY, DEGRADED, DISAGREED, or GONE (ended here).
        #[arg(long, value_name = "STATE", default_value = "READY")]
        state: String,
        /// Seconds to wait at most (up to 3600).
        #[arg(long, value_name = "SECONDS", default_value_t = 120)]
        timeout: u64,
    },
}

/// Performs `action` and says what happened.
pub async fn act(client: &mut Client, action: Action, json_out: bool) -> Result<String, CtlError> {
    match action {
        Action::List => render(&client.jobs().await?, None, json_out),
        Action::Create {
            name,
            channel,
            members,
            owner,
        } => {
            let req = JobCreateRequest {
                name: name.clone(),
                channel,
                members,
                owner: owner.unwrap_or_default(),
            };
            let reply = client.job_create(req).await?;
            if json_out {
                let job = reply.job.as_ref().map(job_json);
                let doc = json!({ "file": reply.file, "written": reply.written, "job": job });
                return Ok(format!("{doc}\n"));
            }
            let what = match reply.written {
                true => "created",
                false => "was defined so already",
            };
            let state = match &reply.job {
                Some(j) => state_words(j),
                None => "not defined by the daemon within 5 s: its log says why (e.g. a channel \
                         another job holds here, or one still quarantined)"
                    .to_string(),
            };
            Ok(format!("job {name} {what} ({}): {state}\n", reply.file))
        }
        Action::End { name } => {
            let reply = client.job_end(&name).await?;
            if json_out {
                let doc = json!({ "file": reply.file, "ended": reply.ended });
                return Ok(format!("{doc}\n"));
            }
            Ok(match reply.ended {
                true => format!("job {name} ended ({} deleted)\n", reply.file),
                false => format!(
                    "{} deleted; the daemon has not ended job {name} yet (see its log)\n",
                    reply.file
                ),
            })
        }
        Action::Clear { channel } => {
            let ended = client.job_channel_clear(channel).await?.ended;
            if json_out {
                let ended = (!ended.is_empty()).then_some(ended);
                return Ok(format!(
                    "{}\n",
                    json!({ "channel": channel, "ended": ended })
                ));
            }
            Ok(match ended.is_empty() {
                true => format!("channel {channel} was in no quarantine on this node\n"),
                false => format!(
                    "channel {channel} released (job {ended} ended holding it); another job may \
                     have it\n"
                ),
            })
        }
        Action::Wait {
            name,
            state,
            timeout,
        } => {
            let want = state.to_ascii_uppercase();
            let reply = client
                .job_wait(&name, &want, Duration::from_secs(timeout))
                .await?;
            if !reply.reached {
                let (state, nodes) = match &reply.job {
                    Some(j) => (
                        j.state.clone(),
                        j.nodes.iter().map(u32::to_string).collect(),
                    ),
                    None => ("not held on this daemon".to_string(), Vec::new()),
                };
                return Err(CtlError::JobNotReached {
                    name,
                    want,
                    state,
                    nodes,
                    secs: timeout,
                });
            }
            Ok(match (json_out, &reply.job) {
                (true, Some(j)) => format!("{}\n", job_json(j)),
                (true, None) => format!("{}\n", json!({ "name": name, "state": "GONE" })),
                (false, Some(j)) => format!("{}\n", j.state),
                (false, None) => "GONE\n".to_string(),
            })
        }
    }
}

/// "READY", or "FORMING on this node, waiting on nodes 2,3".
fn state_words(j: &JobReport) -> String {
    let on = match j.state.as_str() {
        "FORMING" => "waiting on",
        "DEGRADED" => "lost",
        "DISAGREED" => "defined otherwise on",
        _ => return format!("{} on this node", j.state),
    };
    format!("{} on this node, {on} nodes {}", j.state, ids(&j.nodes))
}

/// Job `name` of `reply`, or why there is none (naming the jobs there are).
pub fn find<'a>(reply: &'a JobsReply, name: &str) -> Result<&'a JobReport, CtlError> {
    (reply.jobs.iter().find(|j| j.name == name)).ok_or_else(|| CtlError::NoSuchJob {
        name: name.to_string(),
        known: reply.jobs.iter().map(|j| j.name.clone()).collect(),
    })
}

/// What `ctl jobs` prints for `reply`: with `name`, that job's state word (JSON: the job's
/// object); else every job, and the quarantined channels.
pub fn render(reply: &JobsReply, name: Option<&str>, json_out: bool) -> Result<String, CtlError> {
    if let Some(name) = name {
        let job = find(reply, name)?;
        return Ok(match json_out {
            true => format!("{}\n", job_json(job)),
            false => format!("{}\n", job.state),
        });
    }
    if json_out {
        let jobs: Vec<_> = reply.jobs.iter().map(job_json).collect();
        let doc = json!({ "jobs": jobs, "quarantinedChannels": reply.quarantined });
        return Ok(format!("{doc}\n"));
    }
    if reply.jobs.is_empty() && reply.quarantined.is_empty() {
        return Ok("No jobs on this node.\n".to_string());
    }
    let mut text = format!(
        "{:<24} {:>7} {:<10} {:<20} {}\n",
        "JOB", "CHANNEL", "STATE", "MEMBERS", "WAITING ON / LOST / DISAGREEING"
    );
    for j in &reply.jobs {
        text += &format!(
            "{:<24} {:>7} {:<10} {:<20} {}\n",
            j.name,
            j.channel,
            j.state,
            ids(&j.members),
            ids(&j.nodes)
        );
    }
    if !reply.quarantined.is_empty() {
        text += &format!(
            "Quarantined channels (a job that ended held them; not given to another job while \
             its processes may remain: `ctl jobs clear N` once they are gone): {}\n",
            ids(&reply.quarantined)
        );
    }
    Ok(text)
}

fn job_json(j: &JobReport) -> serde_json::Value {
    json!({
        "name": j.name,
        "channel": j.channel,
        "members": j.members,
        "state": j.state,
        "nodes": j.nodes,
        "owner": j.owner,
    })
}

fn ids(ids: &[u32]) -> String {
    ids.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply() -> JobsReply {
        JobsReply {
            jobs: vec![
                JobReport {
                    name: "1234".into(),
                    channel: 7,
                    members: vec![0, 1, 2],
                    state: "FORMING".into(),
                    nodes: vec![2],
                    owner: String::new(),
                },
                JobReport {
                    name: "k8s-a".into(),
                    channel: 8,
                    members: vec![0, 3],
                    state: "READY".into(),
                    nodes: vec![],
                    owner: "1000:1000".into(),
                },
            ],
            quarantined: vec![5],
        }
    }

    #[test]
    fn one_job_is_its_state_word_and_an_unknown_one_is_named() {
        assert_eq!(render(&reply(), Some("k8s-a"), false).unwrap(), "READY\n");
        let e = render(&reply(), Some("999"), false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no job 999 on this daemon (it holds 1234, k8s-a): is its job file in \
             OPENIMEX_JOBS_DIR on this node?"
        );
        assert_eq!(e.exit_code(), 1);
    }

    #[test]
    fn every_job_as_a_table_and_as_json() {
        let text = render(&reply(), None, false).unwrap();
        assert!(text.contains("1234") && text.contains("FORMING") && text.contains("0,1,2"));
        assert!(text.ends_with("Quarantined channels (a job that ended held them; not given to another job while its processes may remain: `ctl jobs clear N` once they are gone): 5\n"), "{text}");
        let doc: serde_json::Value =
            serde_json::from_str(&render(&reply(), None, true).unwrap()).unwrap();
        assert_eq!(doc["jobs"][1]["owner"], "1000:1000");
        assert_eq!(doc["jobs"][0]["nodes"][0], 2);
        assert_eq!(doc["quarantinedChannels"][0], 5);
        let none = JobsReply::default();
        assert_eq!(
            render(&none, None, false).unwrap(),
            "No jobs on this node.\n"
        );
    }
}
