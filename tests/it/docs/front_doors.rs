//! A folder's `mod.rs` is its front door, not the basement its children
//! import from (CODE_STYLE.md, issues 50 and 53): a file of a folder that
//! imports an item its folder's `mod.rs` defines makes the front door and
//! the room behind it depend on each other, an import cycle the module
//! graph of `super::import_graph` leaves out (it ignores parent/child
//! edges). Such an item belongs in a ground-floor file of the folder that
//! both import (`store/embedded/options.rs`, `store/embedded/blocks/layout.rs`).
//!
//! The debts left are listed in [`KNOWN`], a ratchet: a new one fails the
//! test, and so does a listed one that is gone (take it off the list).

use std::collections::BTreeSet;

use super::{Module, modules, paths_after};

/// `(file, item)`: files that still import an item their folder's `mod.rs`
/// defines. Most are the `store` contract (the trait and the record types
/// in `store/mod.rs`, which the backends implement) and the types whose
/// `impl` is split by operation (CODE_STYLE.md: `Engine`, `PendingIndex`,
/// `Authenticator`), and the store's own files that read the embedded
/// store's internals (`backup`, `export`); issue 53 moves the rest to
/// ground floors.
const KNOWN: &[(&str, &str)] = &[
    ("src/api/audit.rs", "IdempotencyService"),
    ("src/api/audit.rs", "duration"),
    ("src/api/audit.rs", "timestamp"),
    ("src/audit/cql.rs", "AuditCursor"),
    ("src/audit/cql.rs", "AuditEvent"),
    ("src/audit/cql.rs", "AuditLog"),
    ("src/audit/cql.rs", "AuditQuery"),
    ("src/audit/cql.rs", "retention_ms"),
    ("src/audit/embedded.rs", "AuditCursor"),
    ("src/audit/embedded.rs", "AuditEvent"),
    ("src/audit/embedded.rs", "AuditLog"),
    ("src/audit/embedded.rs", "AuditQuery"),
    ("src/audit/embedded.rs", "retention_ms"),
    ("src/auth/protected.rs", "Authenticator"),
    ("src/engine/claim.rs", "Engine"),
    ("src/engine/claim.rs", "MAX_CAS_ROUNDS"),
    ("src/engine/claim.rs", "lease_of"),
    ("src/engine/claim.rs", "ms"),
    ("src/engine/claim.rs", "new_lease_token"),
    ("src/engine/finish.rs", "Engine"),
    ("src/engine/finish.rs", "MAX_CAS_ROUNDS"),
    ("src/engine/finish.rs", "contention"),
    ("src/engine/finish.rs", "ms"),
    ("src/engine/finish.rs", "no_live_claim"),
    ("src/engine/finish.rs", "not_in_progress"),
    ("src/engine/reconcile.rs", "DEFAULT_PAGE_SIZE"),
    ("src/engine/reconcile.rs", "Engine"),
    ("src/engine/reconcile.rs", "MAX_CAS_ROUNDS"),
    ("src/engine/reconcile.rs", "MAX_PAGE_SIZE"),
    ("src/engine/reconcile.rs", "contention"),
    ("src/engine/reconcile.rs", "lease_of"),
    ("src/engine/reconcile.rs", "ms"),
    ("src/engine/reconcile.rs", "new_lease_token"),
    ("src/engine/transitions.rs", "Engine"),
    ("src/engine/transitions.rs", "key_hash"),
    ("src/server/admin.rs", "SERVICE_NAME"),
    ("src/store/cql/pending/cleanup.rs", "PendingIndex"),
    ("src/store/cql/pending/entry.rs", "BUCKET_MS"),
    ("src/store/cql/pending/entry.rs", "SHARDS"),
    ("src/store/cql/pending/scan.rs", "BUCKET_MS"),
    ("src/store/cql/pending/scan.rs", "PendingIndex"),
    ("src/store/cql/pending/scan.rs", "SHARDS"),
    ("src/store/cql/pending/seal.rs", "BUCKET_MS"),
    ("src/store/cql/pending/seal.rs", "PendingIndex"),
    ("src/store/cql/pending/seal.rs", "SHARDS"),
    ("src/store/cql/pending/seal.rs", "ScannedSummaries"),
    ("src/store/embedded/backup.rs", "EmbeddedStore"),
    ("src/store/embedded/export.rs", "EmbeddedStore"),
    ("src/store/instrumented.rs", "BackupSummary"),
    ("src/store/instrumented.rs", "CasOutcome"),
    ("src/store/instrumented.rs", "Expected"),
    ("src/store/instrumented.rs", "InsertOutcome"),
    ("src/store/instrumented.rs", "PendingCounts"),
    ("src/store/instrumented.rs", "PendingPage"),
    ("src/store/instrumented.rs", "PendingQuery"),
    ("src/store/instrumented.rs", "Record"),
    ("src/store/instrumented.rs", "RecordKey"),
    ("src/store/instrumented.rs", "Store"),
    ("src/store/instrumented.rs", "StoreResult"),
    ("src/store/memory.rs", "CasOutcome"),
    ("src/store/memory.rs", "Expected"),
    ("src/store/memory.rs", "InsertOutcome"),
    ("src/store/memory.rs", "PendingPage"),
    ("src/store/memory.rs", "PendingQuery"),
    ("src/store/memory.rs", "Record"),
    ("src/store/memory.rs", "RecordKey"),
    ("src/store/memory.rs", "Store"),
    ("src/store/memory.rs", "StoreError"),
    ("src/store/memory.rs", "StoreResult"),
    ("src/store/transfer.rs", "CasOutcome"),
    ("src/store/transfer.rs", "Expected"),
    ("src/store/transfer.rs", "InsertOutcome"),
    ("src/store/transfer.rs", "Record"),
    ("src/store/transfer.rs", "RecordState"),
    ("src/store/transfer.rs", "Store"),
    ("src/store/transfer.rs", "StoreError"),
    ("src/store/transfer.rs", "StoreResult"),
    ("src/web/api.rs", "Connection"),
    ("src/web/api.rs", "Services"),
    ("src/web/api.rs", "grpc_request"),
    ("src/web/api.rs", "read_body"),
    ("src/web/serve.rs", "Connection"),
    ("src/web/serve.rs", "ConnectionCerts"),
];

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

/// Every `(file, item)` in `src/` where a file imports an item its
/// folder's `mod.rs` defines, by `super::` or by a `crate::` path.
fn parent_imports() -> BTreeSet<(String, String)> {
    let modules = modules();
    let root = super::root();
    let mut found = BTreeSet::new();
    for (module, (path, code)) in &modules {
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
