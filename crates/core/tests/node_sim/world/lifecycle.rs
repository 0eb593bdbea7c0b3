//! Daemons come and go: a start is a new instance (with the previous one's persist record), a
//! kill -9 leaves the driver to tear its session down while peers see their sessions reset, and
//! a clean shutdown says goodbye before the process exits.

use openimex_core::*;

use super::events::Ev;
use super::{Daemon, World};
use crate::sim;

impl World {
    /// Start a daemon on node `i` (a new instance).
    pub fn start(&mut self, i: usize) {
        if self.alive(i) {
            return;
        }
        self.next_instance += 1;
        let instance = InstanceId(self.next_instance);
        let map = self.start_map(i);
        let cfg = NodeConfig {
            mesh: sim::config(i, map.clone(), instance.0, self.p.quorum),
            import_timeout: self.p.import_timeout,
            max_describes_per_peer: openimex_core::node::DEFAULT_MAX_DESCRIBES_PER_PEER,
            grace: self.p.grace,
            // The previous daemon's record: with RECOVERY the new one waits for those nodes.
            recover_from: if self.p.quorum == QuorumPolicy::Recovery {
                self.slots[i].persist.clone()
            } else {
                Vec::new()
            },
            recovery_wait: openimex_core::node::DEFAULT_RECOVERY_WAIT,
            conn_wait_timeout: None,
        };
        let mut node = Node::new(cfg, self.now);
        node.set_max_imports_in_flight(self.p.max_imports_in_flight);
        // The nodes file as this daemon reads it at start-up.
        let addrs = (0..self.p.n)
            .map(|k| match map.is_placeholder(Self::id(k)) {
                true => Vec::new(),
                false => vec![self.addr(k)],
            })
            .collect();
        node.handle_nodes_resolved(addrs);
        // The daemon reads the GPUs' probes before it starts, so its first hello carries its
        // cliques; every third instance here does not, and its node asks for a read at once.
        if !instance.0.is_multiple_of(3) {
            node.handle_gpu_fabric(self.now, self.slots[i].driver.gpus.clone());
        }
        node.handle_start(self.now);
        self.slots[i].daemon = Some(Daemon {
            node,
            instance,
            exiting: false,
            stopped_at: None,
            goodbyes_over: false,
            exit_due: false,
            jobs: Default::default(),
        });
        self.note(|| format!("node {i}: daemon started, instance {instance}"));
        self.pump();
        self.define_from_files(i);
    }

    /// kill -9 (or the exit after a clean shutdown): the process is gone, the driver tears its
    /// session down, and peers' sessions to it are reset (unless a partition hides the reset).
    pub fn take_down(&mut self, i: usize, why: &str) {
        let Some(d) = self.slots[i].daemon.take() else {
            return;
        };
        let t = self.slots[i].driver.teardown();
        self.ref_for.retain(|(n, _), _| *n != i);
        self.unheard.retain(|(n, _, _), _| *n != i);
        self.closed_conns.retain(|(n, _, _)| *n != i);
        self.silent.retain(|(n, _, _), _| *n != i);
        self.note(|| {
            format!(
                "node {i}: daemon {} gone ({why}); session teardown: {} failed imports, {} woken, \
                 {} importers disabled, dangling={}, freed {:?}",
                d.instance, t.failed_imports, t.woken, t.disabled, t.dangling, t.freed
            )
        });
        for exp in t.freed {
            self.on_freed(i, exp, true);
        }
        let keys: Vec<(usize, usize)> = self
            .sessions
            .keys()
            .copied()
            .filter(|(a, b)| *a == i || *b == i)
            .collect();
        for (a, b) in keys {
            self.remove_session(a, b, Some(i));
        }
    }

    /// SIGTERM: goodbyes, then the process exits a little later.
    pub fn shutdown(&mut self, i: usize) {
        let now = self.now;
        let Some(d) = self.slots[i].daemon.as_mut() else {
            return;
        };
        if d.exiting {
            return;
        }
        d.exiting = true;
        d.stopped_at = Some(now);
        let inst = d.instance;
        d.node.handle_shutdown(now);
        self.note(|| format!("node {i}: shutdown"));
        let linger = match self.cond.linger {
            Some(d) => d,
            None => self.rng.ms(50, 600),
        };
        self.push(now + linger, Ev::Exit { node: i, inst });
        self.pump();
    }
}
