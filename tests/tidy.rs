//! Style rules run as a test (house rules 1 and 6 of `design/style.md`): every source file
//! opens with a `//!` doc; only `storage/` names redb; only `sync.rs` names `std::sync` or
//! loom; only `server/` names tonic, prost, axum, hyper or tokio.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return files;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Returns the code of `text` with `//` comments removed, so rules apply to code only.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().filter_map(|(i, line)| {
        let code = line.split("//").next().unwrap_or("");
        (!code.trim().is_empty()).then_some((i + 1, code))
    })
}

#[test]
fn every_source_and_test_file_starts_with_a_module_doc() {
    let mut missing = Vec::new();
    for dir in ["src", "tests", "benches", "loom-tests", "fuzz/fuzz_targets"] {
        for file in rust_files(&root().join(dir)) {
            let text = fs::read_to_string(&file).unwrap();
            let first = text
                .lines()
                .find(|l| !l.trim().is_empty() && !l.starts_with("#!["));
            if !first.is_some_and(|l| l.starts_with("//!")) {
                missing.push(file.display().to_string());
            }
        }
    }
    assert!(missing.is_empty(), "files without a //! doc: {missing:#?}");
}

/// Asserts that `needles` appear in code only under the paths `allowed` (relative to src/).
fn named_only_in(needles: &[&str], allowed: &[&str]) {
    let src = root().join("src");
    let mut offenders = Vec::new();
    for file in rust_files(&src) {
        let relative = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if allowed.iter().any(|a| relative.starts_with(a)) {
            continue;
        }
        let text = fs::read_to_string(&file).unwrap();
        for (line, code) in code_lines(&text) {
            for needle in needles {
                if code.contains(needle) {
                    offenders.push(format!("{relative}:{line}: {}", code.trim()));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "{needles:?} named outside {allowed:?}:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn only_storage_names_redb() {
    named_only_in(&["redb::", "use redb"], &["storage/"]);
}

#[test]
fn only_sync_names_std_sync_or_loom() {
    named_only_in(&["std::sync", "loom::"], &["sync.rs"]);
}

#[test]
fn only_server_names_the_rpc_and_http_stack() {
    named_only_in(
        &["tonic::", "prost::", "axum::", "hyper::", "tokio::"],
        &["server/", "bin/"],
    );
}

#[test]
fn the_rules_above_can_fail() {
    // The scanner must see a use in code and ignore one in a comment.
    let text = "use redb::Database;\n// redb:: in a comment\n";
    let hits: Vec<_> = code_lines(text)
        .filter(|(_, c)| c.contains("redb::"))
        .collect();
    assert_eq!(hits.len(), 1);
}
