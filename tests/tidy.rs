//! Style rules run as a test (house rules 1 and 6 of the style guide): every source file opens
//! with a `//!` doc; in the engine only `storage/` names redb and only `sync.rs` names
//! `std::sync` or loom; the engine's manifest depends on none of the server's crates (the
//! crate seam, so the rule "only the server names the RPC stack" holds by construction); and
//! every invariant identifier a test cites is one the code defines.
//!
//! Each rule is a function over file texts, and `each_rule_can_fail` feeds each one a planted
//! violation, so a rule that stopped seeing anything would fail here.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A file as the rules see it: its path relative to the repository root, and its text.
struct Source {
    path: String,
    text: String,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The `.rs` files below each of `dirs` (relative to the root), in path order.
fn sources(dirs: &[&str]) -> Vec<Source> {
    let mut files = Vec::new();
    for dir in dirs {
        let before = files.len();
        rust_files(&root().join(dir), &mut files);
        assert!(files.len() > before, "no Rust files under {dir}");
    }
    files.sort();
    files
        .into_iter()
        .map(|file| Source {
            path: file
                .strip_prefix(root())
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/"),
            text: fs::read_to_string(&file).unwrap(),
        })
        .collect()
}

/// Returns the code of `text` with `//` comments removed, so rules apply to code only.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().filter_map(|(i, line)| {
        let code = line.split("//").next().unwrap_or("");
        (!code.trim().is_empty()).then_some((i + 1, code))
    })
}

/// The files whose first line (after inner attributes) is not a `//!` doc.
fn without_module_doc(files: &[Source]) -> Vec<String> {
    files
        .iter()
        .filter(|f| {
            let first = f
                .text
                .lines()
                .find(|l| !l.trim().is_empty() && !l.starts_with("#!["));
            !first.is_some_and(|l| l.starts_with("//!"))
        })
        .map(|f| f.path.clone())
        .collect()
}

/// The code lines that name one of `needles` in a file whose path does not start with one of
/// `allowed`.
fn named_outside(files: &[Source], needles: &[&str], allowed: &[&str]) -> Vec<String> {
    let mut offenders = Vec::new();
    for file in files {
        if allowed.iter().any(|a| file.path.starts_with(a)) {
            continue;
        }
        for (line, code) in code_lines(&file.text) {
            if needles.iter().any(|n| code.contains(n)) {
                offenders.push(format!("{}:{line}: {}", file.path, code.trim()));
            }
        }
    }
    offenders
}

/// The crates a manifest's `[dependencies]`, `[dev-dependencies]` and target-specific
/// dependency tables name.
fn manifest_dependencies(manifest: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut in_dependencies = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_dependencies = line.ends_with("dependencies]");
            continue;
        }
        if in_dependencies
            && !line.starts_with('#')
            && let Some((name, _)) = line.split_once('=')
        {
            names.insert(name.trim().to_string());
        }
    }
    names
}

/// The identifiers of the form `WORD-N` (`ENG-1`, `WATCH-SRV-2`) in `text`.
fn invariant_ids(text: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut start = 0;
    while start < bytes.len() {
        let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
        if !is_word(bytes[start]) {
            start += 1;
            continue;
        }
        let mut end = start;
        while end < bytes.len() && is_word(bytes[end]) {
            end += 1;
        }
        let token = &text[start..end];
        if let Some((head, number)) = token.rsplit_once('-') {
            let head_ok = head.split('-').all(|part| {
                part.starts_with(|c: char| c.is_ascii_uppercase())
                    && part
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
            });
            if head_ok && !number.is_empty() && number.chars().all(|c| c.is_ascii_digit()) {
                ids.insert(token.to_string());
            }
        }
        start = end;
    }
    ids
}

/// Identifiers that look like invariants but name something else.
const NOT_INVARIANTS: &[&str] = &["SHA-256", "CRC-32", "UTF-8"];

/// The invariant identifiers cited in `tests` that no file of `code` defines (`ID:` after a
/// doc bullet).
fn cited_but_undefined(tests: &[Source], code: &[Source]) -> Vec<String> {
    let defined: BTreeSet<String> = code
        .iter()
        .flat_map(|f| {
            f.text
                .lines()
                .filter_map(|l| l.trim_start().strip_prefix("//! - "))
                .filter_map(|l| l.trim_start_matches('*').split_once(':'))
                .map(|(id, _)| id.trim_end_matches('*').to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    let mut missing = Vec::new();
    for file in tests {
        for id in invariant_ids(&file.text) {
            if !defined.contains(&id) && !NOT_INVARIANTS.contains(&id.as_str()) {
                missing.push(format!("{}: {id}", file.path));
            }
        }
    }
    missing
}

fn engine_sources() -> Vec<Source> {
    sources(&["src"])
}

fn test_sources() -> Vec<Source> {
    sources(&[
        "tests",
        "server/tests",
        "loom-tests/tests",
        "fuzz/fuzz_targets",
    ])
}

#[test]
fn every_source_and_test_file_starts_with_a_module_doc() {
    let mut files = sources(&["src", "server/src", "benches", "loom-tests"]);
    files.extend(test_sources());
    let missing = without_module_doc(&files);
    assert!(missing.is_empty(), "files without a //! doc: {missing:#?}");
}

#[test]
fn only_storage_names_redb() {
    let offenders = named_outside(
        &engine_sources(),
        &["redb::", "use redb"],
        &["src/storage/"],
    );
    assert!(
        offenders.is_empty(),
        "redb named outside storage/:\n{offenders:#?}"
    );
}

#[test]
fn only_sync_names_std_sync_or_loom() {
    let offenders = named_outside(
        &engine_sources(),
        &["std::sync", "loom::"],
        &["src/sync.rs"],
    );
    assert!(
        offenders.is_empty(),
        "std::sync or loom named outside sync.rs:\n{offenders:#?}"
    );
}

/// The crates the engine must build without (the server's stack).
const SERVER_CRATES: &[&str] = &[
    "tokio",
    "tonic",
    "tonic-prost",
    "prost",
    "axum",
    "hyper",
    "clap",
    "tracing",
    "tracing-subscriber",
    "serde_json",
    "etcd-client",
    "criterion",
    "rustls",
    "tokio-rustls",
    "rcgen",
];

#[test]
fn the_engine_depends_on_no_server_crate() {
    let manifest = fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let deps = manifest_dependencies(&manifest);
    assert!(
        deps.contains("redb"),
        "the manifest parser found no dependencies: {deps:?}"
    );
    let server: Vec<_> = deps
        .iter()
        .filter(|d| SERVER_CRATES.contains(&d.as_str()))
        .collect();
    assert!(
        server.is_empty(),
        "the engine's manifest names server crates: {server:?}"
    );
    // Nor does the engine's code name them.
    let needles: Vec<String> = SERVER_CRATES
        .iter()
        .map(|c| format!("{}::", c.replace('-', "_")))
        .collect();
    let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
    let offenders = named_outside(&engine_sources(), &needles, &[]);
    assert!(
        offenders.is_empty(),
        "the engine names server crates:\n{offenders:#?}"
    );
}

#[test]
fn every_invariant_a_test_cites_is_defined_in_the_code() {
    let mut code = engine_sources();
    code.extend(sources(&["server/src"]));
    let tests = test_sources();
    assert!(
        tests.iter().any(|t| !invariant_ids(&t.text).is_empty()),
        "no test cites an invariant: the scanner is broken"
    );
    let missing = cited_but_undefined(&tests, &code);
    assert!(
        missing.is_empty(),
        "invariants cited by tests but defined nowhere:\n{missing:#?}"
    );
}

/// The top-level modules of the engine each file's code names (`crate::x`), by module.
fn module_graph(files: &[Source]) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let relative = file.path.strip_prefix("src/").unwrap_or(&file.path);
        let module = relative
            .split('/')
            .next()
            .unwrap_or("")
            .trim_end_matches(".rs")
            .to_string();
        for (_, code) in code_lines(&file.text) {
            for (at, _) in code.match_indices("crate::") {
                let name: String = code[at + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    graph.entry(module.clone()).or_default().insert(name);
                }
            }
        }
    }
    graph
}

/// The pairs (a, b) where a names b and b reaches a again.
fn import_cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<(String, String)> {
    let mut cycles = Vec::new();
    for (a, names) in graph {
        for b in names {
            let mut seen = BTreeSet::new();
            let mut stack = vec![b.clone()];
            while let Some(at) = stack.pop() {
                if &at == a {
                    cycles.push((a.clone(), b.clone()));
                    break;
                }
                if seen.insert(at.clone()) {
                    stack.extend(graph.get(&at).into_iter().flatten().cloned());
                }
            }
        }
    }
    cycles
}

#[test]
fn no_import_cycle_between_the_engines_modules() {
    let graph = module_graph(&engine_sources());
    assert!(
        graph.contains_key("engine"),
        "the module scanner found nothing: {graph:?}"
    );
    let cycles = import_cycles(&graph);
    assert!(
        cycles.is_empty(),
        "modules that reach each other: {cycles:?}"
    );
}

fn planted(path: &str, text: &str) -> Vec<Source> {
    vec![Source {
        path: path.to_string(),
        text: text.to_string(),
    }]
}

#[test]
fn each_rule_can_fail() {
    // A file without a module doc is found; one with a doc after `#![...]` is not.
    assert_eq!(
        without_module_doc(&planted("src/a.rs", "use std::fmt;\n")).len(),
        1
    );
    assert!(without_module_doc(&planted("src/a.rs", "#![allow(x)]\n//! Doc.\n")).is_empty());
    // A use in code outside the allowed folder is found; one in a comment or inside it is not.
    let file = planted(
        "src/mvcc/a.rs",
        "//! Doc.\nuse redb::Database;\n// redb:: in a comment\n",
    );
    assert_eq!(
        named_outside(&file, &["redb::"], &["src/storage/"]).len(),
        1
    );
    assert!(named_outside(&file, &["redb::"], &["src/mvcc/"]).is_empty());
    // A server crate in the engine's dependencies is found, in any dependency table.
    let manifest = "[package]\nname = \"x\"\n[dependencies]\nredb = \"4\"\n[target.'cfg(x)'.dependencies]\ntokio = \"1\"\n";
    assert!(manifest_dependencies(manifest).contains("tokio"));
    assert!(!manifest_dependencies(manifest).contains("name"));
    // A cited invariant the code does not define is found; a defined one is not.
    let code = planted(
        "src/a.rs",
        "//! Invariants:\n//! - ENG-1: readers see only durable writes.\n//! - **WATCH-SRV-2**: x.\n",
    );
    // (The undefined identifier is built at run time, so this file does not cite it.)
    let undefined = format!("ENG-{}", 9);
    let text = format!("// checks ENG-1, WATCH-SRV-2 and {undefined} over SHA-256\n");
    let tests = planted("tests/a.rs", &text);
    assert_eq!(
        cited_but_undefined(&tests, &code),
        [format!("tests/a.rs: {undefined}")]
    );
}
