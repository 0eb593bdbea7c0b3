//! Names mode and SIGUSR1: daemons that find each other through DNS names (each with its own
//! `/etc/hosts`, as Kubernetes pods of the DRA driver do), and SIGUSR1 re-reading the nodes file
//! and re-resolving the names without a restart.

use openimex_harness::{Cluster, GpuSpec};

use crate::common::{FORM, spec};

#[test]
fn names_mode_cluster_forms_up_through_private_hosts_files() {
    let cluster = Cluster::start(spec(2).with_names().with_gpus(GpuSpec::default()))
        .expect("start 2 nodes in names mode");
    let d = cluster.wait_up(1, FORM).expect("domain UP");
    for i in 0..2 {
        let name = cluster.node_name(i).expect("name").to_owned();
        assert_eq!(name, format!("oimx-n{i}"));
        let host = d.nodes.get(&(i as u32)).map(|n| n.host.clone());
        assert_eq!(host.as_deref(), Some(name.as_str()), "{}", d.compact());
    }
}
