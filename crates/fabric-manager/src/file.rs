//! The topology file: a custom NVLink domain, one declaration per line.
//!
//! ```text
//! # comments start with '#'; blank lines are ignored
//! topology lab            # the domain's name (optional; default "custom")
//! rack r0                 # a rack; the trays below belong to it
//! switch-tray r0-s0 osfp=18   # 2 NVSwitch chips; osfp= front-panel ports (default 0)
//! compute-tray r0-c0 gpus=4   # 2 Grace CPUs and N GPUs (1..=64; default 4)
//! rack r1
//! switch-tray r1-s0 osfp=18
//! compute-tray r1-c0 gpus=4
//! link r0-s0 r1-s0        # OSFP cables joining two switch trays (both need osfp > 0)
//! ```
//!
//! Names are letters, digits, `.`, `_` and `-`, unique across the file. Compute trays take
//! slots in file order. A link names switch trays declared above it. Every rack with compute
//! trays must reach a switch tray. [`print()`] writes a topology in this format; parsing its
//! output gives the same topology back.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::FabricError;
use crate::topology::{
    ComputeTray, Link, MAX_GPUS_PER_TRAY, MAX_OSFP_PER_TRAY, Rack, SwitchTray, Topology,
};

/// Most characters of a value echoed in an error.
const ECHO_MAX: usize = 120;
/// The name of a topology whose file has no `topology` line.
pub const DEFAULT_NAME: &str = "custom";

/// Reads and parses the topology file at `path`.
pub fn load(path: &Path) -> Result<Topology, FabricError> {
    let text = std::fs::read_to_string(path).map_err(|source| FabricError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse(path, &text)
}

/// What a name was declared as, and where.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Topology,
    Rack,
    Compute,
    Switch { osfp: u32 },
}

/// Parser state: the topology so far and every name's kind and line.
struct Parser<'a> {
    path: &'a Path,
    topo: Topology,
    names: HashMap<String, (Kind, usize)>,
    named: bool,
    rack_lines: Vec<usize>,
}

impl Parser<'_> {
    fn err(&self, line: usize, value: &str, problem: &str, fix: &str) -> FabricError {
        let mut shown: String = value.chars().take(ECHO_MAX).collect();
        if value.chars().count() > ECHO_MAX {
            shown.push('…');
        }
        FabricError::Line {
            path: self.path.to_owned(),
            line,
            value: shown,
            problem: problem.to_owned(),
            fix: fix.to_owned(),
        }
    }

    /// Checks a new name's spelling and uniqueness, then records it.
    fn declare(&mut self, line: usize, name: &str, kind: Kind) -> Result<(), FabricError> {
        let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if name.is_empty() || !name.chars().all(ok) {
            return Err(self.err(
                line,
                name,
                "invalid name",
                "use letters, digits, '.', '_' and '-' only",
            ));
        }
        if let Some((_, first)) = self.names.get(name) {
            let fix =
                format!("it is already declared on line {first}; give each item its own name");
            return Err(self.err(line, name, "duplicate name", &fix));
        }
        self.names.insert(name.to_owned(), (kind, line));
        Ok(())
    }

    /// The rack trays go into, or an error if no `rack` line came before.
    fn rack(&mut self, line: usize, text: &str) -> Result<&mut Rack, FabricError> {
        if self.topo.racks.is_empty() {
            return Err(self.err(
                line,
                text,
                "tray outside a rack",
                "put a `rack NAME` line above the trays that belong to it",
            ));
        }
        let last = self.topo.racks.len() - 1;
        Ok(&mut self.topo.racks[last])
    }

    /// Parses `key=N` options of a tray line; `keys` lists (key, default, min, max).
    fn options<const N: usize>(
        &self,
        line: usize,
        words: &[&str],
        keys: [(&str, u32, u32, u32); N],
    ) -> Result<[u32; N], FabricError> {
        let mut out = keys.map(|k| k.1);
        for w in words {
            let Some((k, v)) = w.split_once('=') else {
                let fix = format!("write options as KEY=VALUE ({})", key_list(&keys));
                return Err(self.err(line, w, "unexpected word", &fix));
            };
            let Some(i) = keys.iter().position(|key| key.0 == k) else {
                let fix = format!("this line takes {}", key_list(&keys));
                return Err(self.err(line, w, "unknown option", &fix));
            };
            let (_, _, min, max) = keys[i];
            out[i] = match v.parse::<u32>() {
                Ok(n) if (min..=max).contains(&n) => n,
                _ => {
                    let fix = format!("{k} takes a whole number from {min} to {max}");
                    return Err(self.err(line, w, "bad value", &fix));
                }
            };
        }
        Ok(out)
    }

    fn line(&mut self, line: usize, text: &str) -> Result<(), FabricError> {
        let words: Vec<&str> = text.split_whitespace().collect();
        let Some((&keyword, rest)) = words.split_first() else {
            return Ok(());
        };
        let one_name = |p: &Self, what: &str| -> Result<String, FabricError> {
            match rest.first() {
                Some(n) => Ok((*n).to_owned()),
                None => Err(p.err(
                    line,
                    text,
                    &format!("{what} without a name"),
                    &format!("write `{keyword} NAME`"),
                )),
            }
        };
        match keyword {
            "topology" => {
                let name = one_name(self, "topology")?;
                if self.named {
                    return Err(self.err(
                        line,
                        text,
                        "second topology line",
                        "keep one `topology NAME` line",
                    ));
                }
                if rest.len() > 1 {
                    return Err(self.err(line, text, "extra words", "write `topology NAME`"));
                }
                self.declare(line, &name, Kind::Topology)?;
                self.named = true;
                self.topo.name = name;
            }
            "rack" => {
                let name = one_name(self, "rack")?;
                if rest.len() > 1 {
                    return Err(self.err(
                        line,
                        text,
                        "extra words",
                        "write `rack NAME`; trays go on their own lines",
                    ));
                }
                self.declare(line, &name, Kind::Rack)?;
                self.topo.racks.push(Rack {
                    name,
                    compute_trays: Vec::new(),
                    switch_trays: Vec::new(),
                });
                self.rack_lines.push(line);
            }
            "compute-tray" => {
                let name = one_name(self, "compute tray")?;
                let [gpus] = self.options(line, &rest[1..], [("gpus", 4, 1, MAX_GPUS_PER_TRAY)])?;
                if self.topo.compute_tray_count() >= usize::from(u16::MAX) {
                    return Err(self.err(
                        line,
                        &name,
                        "too many compute trays",
                        "a domain holds at most 65535 compute trays",
                    ));
                }
                self.rack(line, text)?;
                self.declare(line, &name, Kind::Compute)?;
                self.rack(line, text)?
                    .compute_trays
                    .push(ComputeTray { name, gpus });
            }
            "switch-tray" => {
                let name = one_name(self, "switch tray")?;
                let [osfp] = self.options(line, &rest[1..], [("osfp", 0, 0, MAX_OSFP_PER_TRAY)])?;
                self.rack(line, text)?;
                self.declare(line, &name, Kind::Switch { osfp })?;
                self.rack(line, text)?
                    .switch_trays
                    .push(SwitchTray { name, osfp });
            }
            "link" => {
                let [a, b] = rest else {
                    return Err(self.err(
                        line,
                        text,
                        "a link joins two switch trays",
                        "write `link SWITCH_TRAY SWITCH_TRAY`",
                    ));
                };
                for end in [a, b] {
                    match self.names.get(*end) {
                        Some((Kind::Switch { osfp }, _)) if *osfp > 0 => {}
                        Some((Kind::Switch { .. }, decl)) => {
                            let fix = format!(
                                "links use OSFP ports: give the switch tray on line {decl} osfp=N"
                            );
                            return Err(self.err(
                                line,
                                end,
                                "switch tray without OSFP ports",
                                &fix,
                            ));
                        }
                        Some((_, decl)) => {
                            let fix = format!(
                                "line {decl} declares it as something else; link two switch trays"
                            );
                            return Err(self.err(line, end, "not a switch tray", &fix));
                        }
                        None => {
                            return Err(self.err(
                                line,
                                end,
                                "unknown switch tray",
                                "declare it with `switch-tray NAME osfp=N` above the link",
                            ));
                        }
                    }
                }
                if a == b {
                    return Err(self.err(
                        line,
                        text,
                        "a switch tray linked to itself",
                        "link two different switch trays",
                    ));
                }
                let dup = self
                    .topo
                    .links
                    .iter()
                    .any(|l| (l.a == *a && l.b == *b) || (l.a == *b && l.b == *a));
                if dup {
                    return Err(self.err(
                        line,
                        text,
                        "duplicate link",
                        "declare each pair of switch trays once",
                    ));
                }
                self.topo.links.push(Link {
                    a: (*a).to_owned(),
                    b: (*b).to_owned(),
                });
            }
            _ => {
                let fix = "lines start with topology, rack, compute-tray, switch-tray or link \
                           (# for comments)";
                return Err(self.err(line, keyword, "unknown keyword", fix));
            }
        }
        Ok(())
    }
}

/// "gpus=N" / "osfp=N" for messages.
fn key_list<const N: usize>(keys: &[(&str, u32, u32, u32); N]) -> String {
    keys.iter()
        .map(|k| format!("{}=N", k.0))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parses topology text; `path` only names the file in errors.
pub fn parse(path: &Path, text: &str) -> Result<Topology, FabricError> {
    let mut p = Parser {
        path,
        topo: Topology {
            name: DEFAULT_NAME.to_owned(),
            racks: Vec::new(),
            links: Vec::new(),
        },
        names: HashMap::new(),
        named: false,
        rack_lines: Vec::new(),
    };
    for (i, raw) in text.lines().enumerate() {
        let content = raw.split_once('#').map_or(raw, |(c, _)| c);
        p.line(i + 1, content.trim())?;
    }
    if p.topo.compute_tray_count() == 0 {
        return Err(FabricError::Empty {
            path: PathBuf::from(path),
        });
    }
    for (r, rack) in p.topo.racks.iter().enumerate() {
        if !rack.compute_trays.is_empty() && p.topo.switch_trays_reached(r).is_empty() {
            return Err(p.err(
                p.rack_lines[r],
                &rack.name,
                "rack with compute trays but no switch tray to reach",
                "add a `switch-tray NAME` line to the rack, or link a switch tray of it to \
                 another rack",
            ));
        }
    }
    Ok(p.topo)
}

/// Writes `topo` in the file format; [`parse()`] reads it back unchanged.
pub fn print(topo: &Topology) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(out, "topology {}", topo.name);
    for rack in &topo.racks {
        let _ = writeln!(out, "rack {}", rack.name);
        for s in &rack.switch_trays {
            let _ = writeln!(out, "switch-tray {} osfp={}", s.name, s.osfp);
        }
        for c in &rack.compute_trays {
            let _ = writeln!(out, "compute-tray {} gpus={}", c.name, c.gpus);
        }
    }
    for l in &topo.links {
        let _ = writeln!(out, "link {} {}", l.a, l.b);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{PRESETS, preset};
    use proptest::prelude::*;

    fn err(text: &str) -> String {
        parse(Path::new("/etc/topo.txt"), text)
            .expect_err("must fail")
            .to_string()
    }

    const GOOD: &str = "# two racks\ntopology lab\nrack a\nswitch-tray a-s osfp=2 # two ports\n\
                        compute-tray a-c gpus=4\n\nrack b\nswitch-tray b-s osfp=2\n\
                        compute-tray b-c\nlink a-s b-s\n";

    #[test]
    fn parses_a_documented_file() {
        let t = parse(Path::new("t"), GOOD).expect("parses");
        assert_eq!(t.name, "lab");
        assert_eq!(
            (t.racks.len(), t.compute_tray_count(), t.gpu_count()),
            (2, 2, 8)
        );
        assert_eq!(t.fabric_count(), 1);
        assert_eq!(t.links.len(), 1);
    }

    #[test]
    fn errors_name_file_line_value_and_fix() {
        let e = err("rack a\nswitch-tray s\ncompute-tray c gpus=99\n");
        assert!(
            e.starts_with(
                "/etc/topo.txt:3: bad value: \"gpus=99\"; gpus takes a whole number from 1 to 16"
            ),
            "{e}"
        );
        let e = err("compute-tray c\n");
        assert!(
            e.starts_with("/etc/topo.txt:1: tray outside a rack") && e.contains("rack NAME"),
            "{e}"
        );
        let e = err("rack a\nswitch-tray s\ncompute-tray s\n");
        assert!(
            e.contains(":3: duplicate name: \"s\"") && e.contains("line 2"),
            "{e}"
        );
        let e = err("rack a\nswitch-tray s\ncompute-tray c\nlink s t\n");
        assert!(
            e.contains(":4: switch tray without OSFP ports: \"s\"") && e.contains("line 2"),
            "{e}"
        );
        let e = err("rack a\nswitch-tray s osfp=1\ncompute-tray c\nlink s nowhere\n");
        assert!(e.contains(":4: unknown switch tray: \"nowhere\""), "{e}");
        let e = err("rack a\nswitch-tray s osfp=1\ncompute-tray c\nlink s c\n");
        assert!(e.contains(":4: not a switch tray: \"c\""), "{e}");
        let e = err("rack a\nswitch-tray s\ngpu-tray c\n");
        assert!(
            e.contains(":3: unknown keyword: \"gpu-tray\"") && e.contains("compute-tray"),
            "{e}"
        );
        let e = err("rack a\nswitch-tray s speed=3\n");
        assert!(
            e.contains(":2: unknown option: \"speed=3\"; this line takes osfp=N"),
            "{e}"
        );
        let e = err("rack a\nswitch-tray s\ncompute-tray c/1\n");
        assert!(e.contains(":3: invalid name: \"c/1\""), "{e}");
        let e = err("rack a\ncompute-tray c\n");
        assert!(
            e.contains(":1: rack with compute trays but no switch tray to reach: \"a\""),
            "{e}"
        );
        let e = err("# nothing\n");
        assert!(e.starts_with("/etc/topo.txt: no compute trays"), "{e}");
        let long = "x".repeat(500);
        let e = err(&format!("{long}\n"));
        assert!(e.contains('…') && e.len() < 400, "{e}");
    }

    #[test]
    fn a_rack_may_reach_switch_trays_through_links_only_if_it_has_some() {
        // Rack b has no switch tray of its own and nothing links to it: refused.
        let e = err("rack a\nswitch-tray s osfp=1\ncompute-tray c\nrack b\ncompute-tray d\n");
        assert!(e.contains(":4: rack with compute trays"), "{e}");
    }

    #[test]
    fn presets_round_trip() {
        for p in PRESETS {
            let t = preset(p.name).expect("preset");
            assert_eq!(
                parse(Path::new("p"), &print(&t)).expect("parses"),
                t,
                "{}",
                p.name
            );
        }
    }

    fn name() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9._-]{0,6}"
    }

    /// Valid topologies: unique names (a prefix per kind and index), every rack with a switch
    /// tray, links only between trays with OSFP ports.
    fn topology() -> impl Strategy<Value = Topology> {
        let rack = (
            name(),
            prop::collection::vec((name(), 1u32..=MAX_GPUS_PER_TRAY), 1..5),
            prop::collection::vec((name(), 0u32..=MAX_OSFP_PER_TRAY), 1..4),
        );
        (
            name(),
            prop::collection::vec(rack, 1..5),
            prop::collection::vec(
                (any::<prop::sample::Index>(), any::<prop::sample::Index>()),
                0..6,
            ),
        )
            .prop_map(|(topo, racks, links)| {
                let racks: Vec<Rack> = racks
                    .into_iter()
                    .enumerate()
                    .map(|(r, (rn, cs, ss))| Rack {
                        name: format!("r{r}{rn}"),
                        compute_trays: cs
                            .into_iter()
                            .enumerate()
                            .map(|(i, (n, gpus))| ComputeTray {
                                name: format!("c{r}x{i}{n}"),
                                gpus,
                            })
                            .collect(),
                        switch_trays: ss
                            .into_iter()
                            .enumerate()
                            .map(|(i, (n, osfp))| SwitchTray {
                                name: format!("s{r}x{i}{n}"),
                                osfp,
                            })
                            .collect(),
                    })
                    .collect();
                let ports: Vec<String> = racks
                    .iter()
                    .flat_map(|r| &r.switch_trays)
                    .filter(|s| s.osfp > 0)
                    .map(|s| s.name.clone())
                    .collect();
                let mut out: Vec<Link> = Vec::new();
                if !ports.is_empty() {
                    for (a, b) in links {
                        let (a, b) = (a.get(&ports).clone(), b.get(&ports).clone());
                        let dup = out
                            .iter()
                            .any(|l| (l.a == a && l.b == b) || (l.a == b && l.b == a));
                        if a != b && !dup {
                            out.push(Link { a, b });
                        }
                    }
                }
                Topology {
                    name: format!("t{topo}"),
                    racks,
                    links: out,
                }
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn print_then_parse_is_identity(t in topology()) {
            let text = print(&t);
            let back = parse(Path::new("p"), &text);
            prop_assert!(back.is_ok(), "{text}\n{back:?}");
            prop_assert_eq!(back.ok(), Some(t));
        }
    }
}
