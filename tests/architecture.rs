//! The map in docs/architecture.md, kept true: no import circle among the
//! crate's top modules, the contract (`src/backend.rs`) importing nothing
//! above it, the bottom of the crate a straight line, and every source
//! file named on the map. Read from the `crate::` paths of every file
//! under `src/` (comments aside), so it fails the moment a `use` goes the
//! wrong way.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top module a file of `src/` belongs to (`fs` for `src/fs/lock.rs`),
/// `None` for the crate root and the binaries.
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_owned();
    let top = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
    (top != "lib" && top != "bin").then_some(top)
}

/// Every top module `file` names as `crate::<module>`, outside comments.
fn imports(file: &Path, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut found = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if modules.contains(&name) {
                found.insert(name);
            }
        }
    }
    found
}

/// The module graph: each top module and the top modules it imports.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| top_module(&src, f)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let Some(top) = top_module(&src, file) else {
            continue;
        };
        let mut uses = imports(file, &modules);
        uses.remove(&top);
        graph.entry(top).or_default().extend(uses);
    }
    graph
}

/// The strongly connected components of more than one module (Tarjan).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        if let Some(next) = s.graph.get(v) {
            for w in next {
                let w = w.as_str();
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let low = s.low[v].min(s.low[w]);
                    s.low.insert(v, low);
                } else if s.on_stack.contains(w) {
                    let low = s.low[v].min(s.index[w]);
                    s.low.insert(v, low);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !state.index.contains_key(v.as_str()) {
            visit(&mut state, v);
        }
    }
    state.found
}

#[test]
fn no_import_circle_among_the_top_modules() {
    let graph = graph();
    assert!(graph.len() > 20, "the crate's modules were found: {graph:?}");
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "modules that import each other in a circle: {found:?}"
    );
}

#[test]
fn the_bottom_is_a_straight_line_and_the_contract_imports_nothing_above_it() {
    let graph = graph();
    // Each may import only what comes before it (and `sys`, the platform).
    let line = [
        "timestamp",
        "field",
        "name",
        "mode",
        "record",
        "stale",
        "owner",
        "error",
        "backend",
    ];
    for (i, module) in line.iter().enumerate() {
        let allowed: BTreeSet<&str> = line[..i].iter().copied().chain(["sys", "failpoint"]).collect();
        let upward: Vec<&String> = graph
            .get(*module)
            .into_iter()
            .flatten()
            .filter(|m| !allowed.contains(m.as_str()))
            .collect();
        assert!(upward.is_empty(), "{module} imports {upward:?}, above it");
    }
}

/// The graph of the submodules of `src/fs/`.
fn fs_graph() -> BTreeMap<String, BTreeSet<String>> {
    sibling_graph("src/fs", "crate::fs::")
}

/// The graph of the submodules in `dir`: each file (a directory's files
/// count as its module) and the siblings it names through `super::`
/// (`super::super::` from a nested file) or `crate_path`.
fn sibling_graph(dir: &str, crate_path: &str) -> BTreeMap<String, BTreeSet<String>> {
    let fs = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files = Vec::new();
    sources(&fs, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .filter(|f| f.parent() == Some(fs.as_path()))
        .map(|f| f.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let rel = file.strip_prefix(&fs).unwrap();
        let nested = rel.components().count() > 1;
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .into_owned();
        let me = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
        let text = std::fs::read_to_string(file).unwrap();
        let code: String = text
            .lines()
            .map(|line| line.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join(" ");
        let prefixes = if nested {
            ["super::super::", crate_path]
        } else {
            ["super::", crate_path]
        };
        let mut uses = BTreeSet::new();
        for prefix in prefixes {
            for (at, _) in code.match_indices(prefix) {
                // `super::super::x` is not `super::x` from a top file.
                if !nested && prefix == "super::" && code[..at].ends_with("super::") {
                    continue;
                }
                let rest = &code[at + prefix.len()..];
                let names: Vec<&str> = match rest.strip_prefix('{') {
                    Some(list) => list.split('}').next().unwrap_or("").split(',').collect(),
                    None => vec![rest],
                };
                for name in names {
                    let name: String = name
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if modules.contains(&name) && name != me {
                        uses.insert(name);
                    }
                }
            }
        }
        graph.entry(me).or_default().extend(uses);
    }
    graph
}

#[test]
fn no_import_circle_among_the_filesystem_backends_files() {
    let graph = fs_graph();
    assert!(graph.len() > 10, "the files of src/fs were found: {graph:?}");
    assert!(
        graph.get("found").is_some_and(|uses| uses.contains("members")),
        "the scan sees `use super::{{..}}` lists: {graph:?}"
    );
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "files of src/fs that import each other in a circle: {found:?}"
    );
}

#[test]
fn no_import_circle_among_the_command_line_tools_files() {
    let graph = sibling_graph("src/bin/leasehold", "crate::");
    assert!(
        graph.len() > 8,
        "the files of src/bin/leasehold were found: {graph:?}"
    );
    assert!(
        graph.get("run").is_some_and(|uses| uses.contains("process")),
        "the scan sees `use super::..`: {graph:?}"
    );
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "files of src/bin/leasehold that import each other in a circle: {found:?}"
    );
}

/// The lines of `text` that are code: comments and test modules aside.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .take_while(|(_, line)| !line.starts_with("#[cfg(test)]"))
        .map(|(i, line)| (i + 1, line.split("//").next().unwrap_or("")))
}

/// What only the platform seam may name.
const PLATFORM: [&str; 4] = ["nix::", "libc::", "std::os::", "target_os"];

/// Where each of `PLATFORM` appears in code outside `src/sys.rs`,
/// `src/sys/`, the command-line tool (whose process handling is its own)
/// and test files.
fn platform_leaks(src: &Path) -> Vec<String> {
    let exempt = |rel: &str| {
        rel == "sys.rs"
            || rel.starts_with("sys/")
            || rel.starts_with("bin/")
            || rel.ends_with("tests.rs")
            || rel.contains("/tests/")
    };
    lines_naming(src, &PLATFORM, exempt)
}

/// Each line of code (`path:line: code`) in the files under `src` that
/// names one of `words`, files `exempt` (by their path under `src`) aside.
fn lines_naming(src: &Path, words: &[&str], exempt: impl Fn(&str) -> bool) -> Vec<String> {
    let mut files = Vec::new();
    sources(src, &mut files);
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if exempt(&rel) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for (number, code) in code_lines(&text) {
            if words.iter().any(|word| code.contains(word)) {
                found.push(format!("{rel}:{number}: {}", code.trim()));
            }
        }
    }
    found
}

#[test]
fn every_platform_difference_is_behind_sys() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let leaks = platform_leaks(&src);
    assert!(
        leaks.is_empty(),
        "platform-specific code outside src/sys (put it behind the seam):\n{}",
        leaks.join("\n")
    );
}

#[test]
fn the_platform_check_sees_a_leak() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("fs")).unwrap();
    std::fs::write(
        dir.path().join("fs/lock.rs"),
        "use std::io;\n// nix:: in a comment is fine\nfn f() { let _ = nix::unistd::getpid(); }\n#[cfg(test)]\nmod tests { use nix::libc; }\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("sys.rs"), "use nix::libc;\n").unwrap();
    assert_eq!(
        platform_leaks(dir.path()),
        ["fs/lock.rs:3: fn f() { let _ = nix::unistd::getpid(); }"]
    );
}

#[test]
fn the_tests_catch_a_circle() {
    let mut graph = graph();
    graph.entry("error".into()).or_default().insert("backend".into());
    assert!(!circles(&graph).is_empty());
}

#[test]
fn every_source_file_is_on_the_map() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let map = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let src = root.join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let missing: Vec<String> = files
        .iter()
        // `/`-separated on every platform (Windows lists `fs\lock.rs`).
        .map(|f| f.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/"))
        .filter(|rel| !rel.starts_with("bin/") && !rel.contains("/tests/") && rel != "lib.rs")
        .filter(|rel| {
            let name = rel.rsplit('/').next().unwrap();
            !map.contains(name)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "source files docs/architecture.md does not name: {missing:?}"
    );
}

/// Where the crate may hold `unsafe` code: `sysctl(3)` for the BSD
/// kernels (which `nix` does not wrap), the Win32 API (which only
/// `windows-sys`'s raw bindings reach) and the CLI's fork hook.
const UNSAFE_HOMES: [&str; 8] = [
    "sys/bsd/sysctl.rs",
    "sys/bsd/rename.rs",
    "sys/windows.rs",
    "sys/windows/syscall.rs",
    "sys/windows/security.rs",
    "sys/windows/watch.rs",
    "bin/leasehold/process.rs",
    "bin/leasehold/job.rs",
];

/// Each line of code under `src` that holds or allows `unsafe` code,
/// outside [`UNSAFE_HOMES`].
fn unsafe_outside_its_homes(src: &Path) -> Vec<String> {
    const MARKS: [&str; 6] = [
        "unsafe {",
        "unsafe fn",
        "unsafe impl",
        "unsafe extern",
        "allow(unsafe_code)",
        "expect(unsafe_code)",
    ];
    lines_naming(src, &MARKS, |rel| UNSAFE_HOMES.contains(&rel))
}

#[test]
fn unsafe_code_stays_in_its_homes() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = unsafe_outside_its_homes(&src);
    assert!(
        found.is_empty(),
        "unsafe code outside {UNSAFE_HOMES:?}:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_unsafe_check_sees_unsafe_code() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("sys/bsd")).unwrap();
    std::fs::write(
        dir.path().join("sys.rs"),
        "// unsafe { in a comment }\n#![deny(unsafe_code)]\nfn f() { unsafe { g() } }\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("sys/bsd/sysctl.rs"), "#![allow(unsafe_code)]\n").unwrap();
    assert_eq!(
        unsafe_outside_its_homes(dir.path()),
        ["sys.rs:3: fn f() { unsafe { g() } }"]
    );
}
