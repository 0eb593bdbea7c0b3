//! When a fault has recovered: per (reader, exporter) pair the last import and the latest
//! one read good, the awaited faults recorded as recovered (with their time to recover) or
//! not, and the notes on what a slow or missing recovery waited for.

use std::time::Instant;

use super::faults::Outcome;
use super::{Engine, SLOW_RECOVERY};

/// Per (reader app, exporter tag): its last import, and the latest import a good read confirmed.
#[derive(Debug, Clone)]
pub(super) struct Pair {
    /// When the reader last imported this exporter's memory, and the seed it imported.
    pub(super) imported: Option<(Instant, String)>,
    /// When the latest import the reader then read the pattern of was made. A pair has
    /// recovered from a fault once this is after the repair: a later import, not yet read,
    /// does not undo that (the exporters publish a generation every half second, and a
    /// condition that every pair's *latest* import is read could go unmet for a minute while
    /// the workload ran fine: some pair was always between an import and its reader's next
    /// report).
    pub(super) confirmed: Option<Instant>,
    /// The reader's last complaint about this exporter's memory (a failed import or map,
    /// freed, stale or corrupt words), for the note of a recovery that does not come.
    pub(super) last_bad: Option<&'static str>,
}

impl Pair {
    /// The reader imported the exporter's memory of `seed` at `at`.
    pub(super) fn imported_at(&mut self, at: Instant, seed: String) {
        self.imported = Some((at, seed));
    }

    /// The reader found the pattern of `seed`: if that is its last import, that import is
    /// confirmed.
    pub(super) fn read_good(&mut self, seed: &str) {
        if let Some((at, imported)) = &self.imported
            && imported == seed
        {
            self.confirmed = Some(*at);
        }
    }

    /// Whether the reader has imported this exporter's memory after `since` and read the
    /// pattern of that import.
    fn recovered_since(&self, since: Instant) -> bool {
        self.confirmed.is_some_and(|t| t >= since)
    }
}

impl Engine<'_> {
    /// Every (reader, exporter) pair imported after `since` and read the pattern of that import.
    pub(super) fn progressed_since(&self, since: Instant) -> bool {
        self.pairs.values().all(|p| p.recovered_since(since))
    }

    /// Records the recoveries (or give-ups) of the awaited faults.
    pub(super) fn check_recoveries(&mut self) {
        if self.awaiting.is_empty() {
            return;
        }
        let mut still = Vec::new();
        for (record, since) in std::mem::take(&mut self.awaiting) {
            if self.progressed_since(since) && self.domain_up() {
                self.records[record].outcome = Some(Outcome::Recovered);
                self.records[record].recover = Some(since.elapsed());
                if since.elapsed() > SLOW_RECOVERY {
                    let text = self.slow_recovery(record, since);
                    self.note(text);
                }
            } else if since.elapsed() > self.spec.recover_timeout {
                self.records[record].outcome = Some(Outcome::NotRecovered);
                let r = &self.records[record];
                let text = format!(
                    "{} on node {} ({}) did not recover within {:?}: {}",
                    r.kind.name(),
                    r.node,
                    r.target,
                    self.spec.recover_timeout,
                    self.lagging(since)
                );
                self.note(text);
            } else {
                still.push((record, since));
            }
        }
        self.awaiting = still;
    }

    /// What a recovery still waits for: the domain, and the pairs that have not imported and
    /// read since `since` (the first few, with how long ago each last imported).
    fn lagging(&self, since: Instant) -> String {
        let up = self.domain_checked.is_some_and(|(_, up)| up);
        let mut late: Vec<String> = self
            .pairs
            .iter()
            .filter(|(_, p)| !p.recovered_since(since))
            .map(|((reader, tag), p)| {
                let last = p
                    .imported
                    .as_ref()
                    .map_or("never imported".to_owned(), |(t, _)| {
                        format!("imported {} ms ago", t.elapsed().as_millis())
                    });
                let read = match p.confirmed {
                    Some(t) if t >= since => "",
                    Some(_) => ", no import read since the repair",
                    None => ", no import read yet",
                };
                let bad = p
                    .last_bad
                    .map_or(String::new(), |b| format!(", last complaint: {b}"));
                format!(
                    "{} <- {tag} ({last}{read}{bad})",
                    self.apps[*reader].spec.name
                )
            })
            .collect();
        late.sort();
        let n = late.len();
        late.truncate(4);
        format!(
            "domain {}; {n} pair(s) behind: {}{}",
            if up { "UP" } else { "not UP" },
            late.join(", "),
            if n > 4 { ", …" } else { "" }
        )
    }

    /// Why a recovery took long: the pair whose confirmed import came last (the domain was UP
    /// by then, or the recovery would not have been recorded).
    fn slow_recovery(&self, record: usize, since: Instant) -> String {
        let r = &self.records[record];
        let last = self
            .pairs
            .iter()
            .filter_map(|((reader, tag), p)| Some((p.confirmed?, reader, tag)))
            .max();
        let pair = last.map_or("no pair".to_owned(), |(at, reader, tag)| {
            format!(
                "reader {} <- exporter {tag} imported again {} ms after the repair",
                self.apps[*reader].spec.name,
                at.saturating_duration_since(since).as_millis()
            )
        });
        format!(
            "slow recovery of {} on node {} ({} ms): last to recover was {pair}",
            r.kind.name(),
            r.node,
            since.elapsed().as_millis()
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn pair() -> Pair {
        Pair {
            imported: None,
            confirmed: None,
            last_bad: None,
        }
    }

    #[test]
    fn a_pair_recovers_once_an_import_after_the_repair_is_read_good() {
        let before = Instant::now();
        let repair = before + Duration::from_millis(10);
        let mut p = pair();
        // Read good before the repair: not a recovery from it.
        p.imported_at(before, "a".into());
        p.read_good("a");
        assert!(!p.recovered_since(repair));
        // Imported after the repair, not yet read: not yet.
        p.imported_at(repair + Duration::from_millis(1), "b".into());
        assert!(!p.recovered_since(repair));
        // A late report of the earlier seed confirms nothing new.
        p.read_good("a");
        assert!(!p.recovered_since(repair));
        p.read_good("b");
        assert!(p.recovered_since(repair));
        // The next generation's import, not yet read, does not undo it (the check that
        // required the latest import read saw a minute-long "non-recovery" this way).
        p.imported_at(repair + Duration::from_millis(500), "c".into());
        assert!(p.recovered_since(repair));
    }
}
