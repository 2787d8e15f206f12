//! Checks that keep the architecture and the docs true, so that neither
//! depends on a reviewer remembering:
//!
//! * no import cycle between modules, at any depth, in `src/` (the module
//!   tree reads like the architecture: `api` → `engine` → `store`, leaf
//!   modules below), in the `bench/` and `faults/` crates, and in each SDK
//!   (Python and TypeScript files; Go and Java packages); run alone with
//!   `cargo test --test it docs::`;
//! * no file in `src/`, `bench/src/` or `faults/src/` longer than
//!   [`MAX_LINES`] unless its module docs have a `# Length` section saying
//!   why;
//! * every `pub mod` of `lib.rs` is in the module map of `docs/design.md`;
//! * every file path that the README, CODE_STYLE.md, every document under
//!   docs/ and each SDK's README name (links, backticked paths, the
//!   README's Layout) exists, or is a build output git ignores;
//! * every flag of `idemd serve --help` is in a flag table (the README's,
//!   or docs/scylla.md's for the CQL connection).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod front_doors;
mod paths;
mod sdk_graphs;

/// Longest Rust file without a `# Length` section in its module docs.
const MAX_LINES: usize = 700;

type Module = Vec<String>;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read src")
        .map(|entry| entry.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every module of the library (file path → module path) with its source
/// stripped of `//` comments (doc links name modules without importing
/// them). `main.rs` is the binary, not part of the tree.
fn modules() -> BTreeMap<Module, (PathBuf, String)> {
    rust_modules(&root().join("src"), CrateRoot::Library)
}

/// Which file is a crate's root module.
#[derive(Clone, Copy, PartialEq)]
enum CrateRoot {
    /// `lib.rs`; a `main.rs` beside it is a separate binary and left out.
    Library,
    /// `main.rs` (a binary crate such as `bench/` or `faults/`).
    Binary,
}

/// The modules of the Rust crate whose sources are in `src`.
fn rust_modules(src: &Path, crate_root: CrateRoot) -> BTreeMap<Module, (PathBuf, String)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut modules = BTreeMap::new();
    for path in files {
        let relative = path.strip_prefix(src).expect("under src");
        let mut parts: Vec<String> = relative
            .with_extension("")
            .iter()
            .map(|part| part.to_string_lossy().to_string())
            .collect();
        if parts == ["main"] && crate_root == CrateRoot::Library {
            continue;
        }
        if parts.len() == 1 && parts[0] == "main" {
            parts.pop();
        }
        if parts
            .last()
            .is_some_and(|last| last == "mod" || last == "lib")
        {
            parts.pop();
        }
        let text = std::fs::read_to_string(&path).expect("read source");
        let code: String = text
            .lines()
            .map(|line| line.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        modules.insert(parts, (path, code));
    }
    modules
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths after each `prefix::` in `code`, brace groups expanded to the
/// leading path of each item (`crate::{a::b, c}` gives `a::b` and `c`).
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let needle = format!("{prefix}::");
    let mut rest = code;
    while let Some(at) = rest.find(&needle) {
        let preceded_by_ident = rest[..at].chars().next_back().is_some_and(is_ident);
        rest = &rest[at + needle.len()..];
        if preceded_by_ident {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let end = group
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '{' => 1,
                        '}' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map_or(group.len(), |(i, _)| i);
            let mut item_depth = 0;
            let mut item = String::new();
            for c in group[..end].chars().chain([',']) {
                match c {
                    '{' => item_depth += 1,
                    '}' => item_depth -= 1,
                    ',' if item_depth == 0 => {
                        out.push(leading_path(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
        } else {
            out.push(leading_path(rest));
        }
    }
    out.retain(|path| !path.is_empty());
    out
}

fn leading_path(text: &str) -> Vec<String> {
    let text = text.trim_start();
    let end = text
        .char_indices()
        .find(|&(_, c)| !(is_ident(c) || c == ':'))
        .map_or(text.len(), |(i, _)| i);
    text[..end]
        .split("::")
        .filter(|part| !part.is_empty())
        .map(str::to_string)
        .collect()
}

/// The deepest module that `path` (from the crate root) names.
fn resolve(path: &[String], modules: &BTreeMap<Module, (PathBuf, String)>) -> Option<Module> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|candidate| modules.contains_key(candidate))
}

/// Module → the modules it refers to, leaving out its ancestors and
/// descendants (a parent declares its children; children use their
/// parent's items: neither is a layering decision).
fn import_graph(
    modules: &BTreeMap<Module, (PathBuf, String)>,
) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, (_, code)) in modules {
        // `super` of `a/b.rs` is `a`; of `a/b/mod.rs` it is `a` as well.
        let parent: Module = module[..module.len().saturating_sub(1)].to_vec();
        let mut targets: Vec<Module> = paths_after(code, "crate");
        targets.extend(paths_after(code, "super").into_iter().map(|relative| {
            let mut absolute = parent.clone();
            absolute.extend(relative);
            absolute
        }));
        for target in targets {
            let Some(target) = resolve(&target, modules) else {
                continue;
            };
            let related = target.starts_with(module) || module.starts_with(&target);
            if !related {
                graph.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    graph
}

/// A cycle in the graph projected to modules `depth` segments deep, as a
/// path `a -> b -> a`, if there is one.
fn find_cycle(graph: &BTreeMap<Module, BTreeSet<Module>>, depth: usize) -> Option<Vec<Module>> {
    let mut projected: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (from, targets) in graph {
        for to in targets {
            let (from, to) = (
                from[..from.len().min(depth)].to_vec(),
                to[..to.len().min(depth)].to_vec(),
            );
            if !(from.starts_with(&to) || to.starts_with(&from)) {
                projected.entry(from).or_default().insert(to);
            }
        }
    }
    fn visit(
        node: &Module,
        graph: &BTreeMap<Module, BTreeSet<Module>>,
        stack: &mut Vec<Module>,
        done: &mut BTreeSet<Module>,
    ) -> Option<Vec<Module>> {
        if let Some(at) = stack.iter().position(|m| m == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.clone());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, stack, done) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    projected
        .keys()
        .find_map(|node| visit(node, &projected, &mut Vec::new(), &mut done))
}

fn show(cycle: &[Module]) -> String {
    cycle
        .iter()
        .map(|m| m.join("::"))
        .collect::<Vec<_>>()
        .join(" -> ")
}

/// Fails with the first cycle of `graph`, at any depth, naming `what`.
fn assert_acyclic(what: &str, graph: &BTreeMap<Module, BTreeSet<Module>>) {
    let deepest = graph
        .iter()
        .flat_map(|(from, to)| std::iter::once(from).chain(to))
        .map(Vec::len)
        .max()
        .unwrap_or(1);
    for depth in 1..=deepest {
        if let Some(cycle) = find_cycle(graph, depth) {
            panic!(
                "import cycle between modules of {what} (depth {depth}): {}",
                show(&cycle)
            );
        }
    }
}

#[test]
fn no_import_cycles_between_modules() {
    let modules = modules();
    assert!(modules.len() > 20, "found the source tree");
    assert_acyclic("src/", &import_graph(&modules));
}

#[test]
fn no_import_cycles_in_the_bench_and_fault_crates() {
    for dir in ["bench/src", "faults/src"] {
        let modules = rust_modules(&root().join(dir), CrateRoot::Binary);
        assert!(modules.len() > 5, "found {dir}");
        assert_acyclic(dir, &import_graph(&modules));
    }
}

#[test]
fn no_import_cycles_in_the_sdks() {
    let edges = |graph: &BTreeMap<Module, BTreeSet<Module>>| {
        graph.values().map(BTreeSet::len).sum::<usize>()
    };
    let python = sdk_graphs::python(&root().join("clients/python/src/idemd"));
    assert!(edges(&python) > 5, "parsed the Python SDK: {python:?}");
    assert_acyclic("the Python SDK", &python);
    let typescript = sdk_graphs::typescript(&root().join("clients/typescript/src"));
    assert!(
        edges(&typescript) > 5,
        "parsed the TypeScript SDK: {typescript:?}"
    );
    assert_acyclic("the TypeScript SDK", &typescript);
    let go = sdk_graphs::go(&root().join("clients/go"));
    assert!(edges(&go) > 0, "parsed the Go SDK: {go:?}");
    assert_acyclic("the Go SDK", &go);
    let java = sdk_graphs::java(&root().join("clients/java"));
    assert!(edges(&java) > 0, "parsed the Java SDK: {java:?}");
    assert_acyclic("the Java SDK", &java);
}

/// The SDKs' sources hide no cycle from the parsers above: each parser
/// sees the edges of a known snippet.
#[test]
fn the_sdk_parsers_see_imports() {
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    };
    write(
        "idemd/a.py",
        "from .b import X\n\"\"\"\nfrom .c import Y\n\"\"\"\n",
    );
    write("idemd/b.py", "from idemd.a import Z\nimport idemd.c\n");
    write("idemd/c.py", "");
    let python = sdk_graphs::python(&dir.path().join("idemd"));
    assert_eq!(show(&find_cycle(&python, 1).expect("cycle")), "a -> b -> a");
    assert!(
        !python[&vec!["a".to_string()]].contains(&vec!["c".to_string()]),
        "docstring"
    );
    write("ts/a.ts", "import { x } from \"./b\";\n");
    write("ts/b.ts", "export type { Y } from \"./a.js\";\n");
    let typescript = sdk_graphs::typescript(&dir.path().join("ts"));
    assert_eq!(
        show(&find_cycle(&typescript, 1).expect("cycle")),
        "a -> b -> a"
    );
    write(
        "java/src/main/java/x/a/A.java",
        "package x.a;\nimport x.b.B;\n",
    );
    write(
        "java/src/main/java/x/b/B.java",
        "package x.b;\nimport static x.a.A.f;\n",
    );
    let java = sdk_graphs::java(&dir.path().join("java"));
    assert_eq!(
        show(&find_cycle(&java, 1).expect("cycle")),
        "x.a -> x.b -> x.a"
    );
    write("go/go.mod", "module example.com/m\n");
    write(
        "go/a/a.go",
        "package a\nimport (\n\t\"fmt\"\n\t\"example.com/m/b\"\n)\n",
    );
    write("go/b/b.go", "package b\nimport \"example.com/m/a\"\n");
    let go = sdk_graphs::go(&dir.path().join("go"));
    assert_eq!(show(&find_cycle(&go, 1).expect("cycle")), "a -> b -> a");
}

/// The checker itself finds what it must (a test that cannot fail proves
/// nothing): two files importing each other, through `crate::` paths and
/// brace groups.
#[test]
fn the_cycle_check_sees_a_cycle() {
    let mut modules = BTreeMap::new();
    let file = |name: &str, code: &str| (PathBuf::from(name), code.to_string());
    modules.insert(vec![], file("lib.rs", "pub mod a; pub mod b;"));
    modules.insert(vec!["a".into()], file("a.rs", "use crate::{b::{X, Y}};"));
    modules.insert(vec!["b".into()], file("b.rs", "fn f() { crate::a::g(); }"));
    modules.insert(vec!["c".into()], file("c.rs", "use super::a::Z;"));
    let graph = import_graph(&modules);
    assert_eq!(
        graph.get(&vec!["c".to_string()]),
        Some(&BTreeSet::from([vec!["a".to_string()]]))
    );
    let cycle = find_cycle(&graph, 1).expect("a cycle");
    assert_eq!(show(&cycle), "a -> b -> a");
}

#[test]
fn long_files_say_why() {
    let crates = [
        modules(),
        rust_modules(&root().join("bench/src"), CrateRoot::Binary),
        rust_modules(&root().join("faults/src"), CrateRoot::Binary),
    ];
    for (module, (path, _)) in crates.into_iter().flatten() {
        let text = std::fs::read_to_string(&path).expect("read");
        let lines = text.lines().count();
        let explained = text
            .lines()
            .take_while(|line| line.starts_with("//!") || line.trim().is_empty())
            .any(|line| line.trim() == "//! # Length");
        assert!(
            lines <= MAX_LINES || explained,
            "{} ({}) has {lines} lines: split it, or say why in a `# Length` section of its module docs",
            path.display(),
            module.join("::")
        );
    }
}

#[test]
fn design_doc_maps_every_top_level_module() {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).expect("lib.rs");
    let design = std::fs::read_to_string(root().join("docs/design.md")).expect("design.md");
    let missing: Vec<&str> = lib
        .lines()
        .filter_map(|line| line.trim().strip_prefix("pub mod "))
        .map(|rest| rest.trim_end_matches(';'))
        .filter(|name| !design.contains(&format!("| `{name}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "modules missing from the module map of docs/design.md: {missing:?}"
    );
}

#[test]
fn every_documented_path_exists() {
    let mut checked = 0;
    let mut missing = Vec::new();
    let documents = paths::documents();
    assert!(documents.len() >= 17, "found the documents: {documents:?}");
    for doc in &documents {
        let text = std::fs::read_to_string(root().join(doc)).expect("doc");
        for (path, base) in paths::named_paths(doc, &text) {
            checked += 1;
            if !paths::exists(&base, &path) {
                missing.push(format!("{doc}: {path}"));
            }
        }
    }
    assert!(checked > 50, "parsed the docs ({checked} paths)");
    assert!(
        missing.is_empty(),
        "paths named in the docs that do not exist: {missing:#?}"
    );
}

/// Every document under docs/ and every SDK README is among those the
/// path check reads, and a stale path planted in any of them is found:
/// the one in its own folder for an SDK README, the repository's for the
/// others.
#[test]
fn the_path_check_reads_every_document() {
    let documents = paths::documents();
    for entry in std::fs::read_dir(root().join("docs")).expect("docs/") {
        let name = entry.expect("entry").file_name();
        let name = name.to_str().expect("utf-8");
        if name.ends_with(".md") {
            assert!(documents.contains(&format!("docs/{name}")), "{name}");
        }
    }
    let planted = "Stale: `src/store/cql/gone.rs`; its own: `src/idemd/client.py`.";
    for doc in &documents {
        let stale: Vec<String> = paths::named_paths(doc, planted)
            .into_iter()
            .filter(|(path, base)| !paths::exists(base, path))
            .map(|(path, _)| path)
            .collect();
        assert!(
            stale.contains(&"src/store/cql/gone.rs".to_string()),
            "{doc}: {stale:?}"
        );
        // The Python SDK's README names its own files from its folder.
        let own = doc == "clients/python/README.md";
        assert_eq!(
            stale.contains(&"src/idemd/client.py".to_string()),
            !own,
            "{doc}: {stale:?}"
        );
    }
}

/// The path check sees each shape it claims to (a check that finds
/// nothing proves nothing).
#[test]
fn the_path_check_sees_every_shape() {
    let text = "See [x](nowhere.md#a) and `src/gone.rs:12`, `store/gone/`.\n\
        Not paths: `application/json`, `/v1/claim`, `a b/c`.\n\
        ## Layout\n```text\nsrc/api/ src/missing.rs  what\n```\n";
    let named: Vec<String> = paths::named_paths("README.md", text)
        .into_iter()
        .filter(|(path, base)| !paths::exists(base, path))
        .map(|(path, _)| path)
        .collect();
    assert_eq!(
        named,
        ["nowhere.md", "src/gone.rs", "store/gone/", "src/missing.rs"]
    );
}

#[test]
fn every_serve_flag_is_documented() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_idemd"))
        .args(["serve", "--help"])
        .output()
        .expect("run idemd serve --help");
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    let flags: BTreeSet<String> = help
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = line.strip_prefix("-h, ").unwrap_or(line);
            line.starts_with("--").then(|| {
                line.split(|c: char| c.is_whitespace() || c == '=' || c == '<')
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
        })
        .filter(|flag| flag != "--help" && flag != "--version")
        .collect();
    assert!(flags.len() > 20, "parsed the help: {flags:?}");
    let tables = ["README.md", "docs/scylla.md"]
        .map(|doc| std::fs::read_to_string(root().join(doc)).expect("doc"))
        .join("\n");
    let missing: Vec<&String> = flags
        .iter()
        .filter(|flag| !tables.contains(&format!("| `{flag}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "flags of `idemd serve --help` missing from the flag tables of README.md and docs/scylla.md: {missing:?}"
    );
}

/// Every metric named in src/metrics.rs has a row in the metrics table of
/// docs/operations.md (dashboards and alerts are written from it).
#[test]
fn every_metric_is_documented() {
    let source = std::fs::read_to_string(root().join("src/metrics.rs")).expect("metrics.rs");
    let names: Vec<&str> = source
        .lines()
        .filter(|line| line.starts_with("pub const ") && line.contains(": &str = \"idemd_"))
        .filter_map(|line| line.split('"').nth(1))
        .collect();
    assert!(names.len() > 15, "parsed src/metrics.rs: {names:?}");
    let doc = std::fs::read_to_string(root().join("docs/operations.md")).expect("operations.md");
    let missing: Vec<&&str> = names
        .iter()
        .filter(|name| !doc.contains(&format!("| `{name}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "metrics missing from the table of docs/operations.md: {missing:?}"
    );
}

/// Inherent `impl` blocks (`impl Type`, `impl<T> Type<T>`; not `impl Trait
/// for Type`) in `code`: the type's name.
fn inherent_impls(code: &str) -> Vec<String> {
    code.lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with("impl ") || line.starts_with("impl<"))
        .filter(|line| !line.contains(" for "))
        .filter_map(|line| {
            let mut rest = &line[4..];
            if rest.starts_with('<') {
                let mut depth = 0;
                let end = rest.char_indices().find(|&(_, c)| {
                    depth += match c {
                        '<' => 1,
                        '>' => -1,
                        _ => 0,
                    };
                    depth == 0
                })?;
                rest = &rest[end.0 + 1..];
            }
            let path = rest.trim_start();
            let end = path
                .find(|c: char| !(is_ident(c) || c == ':'))
                .unwrap_or(path.len());
            path[..end].rsplit("::").next().map(str::to_string)
        })
        .filter(|name| !name.is_empty())
        .collect()
}

/// The names of the structs and enums `code` defines.
fn defined_types(code: &str) -> Vec<String> {
    code.lines()
        .map(str::trim_start)
        .filter_map(|line| {
            let line = line
                .strip_prefix("pub(crate) ")
                .or_else(|| line.strip_prefix("pub(super) "))
                .or_else(|| line.strip_prefix("pub "))
                .unwrap_or(line);
            line.strip_prefix("struct ")
                .or_else(|| line.strip_prefix("enum "))
        })
        .map(|rest| {
            rest.chars()
                .take_while(|&c| is_ident(c))
                .collect::<String>()
        })
        .filter(|name| !name.is_empty())
        .collect()
}

/// Where each `impl` is in `modules`: the impls of a type outside the files
/// that define it, as `Type (defined in a.rs) in b.rs`, unless the defining
/// file's `# Where its methods live` names `b.rs` (CODE_STYLE.md).
fn impls_outside_their_home(modules: &BTreeMap<Module, (PathBuf, String)>) -> Vec<String> {
    let src = root().join("src");
    let relative = |path: &Path| {
        path.strip_prefix(&src)
            .unwrap_or(path)
            .display()
            .to_string()
    };
    let mut homes: BTreeMap<String, Vec<&PathBuf>> = BTreeMap::new();
    for (path, code) in modules.values() {
        for name in defined_types(code) {
            homes.entry(name).or_default().push(path);
        }
    }
    let mut outside = Vec::new();
    for (path, code) in modules.values() {
        // Test modules build helpers on the types they test.
        let code = code.split("#[cfg(test)]").next().unwrap_or("");
        for name in inherent_impls(code) {
            let Some(defined_in) = homes.get(&name) else {
                continue;
            };
            if defined_in.contains(&path) {
                continue;
            }
            let file = format!(
                "`{}`",
                path.file_name().unwrap_or_default().to_string_lossy()
            );
            let listed = defined_in.iter().any(|home| {
                let text = std::fs::read_to_string(home).unwrap_or_default();
                text.split("# Where its methods live")
                    .nth(1)
                    .is_some_and(|section| {
                        section
                            .lines()
                            .skip(1)
                            .take_while(|l| l.trim_start().starts_with("///"))
                            .any(|l| l.contains(&file))
                    })
            });
            if !listed {
                outside.push(format!(
                    "{name} (defined in {}) in {}",
                    defined_in
                        .iter()
                        .map(|p| relative(p))
                        .collect::<Vec<_>>()
                        .join(", "),
                    relative(path)
                ));
            }
        }
    }
    outside.sort();
    outside.dedup();
    outside
}

#[test]
fn every_impl_is_in_its_types_home() {
    let outside = impls_outside_their_home(&modules());
    assert!(
        outside.is_empty(),
        "impl blocks outside the file that defines their type, and not listed in its \
         `# Where its methods live` (CODE_STYLE.md):\n{}",
        outside.join("\n")
    );
}
