//! The Fabric Manager's in-band messages cross the driver protocol's framing intact.

use std::os::unix::net::UnixStream;

use openimex_simproto::inband::{FabricGpu, FromFm, ToFm};
use openimex_simproto::probe::{HealthSummary, ProbeInfo};
use openimex_simproto::proto::{recv, send};

/// Both directions cross the driver protocol's framing intact.
#[test]
fn messages_cross_the_framing() {
    let (a, b) = UnixStream::pair().unwrap();
    let attach = ToFm::Attach { slot: 3, gpus: 4 };
    send(&a, &attach, &[]).unwrap();
    let (got, fds) = recv::<ToFm>(&b).unwrap();
    assert_eq!(got, attach);
    assert!(fds.is_empty());
    let probe = FromFm::Probe {
        gpu: 2,
        info: ProbeInfo {
            cluster_uuid: "ab".repeat(16),
            partition_id: 1,
            clique_id: 2,
            fla_base: 1 << 40,
            fla_size: 1 << 36,
            caps: 3,
            health_mask: 0,
            health_summary: HealthSummary::Healthy,
            bw_mode: 0,
            bw_mode_epoch: 0,
        },
    };
    send(&b, &probe, &[]).unwrap();
    assert_eq!(recv::<FromFm>(&a).unwrap().0, probe);
    let team = FromFm::McTeam {
        team_key: "k".into(),
        members: vec![FabricGpu { slot: 0, gpu: 1 }],
        result: Err("no room".into()),
    };
    send(&b, &team, &[]).unwrap();
    assert_eq!(recv::<FromFm>(&a).unwrap().0, team);
}
