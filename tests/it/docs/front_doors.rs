//! A folder's `mod.rs` is its front door, not the basement its children
//! import from (CODE_STYLE.md, issues 50 and 53): a file of a folder that
//! imports an item its folder's `mod.rs` defines makes the front door and
//! the room behind it depend on each other, an import cycle the module
//! graph of `super::import_graph` leaves out (it ignores parent/child
//! edges). Such an item belongs in a ground-floor file of the folder that
//! both import (`store/embedded/options.rs`, `store/embedded/blocks/layout.rs`).
//!
//! [`KNOWN`] lists the exceptions (none): a new one fails the test, and so
//! does a listed one that is gone (take it off the list).

use std::collections::BTreeSet;

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{CrateRoot, Module, modules, paths_after, rust_modules};

/// `(file, item)`: files allowed to import an item their folder's
/// `mod.rs` defines. None since issue 53 moved every such item to a ground
/// floor (`store/record.rs`, `store/contract.rs`, `engine/core.rs`,
/// `store/cql/pending/index.rs`, …); the list stays so that an exception,
/// if one is ever argued for, is written down here with its reason.
const KNOWN: &[(&str, &str)] = &[];

/// Items a module's own file defines at its top level (rustfmt puts them
/// in column 0): what its children could import from it.
fn defined_items(code: &str) -> BTreeSet<String> {
    let mut items = BTreeSet::new();
    for line in code.lines() {
        let mut rest = line;
        if rest.starts_with("pub") {
            rest = match rest.find(' ') {
                Some(at) => &rest[at + 1..],
                None => continue,
            };
        }
        for keyword in [
            "struct ",
            "enum ",
            "trait ",
            "type ",
            "const ",
            "static ",
            "fn ",
            "async fn ",
        ] {
            if let Some(name) = rest.strip_prefix(keyword) {
                let name: String = name
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    items.insert(name);
                }
            }
        }
    }
    items
}

/// The code of a file without its unit tests (`#[cfg(test)] mod tests`
/// and what follows): tests of a module may use its parent's items.
fn without_tests(code: &str) -> &str {
    code.find("#[cfg(test)]\nmod tests")
        .map_or(code, |at| &code[..at])
}

/// Every `(file, item)` in the library (`src/`) and the bench and fault
/// crates where a file imports an item its folder's `mod.rs` defines, by
/// `super::` or by a `crate::` path.
fn parent_imports() -> BTreeSet<(String, String)> {
    let root = super::root();
    let mut found = parent_imports_in(&modules());
    for dir in ["bench/src", "faults/src"] {
        let crate_modules = rust_modules(&root.join(dir), CrateRoot::Binary);
        assert!(crate_modules.len() > 5, "found {dir}");
        found.extend(parent_imports_in(&crate_modules));
    }
    found
}

/// [`parent_imports`] in one crate's modules.
fn parent_imports_in(modules: &BTreeMap<Module, (PathBuf, String)>) -> BTreeSet<(String, String)> {
    let root = super::root();
    let mut found = BTreeSet::new();
    for (module, (path, code)) in modules {
        let is_front_door = path.file_name().is_some_and(|name| name == "mod.rs");
        let file = path.file_name().map(|n| n.to_string_lossy().to_string());
        let test_file = file.as_deref().is_some_and(|f| f.ends_with("tests.rs"));
        if is_front_door || test_file || module.len() < 2 {
            continue;
        }
        let parent: Module = module[..module.len() - 1].to_vec();
        let Some((parent_path, parent_code)) = modules.get(&parent) else {
            continue;
        };
        if !parent_path.ends_with("mod.rs") {
            continue;
        }
        let defined = defined_items(parent_code);
        let code = without_tests(code);
        let mut used: Vec<String> = paths_after(code, "super")
            .into_iter()
            .filter_map(|path| path.first().cloned())
            .collect();
        used.extend(paths_after(code, "crate").into_iter().filter_map(|path| {
            (path.len() > parent.len() && path.starts_with(&parent))
                .then(|| path[parent.len()].clone())
        }));
        let shown = path
            .strip_prefix(&root)
            .unwrap_or(path)
            .display()
            .to_string();
        for item in used {
            if defined.contains(&item) {
                found.insert((shown.clone(), item));
            }
        }
    }
    found
}

#[test]
fn no_file_imports_its_folders_front_door() {
    let found = parent_imports();
    let known: BTreeSet<(String, String)> = KNOWN
        .iter()
        .map(|(file, item)| (file.to_string(), item.to_string()))
        .collect();
    let listed = |pairs: Vec<&(String, String)>| {
        pairs
            .iter()
            .map(|(file, item)| format!("\n    (\"{file}\", \"{item}\"),"))
            .collect::<String>()
    };
    let new = listed(found.difference(&known).collect());
    let gone = listed(known.difference(&found).collect());
    assert!(
        new.is_empty(),
        "files importing an item their folder's mod.rs defines (move the item to a ground-floor file of the folder that both import):{new}"
    );
    assert!(
        gone.is_empty(),
        "no longer imported from the front door: take these off KNOWN in tests/it/docs/front_doors.rs:{gone}"
    );
}

/// The check sees both ways in: `super::` and a `crate::` path, and leaves
/// out the front door's re-exports and its children's own items.
#[test]
fn the_front_door_check_sees_a_planted_import() {
    let parent = "//! docs\nmod child;\npub use child::Thing;\npub struct Door;\npub(crate) fn helper() {}\nconst LIMIT: usize = 1;\n";
    let defined = defined_items(parent);
    assert_eq!(
        defined,
        ["Door", "LIMIT", "helper"]
            .into_iter()
            .map(String::from)
            .collect()
    );
    let child = "use super::{Door, Thing};\nuse crate::a::helper;\n#[cfg(test)]\nmod tests {\n    use super::super::LIMIT;\n}\n";
    let code = without_tests(child);
    let used: Vec<Vec<String>> = paths_after(code, "super");
    assert_eq!(
        used,
        vec![vec!["Door".to_string()], vec!["Thing".to_string()]]
    );
    assert!(!code.contains("LIMIT"), "unit tests are left out");
}
