//! The documentation holds together: every relative link in README.md, CHANGELOG.md,
//! CONTRIBUTING.md and docs/**/*.md resolves — the file (or directory) exists, and an
//! `#anchor` names a heading of the target, as GitHub makes anchors of headings — and the README
//! stays a README: at most 250 lines, opening with the two commands CI's contract depends on.
//!
//! A failure names `file:line`, the link and what is wrong with it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};

/// The README's length limit (issue 32): the rest belongs in docs/.
const README_MAX_LINES: usize = 250;

/// The README's opening, which `.ci/run` and the end-to-end tests rely on.
const README_COMMANDS: [&str; 2] = [
    "cargo run --release -p openimex-lab -- demo   # a simulated GB200 NVL72: 18 trays x 4 GPUs, every GPU imports every other GPU's memory",
    "cargo test --workspace                        # the whole test suite (what .ci/run runs, after fmt, clippy, dependency rules, rustdoc)",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md, CHANGELOG.md, CONTRIBUTING.md and every `.md` file under docs/, sorted.
fn documents() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let root = root();
    let mut docs: Vec<PathBuf> = ["README.md", "CHANGELOG.md", "CONTRIBUTING.md"]
        .iter()
        .map(|f| root.join(f))
        .collect();
    walk(&root.join("docs"), &mut docs);
    docs.sort();
    docs
}

/// The line with its inline code spans blanked out (links inside code are not links).
fn without_code_spans(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|c| **c == '`').count();
        // The closing run: the next run of exactly `run` backticks.
        let mut j = i + run;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let other = chars[j..].iter().take_while(|c| **c == '`').count();
                if other == run {
                    close = Some(j + other);
                    break;
                }
                j += other;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                out.push(' ');
                i = end;
            }
            None => {
                out.extend(&chars[i..i + run]);
                i += run;
            }
        }
    }
    out
}

/// Whether a line opens or closes a fenced code block.
fn is_fence(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("```") || t.starts_with("~~~")
}

/// The targets of the inline links `[text](target)` and images of a line (code spans
/// excluded), and of a reference definition `[label]: target`.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut targets = Vec::new();
    let trimmed = line.trim_start();
    if trimmed.starts_with('[')
        && let Some(close) = trimmed.find("]:")
        && !trimmed[..close].contains('(')
    {
        if let Some(target) = trimmed[close + 2..].split_whitespace().next() {
            targets.push(target.trim_matches(['<', '>']).to_owned());
        }
        return targets;
    }
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let mut depth = 1;
        let mut end = None;
        for (i, c) in after.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(i);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(end) = end else { break };
        let inside = after[..end].trim();
        let target = inside
            .strip_prefix('<')
            .and_then(|s| s.split_once('>').map(|(t, _)| t))
            .unwrap_or_else(|| inside.split_whitespace().next().unwrap_or(""));
        targets.push(target.to_owned());
        rest = &after[end + 1..];
    }
    targets
}

/// Whether a target leaves the repository (a URL, a mail address): not checked here.
fn is_external(target: &str) -> bool {
    let scheme = target.split(':').next().unwrap_or("");
    target.contains(':')
        && !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// The anchor GitHub gives a heading's text: links reduced to their text, lower case, every
/// character but letters, digits, `-`, `_` and spaces dropped, spaces made `-`.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // [text](url) -> text
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](") else {
            break;
        };
        let Some(close) = rest[open + mid..].find(')') else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..open + mid]);
        rest = &rest[open + mid + close + 1..];
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks), with GitHub's `-1`, `-2`
/// suffixes for repeated ones.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if is_fence(line) {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let t = line.trim_start();
        let hashes = t.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !t[hashes..].starts_with(' ') {
            continue;
        }
        let heading = t[hashes..].trim().trim_end_matches('#').trim();
        let base = slug(heading);
        let n = seen.entry(base.clone()).or_insert(0);
        out.push(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// `path` with `.` and `..` folded, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn display(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// What is wrong with `target` written in `file`, if anything.
fn check(file: &Path, target: &str, cache: &mut BTreeMap<PathBuf, Vec<String>>) -> Option<String> {
    if target.is_empty() {
        return Some("empty link".to_owned());
    }
    if is_external(target) {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let dest = if path.is_empty() {
        file.to_path_buf()
    } else if path.starts_with('/') {
        return Some("absolute path: link relative to this file instead".to_owned());
    } else {
        normalize(&file.parent().expect("a file has a directory").join(path))
    };
    if !dest.starts_with(root()) {
        return Some(format!("{} is outside the repository", dest.display()));
    }
    if !dest.exists() {
        return Some(format!("{} does not exist", display(&dest)));
    }
    let anchor = anchor?;
    if dest.extension().is_none_or(|e| e != "md") {
        return Some(format!(
            "an anchor into {}, which is not Markdown",
            display(&dest)
        ));
    }
    let known = cache.entry(dest.clone()).or_insert_with(|| {
        anchors(&std::fs::read_to_string(&dest).expect("a Markdown file that exists reads"))
    });
    if known.iter().any(|a| a == anchor) {
        None
    } else {
        Some(format!(
            "{} has no heading with the anchor #{anchor}",
            display(&dest)
        ))
    }
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let docs = documents();
    assert!(
        docs.iter().any(|d| d.ends_with("docs/README.md")),
        "no docs/ found under {}",
        root().display()
    );
    let mut cache = BTreeMap::new();
    let mut broken = Vec::new();
    let mut links = 0;
    for file in &docs {
        let Ok(text) = std::fs::read_to_string(file) else {
            broken.push(format!(
                "{}: missing (the docs link checker expects it)",
                display(file)
            ));
            continue;
        };
        let mut in_code = false;
        for (i, line) in text.lines().enumerate() {
            if is_fence(line) {
                in_code = !in_code;
                continue;
            }
            if in_code {
                continue;
            }
            for target in link_targets(line) {
                links += 1;
                if let Some(problem) = check(file, &target, &mut cache) {
                    broken.push(format!(
                        "{}:{}: ({target}): {problem}",
                        display(file),
                        i + 1
                    ));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} of {links} links do not resolve:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn the_readme_is_short_and_opens_with_the_two_commands() {
    let path = root().join("README.md");
    let text = std::fs::read_to_string(&path).expect("README.md");
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.len() <= README_MAX_LINES,
        "README.md has {} lines, more than {README_MAX_LINES}: move the detail into docs/",
        lines.len()
    );
    let block: Vec<&str> = lines.iter().take(8).copied().collect();
    for command in README_COMMANDS {
        assert!(
            block.contains(&command),
            "README.md must open with the line\n{command}\n(CI's contract); its first lines are:\n{}",
            block.join("\n")
        );
    }
}

#[test]
fn the_link_checker_knows_github_anchors() {
    assert_eq!(
        slug("1.6 Daemon call sequence (unicast)"),
        "16-daemon-call-sequence-unicast"
    );
    assert_eq!(slug("`!M!`: node map mismatch"), "m-node-map-mismatch");
    assert_eq!(
        slug("A new domain: `openimex init`"),
        "a-new-domain-openimex-init"
    );
    assert_eq!(
        slug("6. What \"done\" means here"),
        "6-what-done-means-here"
    );
    assert_eq!(slug("See [ctl](ctl.md) — views"), "see-ctl--views");
    assert_eq!(
        anchors("# A\n## A\n```\n# not a heading\n```\n### A\n"),
        ["a", "a-1", "a-2"]
    );
    assert_eq!(
        link_targets("[a](x.md#y) `[b](not.md)` ![c](img.png \"t\") [d]: <ref.md>"),
        ["x.md#y", "img.png"]
    );
    assert_eq!(link_targets("[d]: ref.md"), ["ref.md"]);
    assert!(is_external("https://example.com/a"));
    assert!(!is_external("docs/a.md#b"));
}
