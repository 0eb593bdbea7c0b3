//! The persist record (`persist.dat`, imex-guide §4): which nodes hold references to this
//! node's memory. NVIDIA's byte format is not published; ours is text:
//!
//! ```text
//! # openimex persist record: nodes that hold references to this node's memory
//! key <node-map digest>
//! node <node ID> <nodes-file entry>
//! ```
//!
//! The key ties the record to the node map: a record written under another map is discarded
//! (no recovery wait), as NVIDIA's is. Writes replace the file atomically (a temporary file,
//! then a rename), so a crash of the daemon leaves the old record or the new one, never half of
//! one.
//!
//! No fsync: the record guards against an unclean exit of the *daemon* (the driver and its
//! memory live on), and what a process wrote is in the page cache for its successor whether or
//! not it reached the disk. A reboot resets the GPUs and their memory with it, and the record's
//! home, `/var/run/nvidia-imex`, is a tmpfs that does not survive one either. An fsync here
//! cost a disk flush (milliseconds) on the engine's loop before every import answer that adds an
//! importer node, and again when one leaves.

use std::io::Write;
use std::path::Path;

use openimex_core::{NodeId, NodeMap};

/// What a record at start-up says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Record {
    /// No file: no previous importers.
    Missing,
    /// Written under another node map: discarded.
    OtherMap,
    /// The importers of the previous run (empty after a clean stop).
    Importers(Vec<NodeId>),
}

/// Reads the record at `path` for `map`.
pub(crate) fn read(path: &Path, map: &NodeMap) -> std::io::Result<Record> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Record::Missing),
        Err(e) => return Err(e),
    };
    let mut key_ok = false;
    let mut importers = Vec::new();
    for line in text.lines().map(str::trim) {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("key") => key_ok = words.next() == Some(map.digest()),
            Some("node") => {
                let id = words
                    .next()
                    .and_then(|w| w.parse::<u16>().ok())
                    .filter(|id| usize::from(*id) < map.len());
                match id {
                    Some(id) => importers.push(NodeId(id)),
                    None => {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!("malformed line {line:?}"),
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    if !key_ok {
        return Ok(Record::OtherMap);
    }
    importers.sort_unstable();
    importers.dedup();
    Ok(Record::Importers(importers))
}

/// Writes the record: `importers` hold (or may hold) references to this node's memory.
pub(crate) fn write(path: &Path, map: &NodeMap, importers: &[NodeId]) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut text = String::from(
        "# openimex persist record: nodes that hold references to this node's memory\n",
    );
    text.push_str(&format!("key {}\n", map.digest()));
    for id in importers {
        let host = map.hosts().get(id.index()).map_or("?", String::as_str);
        text.push_str(&format!("node {id} {host}\n"));
    }
    let tmp = path.with_extension("tmp");
    std::fs::File::create(&tmp)?.write_all(text.as_bytes())?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_a_changed_map_discards_it() {
        let dir = std::env::temp_dir().join(format!("openimex-persist-{}", std::process::id()));
        let path = dir.join("persist.dat");
        let map = NodeMap::new(vec![
            "10.0.0.1".into(),
            "10.0.0.2".into(),
            "10.0.0.3".into(),
        ]);
        assert_eq!(read(&path, &map).unwrap(), Record::Missing);
        write(&path, &map, &[NodeId(2), NodeId(1)]).unwrap();
        assert_eq!(
            read(&path, &map).unwrap(),
            Record::Importers(vec![NodeId(1), NodeId(2)])
        );
        write(&path, &map, &[]).unwrap();
        assert_eq!(read(&path, &map).unwrap(), Record::Importers(vec![]));
        let other = NodeMap::new(vec!["10.0.0.1".into(), "10.0.0.9".into()]);
        write(&path, &map, &[NodeId(1)]).unwrap();
        assert_eq!(read(&path, &other).unwrap(), Record::OtherMap);
        std::fs::write(&path, format!("key {}\nnode 99 x\n", map.digest())).unwrap();
        assert!(read(&path, &map).is_err(), "a node ID outside the map");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
