//! One node's jobs (`openimex_core::jobs`): definitions and their refusals, members comparing
//! definitions, readiness per job, the imports a job admits, and the quarantine of an ended
//! job's channel.

mod sim;

use openimex_core::NodeId;
use openimex_core::NodeMap;
use openimex_core::jobs::{DefineError, ImportRefusal, JobState, Jobs};
use sim::node::job;

/// Nodes 0–4; line 3 is a placeholder (no node runs at that ID).
fn map() -> NodeMap {
    NodeMap::new(
        ["10.0.0.1", "10.0.0.2", "10.0.0.3", "0.0.0.0", "10.0.0.5"]
            .map(String::from)
            .to_vec(),
    )
}

fn n(i: u16) -> NodeId {
    NodeId(i)
}

#[test]
fn a_definition_is_refused_with_the_job_the_thing_and_the_fix() {
    let mut jobs = Jobs::new(n(0));
    let m = map();
    let refused = |jobs: &mut Jobs, spec| jobs.define(spec, &m).unwrap_err();
    assert_eq!(
        refused(&mut jobs, job("a b", 1, &[0, 1])),
        DefineError::BadName("a b".into())
    );
    assert!(matches!(
        refused(&mut jobs, job(&"x".repeat(65), 1, &[0, 1])),
        DefineError::BadName(_)
    ));
    assert_eq!(
        refused(&mut jobs, job("j1", 1, &[1, 2])),
        DefineError::NotAMember {
            job: "j1".into(),
            node: n(0)
        }
    );
    // A member past the end of the nodes file, and one on a placeholder line.
    for node in [9, 3] {
        let e = refused(&mut jobs, job("j1", 1, &[0, node]));
        assert_eq!(
            e,
            DefineError::UnknownNode {
                job: "j1".into(),
                node: n(node)
            }
        );
        assert!(e.to_string().contains("add it there"), "{e}");
    }
    assert!(!jobs.any(), "nothing refused was defined");

    assert_eq!(jobs.define(job("j1", 7, &[0, 1]), &m), Ok(true));
    // The same job file read again: nothing changes.
    assert_eq!(jobs.define(job("j1", 7, &[0, 1]), &m), Ok(false));
    assert_eq!(
        refused(&mut jobs, job("j1", 8, &[0, 1])),
        DefineError::Redefined { job: "j1".into() }
    );
    let e = refused(&mut jobs, job("j2", 7, &[0, 2]));
    assert_eq!(
        e,
        DefineError::ChannelTaken {
            job: "j2".into(),
            channel: 7,
            by: "j1".into()
        }
    );
    assert!(
        e.to_string().contains("give the job another channel"),
        "{e}"
    );
    assert_eq!(jobs.names().collect::<Vec<_>>(), ["j1"]);
}

#[test]
fn an_ended_jobs_channel_goes_to_no_job_until_it_is_clear() {
    let m = map();
    let mut jobs = Jobs::new(n(0));
    jobs.define(job("old", 5, &[0, 1]), &m).unwrap();
    assert_eq!(jobs.end("old"), Some(job("old", 5, &[0, 1])));
    assert_eq!(jobs.end("old"), None, "ended once");
    assert_eq!(jobs.quarantined().collect::<Vec<_>>(), [(5, "old")]);
    // A stray process of "old" may still be subscribed to channel 5 and export on it: the
    // next job must not get it here.
    assert_eq!(
        jobs.define(job("new", 5, &[0, 1]), &m),
        Err(DefineError::ChannelQuarantined {
            job: "new".into(),
            channel: 5,
            ended: "old".into()
        })
    );
    assert_eq!(jobs.define(job("other", 6, &[0, 1]), &m), Ok(true));
    // The same job back with other members (its file rewritten) may have its channel again.
    assert_eq!(jobs.define(job("old", 5, &[0, 2]), &m), Ok(true));
    assert_eq!(jobs.end("old").map(|s| s.channel), Some(5));
    jobs.channel_clear(5);
    assert_eq!(jobs.define(job("new", 5, &[0, 1]), &m), Ok(true));
}

#[test]
fn members_that_hold_the_same_job_make_it_ready_and_a_lost_one_degrades_only_its_jobs() {
    let m = map();
    let specs = [job("a", 1, &[0, 1, 2]), job("b", 2, &[0, 4])];
    let mut nodes: Vec<Jobs> = [0, 1, 2, 4].iter().map(|i| Jobs::new(n(*i))).collect();
    for jobs in &mut nodes {
        for spec in &specs {
            if spec.members.contains(&jobs.local()) {
                jobs.define(spec.clone(), &m).unwrap();
            }
        }
    }
    let all = |_: NodeId| true;
    assert_eq!(
        nodes[0].state("a", all),
        Some(JobState::Forming(vec![n(1), n(2)])),
        "connected, but nobody said the job yet"
    );
    // Every node tells every other what they share.
    let mut told = Vec::new();
    for from in &nodes {
        for to in nodes.iter().filter(|t| t.local() != from.local()) {
            told.push((from.local(), to.local(), from.told(to.local())));
        }
    }
    for (from, to, jobs) in told {
        let at = nodes.iter_mut().find(|j| j.local() == to).unwrap();
        at.peer_said(from, &jobs, 1);
    }
    for (i, name) in [(0, "a"), (1, "a"), (2, "a"), (0, "b"), (3, "b")] {
        assert_eq!(nodes[i].state(name, all), Some(JobState::Ready), "{name}");
    }
    // Node 2 is lost: job a is DEGRADED on node 0, job b (without node 2) stays READY.
    let without_2 = |p: NodeId| p != n(2);
    assert_eq!(
        nodes[0].state("a", without_2),
        Some(JobState::Degraded(vec![n(2)]))
    );
    assert_eq!(nodes[0].state("b", without_2), Some(JobState::Ready));
    assert_eq!(nodes[0].state("a", without_2).unwrap().word(), "DEGRADED");
    assert_eq!(nodes[0].state("nope", all), None);
}

#[test]
fn a_member_holding_another_definition_is_named_and_imports_are_refused() {
    let m = map();
    let mut a = Jobs::new(n(0));
    let mut b = Jobs::new(n(1));
    a.define(job("j", 3, &[0, 1]), &m).unwrap();
    b.define(job("j", 4, &[0, 1]), &m).unwrap();
    a.peer_said(n(1), &b.told(n(0)), 1);
    b.peer_said(n(0), &a.told(n(1)), 1);
    let all = |_: NodeId| true;
    assert_eq!(a.state("j", all), Some(JobState::Disagreed(vec![n(1)])));
    assert_eq!(b.state("j", all), Some(JobState::Disagreed(vec![n(0)])));
    assert_eq!(
        a.admit(3, n(1)),
        Err(ImportRefusal::NotAgreed {
            job: "j".into(),
            node: n(1)
        })
    );
}

#[test]
fn with_jobs_an_import_is_admitted_only_inside_a_job_both_nodes_hold() {
    let m = map();
    let mut jobs = Jobs::new(n(0));
    // No job: the domain-wide daemon as before.
    assert_eq!(jobs.admit(9, n(4)), Ok(None));
    jobs.define(job("j", 3, &[0, 1]), &m).unwrap();
    jobs.define(job("k", 4, &[0, 2]), &m).unwrap();
    assert_eq!(
        jobs.admit(9, n(1)),
        Err(ImportRefusal::NoJob { channel: 9 })
    );
    assert_eq!(
        jobs.admit(3, n(2)),
        Err(ImportRefusal::NotAMember {
            job: "j".into(),
            node: n(2)
        }),
        "node 2 is in job k, not in job j: channel 3 is not its"
    );
    assert_eq!(
        jobs.admit(3, n(1)),
        Err(ImportRefusal::NotAgreed {
            job: "j".into(),
            node: n(1)
        }),
        "node 1 has not said it holds job j"
    );
    jobs.peer_said(n(1), &[("j".into(), job("j", 3, &[0, 1]).digest())], 1);
    assert_eq!(jobs.admit(3, n(1)), Ok(Some("j")));
    assert_eq!(jobs.admit(3, n(0)), Ok(Some("j")), "within the node");
    // Node 1 restarts without the job: what it said is gone with it.
    jobs.peer_gone(n(1));
    assert!(jobs.admit(3, n(1)).is_err());
    jobs.peer_said(n(1), &[("j".into(), job("j", 3, &[0, 1]).digest())], 1);
    // Ended: nothing more under it, at once, and also once no job is left.
    jobs.end("j");
    jobs.end("k");
    assert!(!jobs.any() && jobs.in_use());
    assert_eq!(
        jobs.admit(3, n(1)),
        Err(ImportRefusal::NoJob { channel: 3 })
    );
    assert!(
        jobs.admit(3, n(2))
            .unwrap_err()
            .to_string()
            .contains("channel 3"),
        "the refusal names the channel"
    );
}

#[test]
fn the_digest_covers_every_part_of_the_definition() {
    let base = job("j", 3, &[0, 1]);
    let mut owned = base.clone();
    owned.owner = Some((1000, 1000));
    let others = [
        job("k", 3, &[0, 1]),
        job("j", 4, &[0, 1]),
        job("j", 3, &[0, 2]),
        owned,
    ];
    for other in others {
        assert_ne!(base.digest(), other.digest(), "{other:?}");
    }
    assert_eq!(
        base.digest(),
        job("j", 3, &[1, 0]).digest(),
        "members are a set"
    );
}

#[test]
fn a_member_that_defines_a_job_after_its_peer_told_it_finds_what_the_peer_said() {
    let m = map();
    let (mut a, mut b) = (Jobs::new(n(0)), Jobs::new(n(1)));
    let spec = job("j", 3, &[0, 1]);
    a.define(spec.clone(), &m).unwrap();
    // Node 0 tells node 1 before node 1 has the job (its prolog runs later).
    b.peer_said(n(0), &a.told(n(1)), 1);
    b.define(spec, &m).unwrap();
    a.peer_said(n(1), &b.told(n(0)), 1);
    assert_eq!(b.admit(3, n(0)), Ok(Some("j")));
    assert_eq!(b.state("j", |_| true), Some(JobState::Ready));
    assert_eq!(a.state("j", |_| true), Some(JobState::Ready));
}

#[test]
fn a_quarantine_recorded_before_a_restart_holds_after_it() {
    let m = map();
    let mut jobs = Jobs::new(n(0));
    jobs.define(job("live", 2, &[0, 1]), &m).unwrap();
    jobs.restore_quarantine(&[(5, "old".into()), (2, "older".into())]);
    assert_eq!(
        jobs.define(job("new", 5, &[0, 1]), &m),
        Err(DefineError::ChannelQuarantined {
            job: "new".into(),
            channel: 5,
            ended: "old".into()
        })
    );
    assert_eq!(
        jobs.quarantined().collect::<Vec<_>>(),
        [(5, "old")],
        "a channel a job holds now stays that job's"
    );
}

#[test]
fn a_list_older_than_one_taken_from_that_peer_changes_nothing() {
    let m = map();
    let mut jobs = Jobs::new(n(0));
    let spec = job("j", 3, &[0, 1]);
    jobs.define(spec.clone(), &m).unwrap();
    // Node 1's second list (it holds j) arrives before its first (it did not yet).
    jobs.peer_said(n(1), &[("j".into(), spec.digest())], 2);
    jobs.peer_said(n(1), &[], 1);
    assert_eq!(jobs.admit(3, n(1)), Ok(Some("j")));
    // A newer one (it ended j) is taken; a restart of node 1 starts its count again.
    jobs.peer_said(n(1), &[], 3);
    assert!(jobs.admit(3, n(1)).is_err());
    jobs.peer_gone(n(1));
    jobs.peer_said(n(1), &[("j".into(), spec.digest())], 1);
    assert_eq!(jobs.admit(3, n(1)), Ok(Some("j")));
}
