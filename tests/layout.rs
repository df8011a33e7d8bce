//! The source tree's shape (docs/architecture.md, "Layering"): no import
//! circle among the top-level modules of `src/`, and no source file so long
//! that it holds more than one room. Reads the sources; needs no broker.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Longest a file of `src/` may be, not counting its `#[cfg(test)] mod tests`.
const MAX_LINES: usize = 900;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The file's text before its inline test module, if it has one.
fn outside_tests(text: &str) -> &str {
    text.split("#[cfg(test)]\nmod tests {").next().unwrap_or(text)
}

/// The file's code without comments and without its inline test module.
fn code_of(text: &str) -> String {
    outside_tests(text).lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The top-level modules a file's code names through `crate::`.
fn crate_refs(code: &str) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `use crate::{a::X, b}`: every path's first segment.
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            for path in inner.split(',') {
                let first: String = path.trim().chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
                if !first.is_empty() {
                    refs.insert(first);
                }
            }
        } else {
            let first: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            if !first.is_empty() {
                refs.insert(first);
            }
        }
    }
    refs
}

fn top_module(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next().expect("a component").as_os_str().to_string_lossy().to_string();
    first.trim_end_matches(".rs").to_string()
}

/// Module dependency graph of `src/`: top-level module -> modules it uses.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let top = top_module(&src, &file);
        if top == "lib" {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&file).expect("read source"));
        let deps = graph.entry(top.clone()).or_default();
        deps.extend(crate_refs(&code).into_iter().filter(|m| *m != top));
    }
    graph
}

/// A path from `from` back to `from`, if the graph has one.
fn circle_through(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    let mut stack = vec![vec![from.to_string()]];
    let mut seen = BTreeSet::new();
    while let Some(path) = stack.pop() {
        let last = path.last().expect("non-empty");
        for next in graph.get(last).into_iter().flatten() {
            if next == from {
                let mut circle = path.clone();
                circle.push(from.to_string());
                return Some(circle);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push(longer);
            }
        }
    }
    None
}

#[test]
fn no_import_circle_among_top_level_modules() {
    let graph = graph();
    assert!(graph.contains_key("task") && graph["task"].contains("store"), "the parser sees no dependencies: {graph:?}");
    let circles: Vec<String> = graph.keys().filter_map(|m| circle_through(&graph, m)).map(|c| c.join(" -> ")).collect();
    assert!(circles.is_empty(), "import circles among src/'s modules:\n{}", circles.join("\n"));
}

#[test]
fn no_source_file_holds_more_than_one_room() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let text = std::fs::read_to_string(f).expect("read source");
            let lines = outside_tests(&text).lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", f.strip_prefix(&src).unwrap_or(f).display()))
        })
        .collect();
    assert!(long.is_empty(), "files of src/ over {MAX_LINES} lines outside their tests: {long:?}");
}

#[test]
fn the_parser_finds_circles() {
    let mut graph = BTreeMap::new();
    graph.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    graph.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    graph.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(circle_through(&graph, "a").map(|c| c.join(" -> ")), Some("a -> b -> c -> a".to_string()));
    let code = code_of("use crate::{store::X, kafka};\n// crate::admin in a comment\nfn f() { crate::group::g() }");
    assert_eq!(crate_refs(&code), BTreeSet::from(["group".to_string(), "kafka".to_string(), "store".to_string()]));
}
