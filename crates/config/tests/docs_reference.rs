//! The configuration reference of the operator's guide (`docs/operator/configuration.md`) is
//! generated from the parser's key table (`openimex_config::reference`), so it cannot drift:
//! this test fails when a key of the parser has no documentation, when a documented key is not
//! the parser's, or when the document's generated block differs from what the code renders.
//!
//! To rewrite the block after changing a key or its prose:
//! `OPENIMEX_BLESS=1 cargo test -p openimex-config --test docs_reference`.

use std::path::{Path, PathBuf};

use openimex_config::Config;
use openimex_config::reference::{self, BEGIN_MARKER, DOCUMENT, END_MARKER};

const BLESS: &str = "OPENIMEX_BLESS=1 cargo test -p openimex-config --test docs_reference";

fn document() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root).join(DOCUMENT)
}

#[test]
fn every_key_of_the_parser_is_documented_and_nothing_else() {
    let undocumented = reference::undocumented();
    assert!(
        undocumented.is_empty(),
        "keys of the parser's table (crates/config/src/cfg/keys.rs) with no entry in \
         crates/config/src/reference.rs: {undocumented:?}; add a doc! line for each, then run {BLESS}"
    );
    let unknown = reference::unknown();
    assert!(
        unknown.is_empty(),
        "crates/config/src/reference.rs documents keys the parser does not have: {unknown:?}"
    );
}

/// Independent of how `reference` reads the key table: the parser itself must know every
/// documented key. A key spelled in lower case is unknown, and the parser's notice suggests the
/// known key of that spelling.
#[test]
fn the_parser_knows_every_documented_key() {
    for doc in reference::docs() {
        let text = format!("{}=x\n", doc.key.to_ascii_lowercase());
        let cfg = Config::parse(&text, Path::new("probe.cfg"))
            .unwrap_or_else(|e| panic!("{}: {e}", doc.key));
        let hint = format!("did you mean {}?", doc.key);
        assert!(
            cfg.notices().iter().any(|n| n.message.contains(&hint)),
            "the parser does not know {}: {:?}",
            doc.key,
            cfg.notices()
        );
    }
}

#[test]
fn every_default_is_what_an_empty_file_gives() {
    let empty = Config::parse("", Path::new("empty.cfg")).unwrap();
    let defaults = Config::default();
    for doc in reference::docs() {
        assert_eq!(
            (doc.default)(&empty),
            (doc.default)(&defaults),
            "{}: the documented default is not what an empty config.cfg gives",
            doc.key
        );
    }
}

#[test]
fn the_operators_guide_holds_the_generated_table() {
    let path = document();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let Some(generated) = reference::regenerate(&text) else {
        panic!(
            "{} must hold the generated block between the lines\n{BEGIN_MARKER}\nand\n{END_MARKER}",
            path.display()
        );
    };
    if generated == text {
        return;
    }
    if std::env::var_os("OPENIMEX_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &generated)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        eprintln!("rewrote the generated block of {}", path.display());
        return;
    }
    let (line, old, new) = text
        .lines()
        .zip(generated.lines())
        .enumerate()
        .find(|(_, (a, b))| a != b)
        .map(|(i, (a, b))| (i + 1, a.to_owned(), b.to_owned()))
        .unwrap_or((
            text.lines().count().min(generated.lines().count()) + 1,
            String::from("(end of one of them)"),
            String::new(),
        ));
    panic!(
        "{}:{line}: the configuration reference differs from the key table\n  document: {old}\n  \
         generated: {new}\nRegenerate it with: {BLESS}",
        path.display()
    );
}
