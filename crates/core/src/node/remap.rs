//! The node map re-read while the daemon runs (SIGUSR1): the mesh decides what is dialled
//! ([`Mesh::handle_node_map`](crate::Mesh::handle_node_map)); the node adds what the change
//! means for its own state. Peers whose entry and address did not change keep everything:
//! their imports, exports and references are not touched.

use std::time::Instant;

use super::Node;
use crate::ids::NodeId;
use crate::nodemap::{MapRefusal, NodeMap};

impl Node {
    /// See [`crate::Mesh::handle_node_map`]. On success the persist record is written again
    /// (action [`super::Action::Persist`], same importers): it is keyed to the node map, and a
    /// daemon restarted with the new file must find it.
    pub fn handle_node_map(
        &mut self,
        now: Instant,
        map: NodeMap,
        readdressed: &[NodeId],
    ) -> Result<Vec<NodeId>, MapRefusal> {
        let added = self.mesh.handle_node_map(now, map, readdressed)?;
        self.absorb_mesh(now);
        self.rewrite_persist();
        Ok(added)
    }
}
