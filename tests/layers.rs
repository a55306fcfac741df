//! The module graph of src/ has no cycles: lower layers never import from
//! higher ones (ARCHITECTURE.md, "Layers").
//!
//! Each file under src/ is a module (`src/services/proxy.rs` is
//! `services::proxy`, `src/services/mod.rs` is `services`; the crate
//! roots, `src/lib.rs` and `src/main.rs`, are not modules). An edge goes
//! from a module to every module it names through a `crate::`, `super::`
//! or `self::` path, in a `use` or anywhere in its code (test modules and
//! comments left out); a path is the longest module it starts with. A
//! `mod x;` declaration is not an edge. The test fails on any cycle and
//! prints it, so a new one is caught by CI.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Module path of a file below src/ (`None` for the crate root).
fn module_of(rel: &str) -> Option<String> {
    let rel = rel.strip_suffix(".rs")?;
    let rel = rel.strip_suffix("/mod").unwrap_or(rel);
    if rel == "main" || rel == "lib" {
        return None;
    }
    Some(rel.replace('/', "::"))
}

fn files(dir: &Path, base: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files(&p, base, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
            out.push((rel, fs::read_to_string(&p).unwrap()));
        }
    }
}

/// The code of a file without comments, string literals and its
/// `#[cfg(test)]` items.
fn code_of(src: &str) -> String {
    let mut out = String::new();
    let mut skip_depth: Option<usize> = None;
    let mut depth = 0usize;
    let mut pending_test = false;
    for line in src.lines() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        if t.starts_with("#[cfg(test)]") {
            pending_test = true;
            continue;
        }
        // Strip a trailing comment and string contents, roughly: paths in
        // strings are not imports.
        let mut clean = String::new();
        let mut in_str = false;
        let mut prev = ' ';
        let mut chars = line.chars().peekable();
        while let Some(ch) = chars.next() {
            if in_str {
                if ch == '"' && prev != '\\' {
                    in_str = false;
                }
                prev = if prev == '\\' && ch == '\\' { ' ' } else { ch };
                continue;
            }
            if ch == '"' {
                in_str = true;
                prev = ' ';
                continue;
            }
            if ch == '/' && chars.peek() == Some(&'/') {
                break;
            }
            clean.push(ch);
        }
        let opens = clean.matches('{').count();
        let closes = clean.matches('}').count();
        if pending_test && skip_depth.is_none() {
            skip_depth = Some(depth);
            pending_test = false;
            if opens == 0 && clean.trim_end().ends_with(';') {
                // `#[cfg(test)] use ...;` or `mod x;`: one line.
                skip_depth = None;
                continue;
            }
        }
        depth = (depth + opens).saturating_sub(closes);
        if let Some(d) = skip_depth {
            if depth <= d && (opens > 0 || closes > 0) {
                skip_depth = None;
            }
            continue;
        }
        out.push_str(&clean);
        out.push('\n');
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path of a use tree starting at `s` (just after `crate::`).
fn use_tree(s: &[char], mut i: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut path: Vec<String> = prefix.to_vec();
    loop {
        while i < s.len() && s[i].is_whitespace() {
            i += 1;
        }
        if i < s.len() && s[i] == '{' {
            i += 1;
            loop {
                i = use_tree(s, i, &path, out);
                while i < s.len() && (s[i].is_whitespace() || s[i] == ',') {
                    i += 1;
                }
                if i >= s.len() || s[i] == '}' {
                    return i + 1;
                }
            }
        }
        let start = i;
        while i < s.len() && is_ident(s[i]) {
            i += 1;
        }
        if start == i {
            out.push(path);
            return i;
        }
        let word: String = s[start..i].iter().collect();
        if word != "self" {
            path.push(word);
        }
        if i + 1 < s.len() && s[i] == ':' && s[i + 1] == ':' {
            i += 2;
            continue;
        }
        out.push(path);
        return i;
    }
}

fn paths_in(code: &str, module: &str) -> Vec<Vec<String>> {
    let s: Vec<char> = code.chars().collect();
    let own: Vec<String> = module.split("::").map(str::to_string).collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let at_word = i == 0 || !is_ident(s[i - 1]) && s[i - 1] != ':';
        if !at_word {
            i += 1;
            continue;
        }
        let rest: String = s[i..(i + 7).min(s.len())].iter().collect();
        if rest.starts_with("crate::") {
            i = use_tree(&s, i + 7, &[], &mut out);
        } else if rest.starts_with("super::") {
            let mut base = own.clone();
            let mut j = i;
            loop {
                let r: String = s[j..(j + 7).min(s.len())].iter().collect();
                if !r.starts_with("super::") {
                    break;
                }
                base.pop();
                j += 7;
            }
            i = use_tree(&s, j, &base, &mut out);
        } else if rest.starts_with("self::") {
            i = use_tree(&s, i + 6, &own, &mut out);
        } else {
            i += 1;
        }
    }
    out
}

/// The children of `module` that its code names by a relative path
/// (`child::item`), not through `crate::`, `self::` or `super::`.
fn children_named(code: &str, module: &str, modules: &BTreeSet<String>) -> Vec<String> {
    let s: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let at_word = i == 0 || (!is_ident(s[i - 1]) && s[i - 1] != ':');
        if !at_word || !is_ident(s[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < s.len() && is_ident(s[i]) {
            i += 1;
        }
        if i + 1 < s.len() && s[i] == ':' && s[i + 1] == ':' {
            let word: String = s[start..i].iter().collect();
            let child = format!("{module}::{word}");
            if modules.contains(&child) {
                out.push(child);
            }
        }
    }
    out
}

/// The longest module `path` starts with.
fn resolve(path: &[String], modules: &BTreeSet<String>) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|m| modules.contains(m))
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &src, &mut all);
    let modules: BTreeSet<String> = all.iter().filter_map(|(f, _)| module_of(f)).collect();
    let mut g = BTreeMap::new();
    for (file, text) in &all {
        let Some(m) = module_of(file) else { continue };
        let mut to = BTreeSet::new();
        let code = code_of(text);
        // `head::read_head` or `use head::{..}` in `services::proxy`: a
        // path relative to the module, through one of its children.
        for child in children_named(&code, &m, &modules) {
            to.insert(child);
        }
        for p in paths_in(&code, &m) {
            if let Some(t) = resolve(&p, &modules) {
                if t != m {
                    to.insert(t);
                }
            }
        }
        g.insert(m, to);
    }
    g
}

/// Strongly connected components with more than one module (Tarjan).
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct St<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(st: &mut St<'a>, v: &'a str) {
        st.index.insert(v, st.next);
        st.low.insert(v, st.next);
        st.next += 1;
        st.stack.push(v);
        st.on.insert(v);
        let g = st.g;
        for w in g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !st.index.contains_key(w) {
                visit(st, w);
                let lw = st.low[w];
                let lv = st.low[v];
                st.low.insert(v, lv.min(lw));
            } else if st.on.contains(w) {
                let iw = st.index[w];
                let lv = st.low[v];
                st.low.insert(v, lv.min(iw));
            }
        }
        if st.low[v] == st.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = st.stack.pop().unwrap();
                st.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                st.out.push(comp);
            }
        }
    }
    let mut st = St {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !st.index.contains_key(v.as_str()) {
            visit(&mut st, v);
        }
    }
    st.out
}

/// One cycle through `comp`, as `a -> b -> ... -> a`.
fn one_cycle(g: &BTreeMap<String, BTreeSet<String>>, comp: &[String]) -> String {
    let inside: BTreeSet<&String> = comp.iter().collect();
    let start = &comp[0];
    // Breadth-first back to the start.
    let mut prev: BTreeMap<&String, &String> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in &g[v] {
            if !inside.contains(w) {
                continue;
            }
            if w == start {
                let mut path = vec![start.clone()];
                let mut at = v;
                while at != start {
                    path.push(at.clone());
                    at = prev[at];
                }
                path.push(start.clone());
                path.reverse();
                return path.join(" -> ");
            }
            if !prev.contains_key(w) {
                prev.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    String::new()
}

#[test]
fn the_module_graph_has_no_cycles() {
    let g = graph();
    assert!(g.len() > 20, "found only {} modules", g.len());
    let found = cycles(&g);
    let mut report = String::new();
    for comp in &found {
        report.push_str(&format!(
            "{} modules: {}\n  e.g. {}\n",
            comp.len(),
            comp.join(", "),
            one_cycle(&g, comp)
        ));
    }
    if std::env::var_os("LAYERS_DUMP").is_some() {
        for (m, to) in &g {
            eprintln!(
                "{m} -> {}",
                to.iter().cloned().collect::<Vec<_>>().join(" ")
            );
        }
    }
    assert!(found.is_empty(), "import cycles in src/:\n{report}");
}

#[test]
fn the_checker_sees_paths_of_every_form() {
    let code = "use crate::{access::{self, Grant}, client::Client};\n\
                use super::tcppm;\nfn f() { crate::net::dial(); self::x::y(); }\n";
    let mut got: Vec<String> = paths_in(code, "services::proxy")
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            "access",
            "access::Grant",
            "client::Client",
            "net::dial",
            "services::proxy::x::y",
            "services::tcppm",
        ]
    );
    let code = code_of("use crate::a;\n#[cfg(test)]\nmod tests {\n    use crate::b;\n}\nuse crate::c; // crate::d\n");
    assert!(
        code.contains("crate::a") && code.contains("crate::c"),
        "{code}"
    );
    assert!(
        !code.contains("crate::b") && !code.contains("crate::d"),
        "{code}"
    );
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    g.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(cycles(&g), [vec!["a".to_string(), "b".to_string()]]);
}
