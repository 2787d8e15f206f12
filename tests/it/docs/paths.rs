//! The file paths the README, CODE_STYLE.md, every document under docs/
//! and the SDKs' READMEs name, so that a test fails when a rename leaves a
//! doc pointing at nothing.
//!
//! Three shapes are read: Markdown links (`[text](path)`, relative to the
//! document), backticked paths (`` `src/api/status.rs` ``; relative to the
//! repository, or to `src/` for module paths such as `store/response.rs`),
//! and the README's `## Layout` block, whose first column lists paths.
//! An SDK's README (`clients/<sdk>/README.md`) names paths of its own
//! folder first (`src/idemd/client.py`), then of the repository.
//! A backticked span counts as a path only when it has a `/`, no spaces,
//! and its first segment is a top-level entry of the repository or of
//! `src/`: `application/json` or `/v1/claim` are not paths. `:123` line
//! suffixes are dropped; a `*` checks the folder before it; a path git
//! ignores is a build output and passes.

use std::path::Path;

use super::root;

/// Documents whose paths must exist: the README, CODE_STYLE.md, every
/// Markdown file under docs/ (read from the folder, so a new document is
/// checked without a list to update) and each SDK's README.
pub fn documents() -> Vec<String> {
    let mut out = vec!["README.md".to_string(), "CODE_STYLE.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("docs entry").file_name())
        .filter_map(|name| name.to_str().map(str::to_string))
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    out.extend(docs);
    for sdk in ["conformance", "go", "java", "python", "typescript"] {
        out.push(format!("clients/{sdk}/README.md"));
    }
    out
}

/// Every path `document` (its text `text`, at `doc_path` under the
/// repository) names, as written, with the directory it is relative to.
pub fn named_paths(doc_path: &str, text: &str) -> Vec<(String, std::path::PathBuf)> {
    let repo = root();
    let doc_dir = repo.join(doc_path).parent().expect("doc dir").to_path_buf();
    let mut out = Vec::new();
    // Markdown links.
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let end = rest.find(')').unwrap_or(rest.len());
        let target = rest[..end].split('#').next().unwrap_or("").trim();
        let external = target.contains("://") || target.starts_with("mailto:");
        if !target.is_empty() && !external {
            out.push((target.to_string(), doc_dir.clone()));
        }
    }
    // Backticked paths, outside fenced blocks.
    let mut fenced = false;
    let mut prose = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    // An SDK's README names paths in its own folder first.
    let mut bases = Vec::new();
    if doc_path.starts_with("clients/") {
        bases.push(doc_dir.clone());
    }
    bases.extend([repo.clone(), repo.join("src")]);
    for span in prose.split('`').skip(1).step_by(2) {
        if let Some((path, base)) = as_path(span, &bases) {
            out.push((path, base));
        }
    }
    // The README's Layout block: the first column, up to two spaces.
    if let Some(layout) = text.split("## Layout").nth(1) {
        let block = layout.split("```").nth(1).unwrap_or("");
        for line in block.lines().skip(1) {
            let column = line.split("  ").next().unwrap_or("");
            for token in column.split_whitespace() {
                out.push((token.to_string(), repo.clone()));
            }
        }
    }
    out
}

/// `span` as a path and the first of `bases` it is relative to, if it
/// looks like one (see the module docs).
fn as_path(span: &str, bases: &[std::path::PathBuf]) -> Option<(String, std::path::PathBuf)> {
    if span.is_empty() || span.chars().any(char::is_whitespace) || !span.contains('/') {
        return None;
    }
    if ["::", "://", "{", "<", "=", "$", "("]
        .iter()
        .any(|s| span.contains(s))
    {
        return None;
    }
    let path = match span.split_once(':') {
        Some((path, suffix)) if suffix.starts_with(|c: char| c.is_ascii_digit()) => path,
        Some(_) => return None,
        None => span,
    };
    let first = path.split('/').next().unwrap_or("");
    if first.is_empty() || first == "." || first == ".." {
        return None;
    }
    // The first folder that holds the whole path, else the first that
    // holds its first segment (where a stale path is reported).
    bases
        .iter()
        .find(|base| exists(base, path))
        .or_else(|| bases.iter().find(|base| base.join(first).exists()))
        .map(|base| (path.to_string(), base.clone()))
}

/// Whether `path` (relative to `base`) exists; a `*` checks its folder. A
/// path git ignores counts as existing: it is a build output the document
/// names (`clients/python/dist/`, generated stubs), made by the build, not
/// committed.
pub fn exists(base: &Path, path: &str) -> bool {
    let path = match path.find('*') {
        Some(at) => &path[..path[..at].rfind('/').map_or(0, |slash| slash + 1)],
        None => path,
    };
    let full = base.join(path);
    full.exists()
        || std::process::Command::new("git")
            .arg("check-ignore")
            .arg("-q")
            .arg(&full)
            .current_dir(root())
            .status()
            .is_ok_and(|status| status.success())
}
