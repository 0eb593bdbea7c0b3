//! The simulated NVSwitch multicast table: which memory a store to a team's addresses reaches.
//!
//! On a rack the switches replicate a store to a team's multicast address into the memory
//! every member GPU bound at that offset (and reduce loads across them, `multimem.ld_reduce`).
//! Here the table is a directory per team in the fabric directory
//! ([`openimex_simproto::multicast::table_dir`], named by the team's address base, unique in
//! the domain), holding one JSON [`McBinding`] per bound range. Each driver writes and removes
//! only its own GPUs' files, each written whole and renamed into place, so that drivers on
//! several trays share the directory without a lock and a reader never sees half a file. The
//! client maps every listed range: its stores write each, its load-reduce reads them all.

use std::fs;
use std::io;
use std::path::Path;

use openimex_simproto::multicast::McBinding;

/// Adds `binding` to the table in `dir` (created if needed).
pub(super) fn write(dir: &Path, binding: &McBinding) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    let name = binding.file_name();
    let tmp = dir.join(format!(".{name}.tmp"));
    let text = serde_json::to_vec(binding).map_err(io::Error::other)?;
    fs::write(&tmp, text)?;
    fs::rename(&tmp, dir.join(name))
}

/// Removes `binding` from the table in `dir` (gone already is fine: a restarted fabric
/// directory, a team removed by its prime).
pub(super) fn remove(dir: &Path, binding: &McBinding) {
    if let Err(e) = fs::remove_file(dir.join(binding.file_name()))
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %dir.display(), "cannot remove a multicast binding: {e}");
    }
    // The last binding's driver removes the directory; a non-empty one stays.
    let _ = fs::remove_dir(dir);
}

/// Removes a whole team's table (its prime went, or a new team reuses the address).
pub(super) fn remove_team(dir: &Path) {
    if let Err(e) = fs::remove_dir_all(dir)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %dir.display(), "cannot remove a multicast table: {e}");
    }
}
