//! The module graph of src/ against the layer table of ARCHITECTURE.md
//! ("Code map, by layer"): a module imports only from its own layer or the
//! layers below it, and the graph has no cycles.
//!
//! Each file under src/ is a module (`src/services/proxy.rs` is
//! `services::proxy`, `src/services/mod.rs` is `services`; the crate
//! roots, `src/lib.rs` and `src/main.rs`, are not modules). An edge goes
//! from a module to every module it names through a `crate::`, `super::`
//! or `self::` path, in a `use` or anywhere in its code (test modules and
//! comments left out); a path is the longest module it starts with. A
//! `mod x;` declaration is not an edge.
//!
//! The table is ARCHITECTURE.md's ```` ```layers ```` block: one layer a
//! line, lowest first, `name: module module ...`, continued on indented
//! lines; `#` starts a comment. The order test fails, printing each
//! problem, on a module of src/ the table does not place, a module it
//! places that src/ does not have or places twice, an import from a
//! module of a higher layer (the file, both modules and their layers)
//! that [`KNOWN_UPWARD`] does not list, and an entry of [`KNOWN_UPWARD`]
//! that is no longer an upward import. The cycle test fails on any cycle
//! and prints it. So a new module, a new upward import or a new cycle is
//! caught by CI.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Imports from a higher layer that are known and on their way out, as
/// (importing module, imported module, why). Each is still printed; an
/// entry whose import is gone (or no longer upward) fails the test, so
/// the list only shrinks.
const KNOWN_UPWARD: &[(&str, &str, &str)] = &[
    // None today. The one there was, `proto::http` -> `acl` (`op_of`
    // returned an `acl::Op`), was moved out of proto (issue 32). An entry
    // reads: ("proto::http", "acl", "being moved (issue 32)"),
];

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

/// The module graph of src/, and each module's file (relative to src/).
fn graph() -> (BTreeMap<String, BTreeSet<String>>, BTreeMap<String, String>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &src, &mut all);
    let modules: BTreeSet<String> = all.iter().filter_map(|(f, _)| module_of(f)).collect();
    let mut g = BTreeMap::new();
    let mut file_of = BTreeMap::new();
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
        file_of.insert(m.clone(), file.clone());
        g.insert(m, to);
    }
    (g, file_of)
}

/// The layers of the ```` ```layers ```` block in the "Code map, by layer"
/// section of `md`, lowest first: (name, modules).
fn layer_table(md: &str) -> Result<Vec<(String, Vec<String>)>, String> {
    let section = md
        .split("\n## ")
        .find(|s| s.starts_with("Code map, by layer"))
        .ok_or("no section \"## Code map, by layer\"")?;
    let mut lines = section.lines();
    lines
        .by_ref()
        .find(|l| l.trim() == "```layers")
        .ok_or("no ```layers block in \"Code map, by layer\"")?;
    let mut table: Vec<(String, Vec<String>)> = Vec::new();
    for line in lines {
        if line.trim() == "```" {
            return Ok(table);
        }
        let text = line.split('#').next().unwrap_or("");
        if text.trim().is_empty() {
            continue;
        }
        let mods = if text.starts_with(char::is_whitespace) {
            text
        } else {
            // A layer's name has no `:`; its modules' paths do.
            let Some((name, mods)) = text.split_once(':') else {
                return Err(format!("not `layer: modules...`: {line:?}"));
            };
            table.push((name.trim().to_string(), Vec::new()));
            mods
        };
        let Some((_, layer)) = table.last_mut() else {
            return Err(format!("a continuation before any layer: {line:?}"));
        };
        layer.extend(mods.split_whitespace().map(str::to_string));
    }
    Err("the ```layers block does not end".into())
}

/// What is wrong with `g` (modules in `file_of`'s files) against the
/// layer `table`, allowing the upward imports of `known`: one line each.
fn layer_problems(
    g: &BTreeMap<String, BTreeSet<String>>,
    file_of: &BTreeMap<String, String>,
    table: &[(String, Vec<String>)],
    known: &[(&str, &str, &str)],
) -> Vec<String> {
    let mut out = Vec::new();
    let mut layer: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, (name, mods)) in table.iter().enumerate() {
        for m in mods {
            if let Some(&j) = layer.get(m.as_str()) {
                out.push(format!(
                    "`{m}` is placed in two layers: {} and {name}",
                    table[j].0
                ));
            }
            layer.insert(m, i);
            if !g.contains_key(m) {
                out.push(format!(
                    "layer {name} places `{m}`, which src/ does not have"
                ));
            }
        }
    }
    let name = |i: usize| table[i].0.as_str();
    let mut upward = BTreeSet::new();
    for (m, to) in g {
        let file = file_of.get(m).map_or("?", String::as_str);
        let Some(&lm) = layer.get(m.as_str()) else {
            out.push(format!(
                "src/{file}: `{m}` is in no layer of ARCHITECTURE.md's table"
            ));
            continue;
        };
        for t in to {
            let Some(&lt) = layer.get(t.as_str()) else {
                continue;
            };
            if lt <= lm {
                continue;
            }
            upward.insert((m.as_str(), t.as_str()));
            let edge = format!(
                "src/{file}: `{m}` ({}) imports `{t}` ({}), a higher layer",
                name(lm),
                name(lt)
            );
            match known.iter().find(|(a, b, _)| a == m && b == t) {
                Some((_, _, why)) => eprintln!("known: {edge}: {why}"),
                None => out.push(edge),
            }
        }
    }
    for (a, b, why) in known {
        if !upward.contains(&(*a, *b)) {
            out.push(format!(
                "KNOWN_UPWARD lists `{a}` -> `{b}` ({why}), which is no upward import now: \
                 remove it"
            ));
        }
    }
    out
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
fn imports_go_to_the_same_layer_or_below() {
    let (g, file_of) = graph();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md");
    let md = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let table = layer_table(&md).unwrap_or_else(|e| panic!("ARCHITECTURE.md: {e}"));
    assert!(table.len() > 5, "found only {} layers", table.len());
    let found = layer_problems(&g, &file_of, &table, KNOWN_UPWARD);
    assert!(
        found.is_empty(),
        "src/ against ARCHITECTURE.md's layer table (lowest first: {}):\n{}",
        table
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        found.join("\n")
    );
}

/// The fuzz targets reach the wire formats, the cfg language's two
/// parsers, StringsPlugin's file and a socket to feed them, nothing else (ARCHITECTURE.md,
/// "Wire code"): a target that needs a service's code means that code is
/// a wire format to move into `proto`.
#[test]
fn fuzzing_reaches_only_the_parsers() {
    let (g, _) = graph();
    let to = g.get("fuzzing").expect("src/fuzzing.rs is a module");
    let allowed = |m: &str| {
        m == "proto"
            || m.starts_with("proto::")
            || m == "conf"
            || m == "conf::token"
            || m == "logformat"
            || m == "net"
            || m == "res"
            || m == "stringtable"
    };
    let bad: Vec<&String> = to.iter().filter(|m| !allowed(m)).collect();
    assert!(to.iter().any(|m| m.starts_with("proto")), "{to:?}");
    assert!(bad.is_empty(), "src/fuzzing.rs imports {bad:?}");
}

#[test]
fn the_module_graph_has_no_cycles() {
    let (g, _) = graph();
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

#[test]
fn the_layer_check_sees_every_kind_of_problem() {
    let md = "# A\n\n## Code map, by layer\n\ntext\n\n```layers\n# comment\n\
              low: a b   # trailing\n     c\nhigh: d\n```\n\n## Next\n";
    let table = layer_table(md).unwrap();
    let words = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        table,
        [
            ("low".to_string(), words(&["a", "b", "c"])),
            ("high".to_string(), words(&["d"]))
        ]
    );
    assert!(layer_table("## Code map, by layer\n```layers\nlow: a\n").is_err());
    assert!(layer_table("## Other\n```layers\nlow: a\n```\n").is_err());
    let edges = |v: &[(&str, &[&str])]| -> BTreeMap<String, BTreeSet<String>> {
        v.iter()
            .map(|(m, to)| (m.to_string(), to.iter().map(|t| t.to_string()).collect()))
            .collect()
    };
    let files: BTreeMap<String, String> = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|m| (m.to_string(), format!("{m}.rs")))
        .collect();
    // Down and sideways is fine.
    let g = edges(&[("a", &["b"]), ("b", &[]), ("c", &[]), ("d", &["a", "c"])]);
    assert_eq!(
        layer_problems(&g, &files, &table, &[]),
        Vec::<String>::new()
    );
    // Up is not, unless known; a known edge that is gone is stale.
    let g = edges(&[
        ("a", &["d"]),
        ("b", &[]),
        ("c", &[]),
        ("d", &[]),
        ("e", &[]),
    ]);
    let found = layer_problems(&g, &files, &table, &[("c", "d", "why")]);
    assert_eq!(
        found,
        [
            "src/a.rs: `a` (low) imports `d` (high), a higher layer",
            "src/e.rs: `e` is in no layer of ARCHITECTURE.md's table",
            "KNOWN_UPWARD lists `c` -> `d` (why), which is no upward import now: remove it",
        ]
    );
    assert!(layer_problems(&g, &files, &table, &[("a", "d", "why")]).len() == 1);
    // A module placed twice, or one src/ does not have.
    let twice = [
        ("low".to_string(), words(&["a", "b", "c", "x"])),
        ("high".to_string(), words(&["d", "a"])),
    ];
    let g = edges(&[("a", &[]), ("b", &[]), ("c", &[]), ("d", &[])]);
    assert_eq!(
        layer_problems(&g, &files, &twice, &[]),
        [
            "layer low places `x`, which src/ does not have",
            "`a` is placed in two layers: low and high",
        ]
    );
}
