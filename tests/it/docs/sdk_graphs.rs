//! Import graphs of the SDKs, in the shape `docs.rs` checks for cycles.
//!
//! The unit a cycle is judged at is each language's own: a file for Python
//! and TypeScript (a module imports another module's file), a package for
//! Go and Java (files of one package see each other without importing, and
//! Go refuses package cycles itself; the check keeps Java honest and pins
//! the rule). Python's package `__init__` and TypeScript's `index.ts` are
//! the roots: like a Rust `mod.rs`, they re-export their children, and an
//! edge to or from a root is parent/child, not layering. Java and Go
//! packages are flat: `a.b` importing `a.b.c` and back is a cycle.
//!
//! The parsers read import statements, not the language: good enough for
//! code written in the usual style, and `the_sdk_parsers_see_imports`
//! proves each sees a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::Module;

/// Files under `dir` ending in `.{extension}`, sorted, skipping
/// dependency and build folders.
fn files(dir: &Path, extension: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().map(|n| n.to_string_lossy().to_string());
        let skipped = name.as_deref().is_some_and(|n| {
            matches!(
                n,
                "node_modules" | "target" | "dist" | "build" | "__pycache__"
            ) || n.starts_with('.')
        });
        if skipped {
            continue;
        }
        if path.is_dir() {
            files(&path, extension, out);
        } else if path.extension().is_some_and(|e| e == extension) {
            out.push(path);
        }
    }
}

fn node(name: &str) -> Module {
    vec![name.to_string()]
}

/// Adds `from → to` unless either is a root (parent/child) or they are
/// the same module.
fn edge(graph: &mut BTreeMap<Module, BTreeSet<Module>>, from: &str, to: &str, roots: &[&str]) {
    if from != to && !roots.contains(&from) && !roots.contains(&to) {
        graph.entry(node(from)).or_default().insert(node(to));
    }
}

/// Python: the modules of the package in `dir` (one level), by file stem.
/// Sees `from .x import`, `from pkg.x import`, `import pkg.x`, and
/// `from . import x`, outside triple-quoted strings.
pub fn python(dir: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let package = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let mut sources = Vec::new();
    files(dir, "py", &mut sources);
    let stems: BTreeSet<String> = sources
        .iter()
        .filter(|p| p.parent() == Some(dir))
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().to_string()))
        .collect();
    let mut graph = BTreeMap::new();
    for stem in &stems {
        graph.insert(node(stem), BTreeSet::new());
        let text = std::fs::read_to_string(dir.join(format!("{stem}.py"))).expect("read");
        // Docstrings are every other piece between triple quotes.
        let code: String = text
            .split("\"\"\"")
            .step_by(2)
            .collect::<Vec<_>>()
            .join("\n");
        for line in code.lines().map(str::trim) {
            let targets: Vec<String> = if let Some(rest) = line.strip_prefix("from ") {
                let (from, names) = rest.split_once(" import ").unwrap_or((rest, ""));
                let from = from.trim();
                let module = from
                    .strip_prefix(&format!("{package}."))
                    .or_else(|| from.strip_prefix('.'))
                    .unwrap_or("");
                if from == "." || from == package {
                    names
                        .split(',')
                        .map(|n| n.trim().trim_matches(['(', ')']).to_string())
                        .map(|n| n.split(" as ").next().unwrap_or("").trim().to_string())
                        .collect()
                } else {
                    vec![module.split('.').next().unwrap_or("").to_string()]
                }
            } else if let Some(rest) = line.strip_prefix("import ") {
                rest.split(',')
                    .filter_map(|m| m.trim().strip_prefix(&format!("{package}.")))
                    .map(|m| m.split(['.', ' ']).next().unwrap_or("").to_string())
                    .collect()
            } else {
                Vec::new()
            };
            for target in targets.iter().filter(|t| stems.contains(*t)) {
                edge(&mut graph, stem, target, &["__init__"]);
            }
        }
    }
    graph
}

/// TypeScript: the files under `dir` by path without extension (relative
/// imports `"./x"`, `"./x.js"`, `"../y"` in `import`/`export … from` and
/// `import("…")`), outside comment lines.
pub fn typescript(dir: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut sources = Vec::new();
    files(dir, "ts", &mut sources);
    let name_of = |path: &Path| -> Option<String> {
        let relative = path.strip_prefix(dir).ok()?.with_extension("");
        Some(relative.to_string_lossy().replace('\\', "/"))
    };
    let known: BTreeSet<String> = sources.iter().filter_map(|p| name_of(p)).collect();
    let mut graph = BTreeMap::new();
    for path in &sources {
        let Some(from) = name_of(path) else { continue };
        graph.insert(node(&from), BTreeSet::new());
        let text = std::fs::read_to_string(path).expect("read");
        for line in text.lines().map(str::trim) {
            if line.starts_with("//") || line.starts_with('*') || line.starts_with("/*") {
                continue;
            }
            for quote in ['"', '\''] {
                let pieces: Vec<&str> = line.split(quote).collect();
                for (i, piece) in pieces.iter().enumerate().skip(1).step_by(2) {
                    let before = pieces[i - 1].trim_end();
                    let is_import = before.ends_with("from")
                        || before.ends_with("import(")
                        || before == "import";
                    if !is_import || !piece.starts_with('.') {
                        continue;
                    }
                    let base = path.parent().unwrap_or(dir).join(piece);
                    // `with_extension("")` also drops the `.js` of ESM specifiers.
                    let target = name_of(&normalize(&base)).map(|t| {
                        if known.contains(&t) {
                            t
                        } else {
                            format!("{t}/index")
                        }
                    });
                    if let Some(target) = target.filter(|t| known.contains(t)) {
                        edge(&mut graph, &from, &target, &["index"]);
                    }
                }
            }
        }
    }
    graph
}

/// `a/./b/../c` → `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Go: the packages of the module in `dir` (its `go.mod`), by directory
/// relative to the module root; edges from import paths under the module.
pub fn go(dir: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let go_mod = std::fs::read_to_string(dir.join("go.mod")).expect("go.mod");
    let module = go_mod
        .lines()
        .find_map(|l| l.trim().strip_prefix("module "))
        .expect("module line")
        .trim()
        .to_string();
    let mut sources = Vec::new();
    files(dir, "go", &mut sources);
    let mut graph = BTreeMap::new();
    for path in &sources {
        let package = path
            .parent()
            .and_then(|p| p.strip_prefix(dir).ok())
            .map(|p| p.to_string_lossy().replace('\\', "/"))
            .unwrap_or_default();
        let package = if package.is_empty() {
            ".".to_string()
        } else {
            package
        };
        graph.entry(node(&package)).or_insert_with(BTreeSet::new);
        let text = std::fs::read_to_string(path).expect("read");
        for piece in text.split('"').skip(1).step_by(2) {
            let target = if piece == module {
                Some(".".to_string())
            } else {
                piece
                    .strip_prefix(&format!("{module}/"))
                    .map(str::to_string)
            };
            if let Some(target) = target {
                edge(&mut graph, &package, &target, &[]);
            }
        }
    }
    graph
}

/// Java: the packages of every Maven module under `dir` (their
/// `src/main/java`), flat; edges from `import` and `import static` lines.
pub fn java(dir: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut sources = Vec::new();
    files(dir, "java", &mut sources);
    sources.retain(|p| p.to_string_lossy().contains("src/main/java"));
    let mut packages = BTreeSet::new();
    let mut parsed = Vec::new();
    for path in &sources {
        let text = std::fs::read_to_string(path).expect("read");
        let package = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("package "))
            .map(|p| p.trim_end_matches(';').trim().to_string())
            .unwrap_or_default();
        packages.insert(package.clone());
        parsed.push((package, text));
    }
    let mut graph = BTreeMap::new();
    for (package, text) in &parsed {
        graph.entry(node(package)).or_insert_with(BTreeSet::new);
        for line in text.lines().map(str::trim) {
            let Some(rest) = line.strip_prefix("import ") else {
                continue;
            };
            let name = rest
                .trim_start_matches("static ")
                .trim_end_matches(';')
                .trim();
            // The longest known package that prefixes the imported name.
            let target = packages
                .iter()
                .filter(|p| name.starts_with(&format!("{p}.")))
                .max_by_key(|p| p.len());
            if let Some(target) = target {
                edge(&mut graph, package, target, &[]);
            }
        }
    }
    graph
}
