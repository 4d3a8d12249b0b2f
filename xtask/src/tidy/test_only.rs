//! Which lines of the workspace only tests compile: items under
//! `#[cfg(test)]`, the files of such modules, and `tests/` folders (Rust
//! files outside a `src/` folder).

use std::path::Path;

use super::{Line, sources, split};

/// The file a `mod name;` in `path` reads: beside `path` for a crate root
/// or `mod.rs`, else in the folder named after `path`.
fn module_file(path: &str, name: &str) -> String {
    let (dir, file) = path.rsplit_once('/').unwrap_or(("", path));
    let base = match file {
        "lib.rs" | "main.rs" | "mod.rs" => dir.to_string(),
        _ => format!("{dir}/{}", file.trim_end_matches(".rs")),
    };
    format!("{base}/{name}")
}

/// For each line of `lines`, whether only tests compile it: the lines of an
/// item under `#[cfg(test)]`. Also the module files such items name
/// (`#[cfg(test)] mod tests;`), as paths without `.rs`.
fn test_only_lines(path: &str, lines: &[Line]) -> (Vec<bool>, Vec<String>) {
    let mut test_only = vec![false; lines.len()];
    let mut modules = Vec::new();
    let mut n = 0;
    while n < lines.len() {
        let Some(at) = lines[n].code.find("#[cfg(test)]") else {
            n += 1;
            continue;
        };
        // The item runs to its closing brace, or to a `;` before any brace.
        let mut depth = 0usize;
        let mut opened = false;
        let mut item = String::new();
        let mut end = n;
        let mut column = at + "#[cfg(test)]".len();
        'item: for (m, line) in lines.iter().enumerate().skip(n) {
            end = m;
            for c in line.code[column..].chars() {
                item.push(c);
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => {
                        depth = depth.saturating_sub(1);
                        if opened && depth == 0 {
                            break 'item;
                        }
                    }
                    ';' if !opened && depth == 0 => break 'item,
                    _ => {}
                }
            }
            item.push(' ');
            column = 0;
        }
        let words: Vec<&str> = item.split_whitespace().collect();
        if let [.., "mod", name] = words.as_slice() {
            if let Some(name) = name.strip_suffix(';') {
                modules.push(module_file(path, name));
            }
        }
        test_only[n..=end].iter_mut().for_each(|t| *t = true);
        n = end + 1;
    }
    (test_only, modules)
}

/// The code lines of the workspace's libraries and binaries (Rust files
/// under a `src/` folder) that more than tests compile, as (path, line
/// number, line): not the items under `#[cfg(test)]`, nor the files of
/// such modules and the modules below them.
pub(super) fn non_test_code(root: &Path) -> Vec<(String, usize, Line)> {
    let files: Vec<(String, Vec<Line>)> = sources(root, &[".rs"])
        .into_iter()
        .filter(|(path, _)| path.contains("/src/"))
        .map(|(path, text)| {
            let lines = split(&text);
            (path, lines)
        })
        .collect();
    let mut test_modules = Vec::new();
    let mut kept = Vec::new();
    for (path, lines) in &files {
        let (test_only, modules) = test_only_lines(path, lines);
        test_modules.extend(modules);
        for (n, line) in lines.iter().enumerate() {
            if !test_only[n] {
                kept.push((path.clone(), n + 1, line.clone()));
            }
        }
    }
    kept.retain(|(path, _, _)| {
        let stem = path.trim_end_matches(".rs").trim_end_matches("/mod");
        !test_modules
            .iter()
            .any(|m| stem == m || stem.starts_with(&format!("{m}/")))
    });
    kept
}

#[test]
fn test_only_items_and_modules_are_found() {
    let text = "fn kept() {}\n\
                #[cfg(test)]\n\
                mod tests {\n\
                    fn inner() { if x { y } }\n\
                }\n\
                fn also_kept() {}\n\
                #[cfg(test)]\n\
                mod more;\n\
                #[cfg(test)] fn alone() {}\n";
    let lines = split(text);
    let (test_only, modules) = test_only_lines("a/src/thing.rs", &lines);
    let kept: Vec<usize> = (0..lines.len()).filter(|&n| !test_only[n]).collect();
    assert_eq!(kept, [0, 5, 9]);
    assert_eq!(modules, ["a/src/thing/more"]);
    assert_eq!(module_file("a/src/lib.rs", "t"), "a/src/t");
    assert_eq!(module_file("a/src/x/mod.rs", "t"), "a/src/x/t");
}
