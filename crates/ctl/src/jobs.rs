//! `ctl jobs [NAME]`: the jobs the local daemon holds (openimex's, from its job files) as a
//! table or JSON, or one job's state word for a prolog to wait on.

use openimex_proto::cmd::{JobReport, JobsReply};
use serde_json::json;

use crate::error::CtlError;

/// What `ctl jobs` prints for `reply`: with `name`, that job's state word (JSON: the job's
/// object); else every job, and the quarantined channels.
pub fn render(reply: &JobsReply, name: Option<&str>, json_out: bool) -> Result<String, CtlError> {
    if let Some(name) = name {
        let Some(job) = reply.jobs.iter().find(|j| j.name == name) else {
            return Err(CtlError::NoSuchJob {
                name: name.to_string(),
                known: reply.jobs.iter().map(|j| j.name.clone()).collect(),
            });
        };
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
             its processes may remain): {}\n",
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
        assert!(text.ends_with("Quarantined channels (a job that ended held them; not given to another job while its processes may remain): 5\n"), "{text}");
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
