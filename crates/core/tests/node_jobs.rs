//! Jobs in a node's lifecycle (`node/jobs.rs`): members told at a definition, an end and a
//! link-up; what a member says taken only from the session that proves it; and imports refused
//! at both ends outside a job both nodes hold, with the driver's channel error. Deterministic.

mod sim;

use std::time::Instant;

use openimex_core::jobs::JobState;
use openimex_core::node::Action;
use openimex_core::*;
use sim::node::{Setup, drain, job, peer};

/// Node 0 of 3, started, node 1's session up (accepted on connection 1), node 2 not connected.
fn node() -> (Node, Instant, Vec<Hello>) {
    let (n, now, hellos) = sim::node::node(Setup::default());
    let (n, actions) = sim::node::with_node_1(n, now, &hellos);
    assert_eq!(
        told(&actions),
        vec![],
        "no job: nothing told, as before jobs"
    );
    (n, now, hellos)
}

fn told(actions: &[Action]) -> Vec<(NodeId, Vec<String>)> {
    (actions.iter())
        .filter_map(|a| match a {
            Action::SendJobs { peer, jobs, .. } => {
                Some((*peer, jobs.iter().map(|(n, _)| n.clone()).collect()))
            }
            _ => None,
        })
        .collect()
}

/// The importer's side: the driver's MEM_IMPORT of node 1's export on `channel`.
fn import_event(n: &mut Node, now: Instant, event_id: u64, channel: u32) -> Vec<Action> {
    n.handle_driver_event(
        now,
        Event::Import {
            event_id,
            channel,
            export_uuid: [1; 16],
            index: 0,
            export_node: NodeId(1),
        },
    );
    drain(n)
}

fn asked(actions: &[Action]) -> bool {
    actions
        .iter()
        .any(|a| matches!(a, Action::SendImport { .. }))
}

fn failed_with(actions: &[Action]) -> Option<Status> {
    actions.iter().find_map(|a| match a {
        Action::ValidateImport {
            result: Err(status),
            ..
        } => Some(*status),
        _ => None,
    })
}

fn refusals(actions: &[Action]) -> Vec<&'static str> {
    (actions.iter())
        .filter_map(|a| match a {
            Action::Refused { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect()
}

#[test]
fn without_jobs_every_import_goes_as_before() {
    let (mut n, now, _) = node();
    assert!(!n.jobs().any());
    assert!(asked(&import_event(&mut n, now, 1, 42)));
}

#[test]
fn a_defined_job_is_told_to_its_connected_members_and_is_ready_once_they_hold_it() {
    let (mut n, now, hellos) = node();
    let spec = job("j", 5, &[0, 1, 2]);
    assert_eq!(n.handle_job_define(now, spec.clone()), Ok(true));
    assert_eq!(
        told(&drain(&mut n)),
        vec![(NodeId(1), vec!["j".to_string()])],
        "node 1 is told; node 2 has no session"
    );
    assert_eq!(n.handle_job_define(now, spec.clone()), Ok(false));
    assert_eq!(
        told(&drain(&mut n)),
        vec![],
        "the same job again tells nobody"
    );
    assert_eq!(
        n.job_state("j"),
        Some(JobState::Forming(vec![NodeId(2), NodeId(1)]))
    );
    // Node 1 holds it too.
    let said = vec![("j".to_string(), spec.digest())];
    n.handle_session_jobs(now, Via::Accepted { conn: 1 }, &said, 1);
    assert_eq!(n.job_state("j"), Some(JobState::Forming(vec![NodeId(2)])));
    // Node 2 comes up (its own dial): told at its link-up, and it holds the job as well.
    assert_eq!(
        n.handle_session_hello(now, 2, true, &hellos[2]),
        Verdict::Accept
    );
    assert!(n.handle_session_opened(now, 2));
    assert_eq!(
        told(&drain(&mut n)),
        vec![(NodeId(2), vec!["j".to_string()])]
    );
    n.handle_session_jobs(now, Via::Accepted { conn: 2 }, &said, 1);
    assert_eq!(n.job_state("j"), Some(JobState::Ready));
}

#[test]
fn an_import_outside_a_job_both_nodes_hold_fails_with_the_channel_error_at_the_importer() {
    let (mut n, now, _) = node();
    let spec = job("j", 5, &[0, 1]);
    n.handle_job_define(now, spec.clone()).unwrap();
    drain(&mut n);
    // Node 1 has not said it holds the job yet.
    let a = import_event(&mut n, now, 1, 5);
    assert!(!asked(&a));
    assert_eq!(failed_with(&a), Some(Status::InsufficientPermissions));
    assert_eq!(refusals(&a), ["import: job not held by the other node"]);
    n.handle_session_jobs(
        now,
        Via::Accepted { conn: 1 },
        &[("j".into(), spec.digest())],
        1,
    );
    assert!(asked(&import_event(&mut n, now, 2, 5)), "inside the job");
    let other = import_event(&mut n, now, 3, 6);
    assert_eq!(failed_with(&other), Some(Status::InsufficientPermissions));
    assert_eq!(refusals(&other), ["import: no job owns the channel"]);
}

#[test]
fn the_exporter_serves_an_import_only_inside_a_job_the_importer_holds() {
    let (mut n, now, hellos) = node();
    let spec = job("j", 5, &[0, 1]);
    n.handle_job_define(now, spec.clone()).unwrap();
    drain(&mut n);
    let request = |channel| ImportRequest {
        import_event_id: 9,
        export_uuid: [2; 16],
        index: 0,
        channel,
    };
    n.handle_peer_import(now, 1, peer(&hellos[1]), request(5));
    let a = drain(&mut n);
    assert!(
        a.iter().any(|a| matches!(
            a,
            Action::AnswerImport { request: 1, answer: Err(e) } if e.status == Status::InsufficientPermissions
        )),
        "{a:?}"
    );
    assert!(!a.iter().any(|a| matches!(a, Action::DescribeExport { .. })));
    n.handle_session_jobs(
        now,
        Via::Accepted { conn: 1 },
        &[("j".into(), spec.digest())],
        1,
    );
    n.handle_peer_import(now, 2, peer(&hellos[1]), request(5));
    let a = drain(&mut n);
    assert!(
        a.iter()
            .any(|a| matches!(a, Action::DescribeExport { request: 2, .. })),
        "{a:?}"
    );
    // Ended here: the member is told at once, and nothing more is served under it.
    assert_eq!(n.handle_job_end(now, "j"), Some(spec));
    assert_eq!(told(&drain(&mut n)), vec![(NodeId(1), vec![])]);
    n.handle_peer_import(now, 3, peer(&hellos[1]), request(5));
    let a = drain(&mut n);
    assert_eq!(refusals(&a), ["import: no job owns the channel"]);
    assert!(matches!(
        n.handle_job_define(now, job("next", 5, &[0, 1])),
        Err(jobs::DefineError::ChannelQuarantined { .. })
    ));
    n.handle_job_channel_clear(now, 5);
    assert_eq!(n.handle_job_define(now, job("next", 5, &[0, 1])), Ok(true));
}

#[test]
fn a_list_on_a_connection_that_proves_nobody_is_refused_and_a_restart_forgets_what_was_said() {
    let (mut n, now, hellos) = node();
    let spec = job("j", 5, &[0, 1]);
    n.handle_job_define(now, spec.clone()).unwrap();
    drain(&mut n);
    let said = vec![("j".to_string(), spec.digest())];
    n.handle_session_jobs(now, Via::Accepted { conn: 99 }, &said, 1);
    assert_eq!(refusals(&drain(&mut n)), ["jobs: no session"]);
    assert_eq!(n.job_state("j"), Some(JobState::Forming(vec![NodeId(1)])));
    n.handle_session_jobs(now, Via::Accepted { conn: 1 }, &said, 1);
    assert_eq!(n.job_state("j"), Some(JobState::Ready));
    // Node 1 restarts (a new instance opens its session): what the old one said is gone, and
    // the new one has said nothing yet.
    let restarted = Hello {
        instance: InstanceId(999),
        ..hellos[1].clone()
    };
    assert_eq!(
        n.handle_session_hello(now, 2, true, &restarted),
        Verdict::Accept
    );
    assert!(n.handle_session_opened(now, 2));
    drain(&mut n);
    assert_eq!(n.job_state("j"), Some(JobState::Forming(vec![NodeId(1)])));
    assert!(n.jobs().admit(5, NodeId(1)).is_err());
}

#[test]
fn a_job_ready_when_nobody_asked_is_degraded_not_forming_once_a_member_is_lost() {
    // DEGRADED says "was READY": the node must know it was, whether or not `ctl` looked then.
    let (mut n, now, hellos) = sim::node::node(Setup::default());
    let started = sim::node::start(&mut n, now);
    // Both dials refused, so the loss below is a loss (not a handover to our own dial).
    for p in [1, 2] {
        let attempt = sim::node::dial_attempt(&started, p).expect("dialled at start");
        sim::node::refused(&mut n, now, NodeId(p), attempt);
    }
    assert_eq!(
        n.handle_session_hello(now, 1, true, &hellos[1]),
        Verdict::Accept
    );
    assert!(n.handle_session_opened(now, 1));
    let spec = job("j", 5, &[0, 1]);
    n.handle_job_define(now, spec.clone()).unwrap();
    let said = vec![("j".to_string(), spec.digest())];
    n.handle_session_jobs(now, Via::Accepted { conn: 1 }, &said, 1);
    drain(&mut n);
    // No `job_state` asked between READY and the loss.
    n.handle_session_lost(now, Via::Accepted { conn: 1 }, "reset".into());
    drain(&mut n);
    assert_eq!(n.links()[1].status, ConnStatus::Recovering);
    assert_eq!(n.job_state("j"), Some(JobState::Degraded(vec![NodeId(1)])));
}

#[test]
fn a_batch_of_jobs_tells_each_member_once_with_the_whole_list() {
    // A jobs directory read at start may hold thousands of jobs: telling per job would send
    // each member its growing list once per job.
    let (mut n, now, _) = node();
    let specs: Vec<_> = (0..100)
        .map(|i| job(&format!("j{i}"), 10 + i, &[0, 1]))
        .collect();
    let changed = n.handle_jobs_changed(now, &[], specs);
    assert!(changed.defined.iter().all(|(_, r)| *r == Ok(true)));
    let first = told(&drain(&mut n));
    assert_eq!(first.len(), 1, "node 1 told once");
    assert_eq!(first[0].1.len(), 100, "with every job it shares");
    let ended: Vec<String> = (0..50).map(|i| format!("j{i}")).collect();
    let changed = n.handle_jobs_changed(now, &ended, Vec::new());
    assert_eq!(changed.ended.len(), 50);
    let then = told(&drain(&mut n));
    assert_eq!((then.len(), then[0].1.len()), (1, 50));
}
