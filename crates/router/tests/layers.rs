//! The router's modules import one way only: each layer uses the layers below it and never one
//! above, and no two modules import each other, directly or round a circle.
//!
//! The test reads the crate's source, collects every `crate::…` path (`use crate::{a, b::c}`
//! groups included) outside comments, and checks them against [`LAYERS`]. Modules refer to
//! each other by `crate::` paths; `super::` is for a module's own children and tests
//! (`use super::*`), which the test checks too.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The top-level modules, lowest layer first: a module may use the ones before it.
const LAYERS: &[&str] = &[
    // Kafka Connect's converters, Jackson's JSON, Java's numbers, PostgreSQL value text.
    "format",
    // Debezium's EventRouter: options, bindings, topics, the record, errors, caches.
    "routing",
    // Formats beyond Debezium's, applied to the Debezium record: protobuf, CloudEvents, trace.
    "extension",
    // The EventRouter, which puts routing and the extensions together.
    "router",
];

/// A module of the graph: the layer and its module in it (empty for a layer that is one file,
/// `mod` for the layer's `mod.rs`).
type Module = (String, String);

fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .expect("read the source directory")
        .map(|e| e.expect("read a directory entry").path())
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

/// The module a source file belongs to; `None` for the crate root.
fn module_of(relative: &Path) -> Option<Module> {
    let parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    match parts.as_slice() {
        [root] if root == "lib" => None,
        [layer] => Some((layer.clone(), String::new())),
        [layer, module, ..] => Some((layer.clone(), module.clone())),
        [] => None,
    }
}

/// The module a `crate::` path names.
fn module_named(path: &[String]) -> Option<Module> {
    let layer = path.first()?;
    let dir = source_dir().join(layer);
    if !dir.is_dir() {
        return Some((layer.clone(), String::new()));
    }
    let module = match path.get(1) {
        Some(m) if dir.join(format!("{m}.rs")).is_file() || dir.join(m).is_dir() => m.clone(),
        _ => "mod".to_owned(),
    };
    Some((layer.clone(), module))
}

/// The code of a file without its comments (line comments, doc comments included, and block
/// comments), so that a doc link is not an import.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if !line.trim_start().starts_with("//") {
            out.push_str(line);
        }
        out.push('\n');
    }
    while let Some(start) = out.find("/*") {
        let end = out[start..].find("*/").map_or(out.len(), |e| start + e + 2);
        out.replace_range(start..end, " ");
    }
    out
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn skip_space(s: &[u8], i: &mut usize) {
    while *i < s.len() && s[*i].is_ascii_whitespace() {
        *i += 1;
    }
}

/// The paths of the use tree (or expression path) at `i`: `a::b`, `{a, b::{c, d}}`, `a::*`.
fn use_tree(s: &[u8], i: &mut usize) -> Vec<Vec<String>> {
    skip_space(s, i);
    if *i < s.len() && s[*i] == b'{' {
        *i += 1;
        let mut paths = Vec::new();
        loop {
            skip_space(s, i);
            if *i >= s.len() {
                return paths;
            }
            if s[*i] == b'}' {
                *i += 1;
                return paths;
            }
            paths.extend(use_tree(s, i));
            // Past an `as alias` to the next item.
            while *i < s.len() && s[*i] != b',' && s[*i] != b'}' {
                *i += 1;
            }
            if *i < s.len() && s[*i] == b',' {
                *i += 1;
            }
        }
    }
    let start = *i;
    while *i < s.len() && is_ident(s[*i]) {
        *i += 1;
    }
    if start == *i {
        // `*` or anything else: the path ends before it.
        return vec![Vec::new()];
    }
    let ident = String::from_utf8_lossy(&s[start..*i]).into_owned();
    if s[*i..].starts_with(b"::") {
        *i += 2;
        let rest = use_tree(s, i);
        return rest
            .into_iter()
            .map(|mut p| {
                p.insert(0, ident.clone());
                p
            })
            .collect();
    }
    vec![vec![ident]]
}

/// Every path after `crate::` in the code.
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let s = code.as_bytes();
    let mut paths = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("crate::") {
        let start = from + at;
        from = start + "crate::".len();
        if start > 0 && is_ident(s[start - 1]) {
            continue;
        }
        let mut i = from;
        paths.extend(use_tree(s, &mut i).into_iter().filter(|p| !p.is_empty()));
    }
    paths
}

/// The module imports of the crate: each module and the modules it uses.
fn imports() -> BTreeMap<Module, BTreeSet<Module>> {
    let src = source_dir();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&src).expect("a file under src");
        let Some(from) = module_of(relative) else {
            continue;
        };
        let code = code_of(&fs::read_to_string(&file).expect("read a source file"));
        // `super::` reaches a sibling only from a module's own file: there it is its parent.
        if relative.components().count() == 2 && !relative.ends_with("mod.rs") {
            for (at, _) in code.match_indices("super::") {
                let rest = code[at + "super::".len()..].trim_start();
                assert!(
                    rest.starts_with('*'),
                    "{} uses `super::{}`; name other modules by their crate:: path",
                    relative.display(),
                    rest.lines().next().unwrap_or_default()
                );
            }
        }
        let uses = graph.entry(from.clone()).or_default();
        for path in crate_paths(&code) {
            if let Some(to) = module_named(&path) {
                if to != from {
                    uses.insert(to);
                }
            }
        }
    }
    graph
}

fn name(module: &Module) -> String {
    match module.1.as_str() {
        "" => module.0.clone(),
        m => format!("{}::{m}", module.0),
    }
}

/// A circle of imports, if there is one.
fn find_cycle(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    fn visit(
        node: &Module,
        graph: &BTreeMap<Module, BTreeSet<Module>>,
        done: &mut BTreeSet<Module>,
        stack: &mut Vec<Module>,
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
            if let Some(cycle) = visit(next, graph, done, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

#[test]
fn layers_import_only_the_layers_below() {
    let graph = imports();
    let rank = |layer: &str| LAYERS.iter().position(|l| *l == layer);
    let mut wrong = Vec::new();
    for (from, uses) in &graph {
        let from_rank =
            rank(&from.0).unwrap_or_else(|| panic!("module {} is in no layer of LAYERS", from.0));
        for to in uses {
            let to_rank =
                rank(&to.0).unwrap_or_else(|| panic!("module {} is in no layer of LAYERS", to.0));
            if to_rank > from_rank {
                wrong.push(format!("{} uses {}", name(from), name(to)));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "modules use a layer above their own ({:?}, lowest first): {wrong:#?}",
        LAYERS
    );
}

#[test]
fn no_module_imports_round_a_circle() {
    let graph = imports();
    assert!(graph.len() > LAYERS.len(), "the source was read: {graph:?}");
    if let Some(cycle) = find_cycle(&graph) {
        let path: Vec<String> = cycle.iter().map(name).collect();
        panic!("modules import round a circle: {}", path.join(" -> "));
    }
}

#[test]
fn paths_are_read_from_use_trees_and_expressions() {
    let code = code_of(
        "use crate::a::{b, c::{d, e as f}, self};\n\
         /// [`crate::z::doc`]\n\
         fn g() { crate::h::i(); let _ = my_crate::j::k; }\n\
         use crate::{l, m::n};\n",
    );
    let paths: Vec<String> = crate_paths(&code).iter().map(|p| p.join("::")).collect();
    assert_eq!(
        paths,
        ["a::b", "a::c::d", "a::c::e", "a::self", "h::i", "l", "m::n"]
    );
}
