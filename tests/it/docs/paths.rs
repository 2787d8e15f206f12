//! The file paths the README, CODE_STYLE.md and docs/design.md name, so
//! that a test fails when a rename leaves a doc pointing at nothing.
//!
//! Three shapes are read: Markdown links (`[text](path)`, relative to the
//! document), backticked paths (`` `src/api/status.rs` ``; relative to the
//! repository, or to `src/` for module paths such as `store/response.rs`),
//! and the README's `## Layout` block, whose first column lists paths.
//! A backticked span counts as a path only when it has a `/`, no spaces,
//! and its first segment is a top-level entry of the repository or of
//! `src/`: `application/json` or `/v1/claim` are not paths. `:123` line
//! suffixes are dropped; a `*` checks the folder before it.

use std::path::Path;

use super::root;

/// Documents whose paths must exist.
pub const DOCUMENTS: [&str; 3] = ["README.md", "CODE_STYLE.md", "docs/design.md"];

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
    for span in prose.split('`').skip(1).step_by(2) {
        if let Some((path, base)) = as_path(span) {
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

/// `span` as a repository path and the folder it is relative to, if it
/// looks like one (see the module docs).
fn as_path(span: &str) -> Option<(String, std::path::PathBuf)> {
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
    let repo = root();
    [repo.clone(), repo.join("src")]
        .into_iter()
        .find(|base| base.join(first).exists())
        .map(|base| (path.to_string(), base))
}

/// Whether `path` (relative to `base`) exists; a `*` checks its folder.
pub fn exists(base: &Path, path: &str) -> bool {
    let path = match path.find('*') {
        Some(at) => &path[..path[..at].rfind('/').map_or(0, |slash| slash + 1)],
        None => path,
    };
    base.join(path).exists()
}
