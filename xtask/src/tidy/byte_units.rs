//! One home for byte units: no table that says what "MiB" or "MB" means
//! (parser match arms, unit lists, a unit beside its size) outside
//! memcore's byte parser and formatter.

use std::path::Path;

use super::test_only::non_test_code;
use super::{LITERAL_END, Line, split, workspace_root};

/// The one file that may spell out what a byte unit means.
const BYTE_UNITS_HOME: &str = "memcore/src/bytes.rs";

/// Byte units as a parser or formatter would spell them.
const BYTE_UNITS: &[&str] = &[
    "b", "k", "m", "g", "t", "p", "kb", "mb", "gb", "tb", "pb", "ki", "mi", "gi", "ti", "pi",
    "kib", "mib", "gib", "tib", "pib",
];

/// How many of a line's string literals are a byte unit of [`BYTE_UNITS`]
/// and nothing else.
fn unit_literals(line: &Line) -> usize {
    line.strings
        .split(LITERAL_END)
        .filter(|s| BYTE_UNITS.contains(&s.to_lowercase().as_str()))
        .count()
}

/// Whether a line of code is a row of a byte-unit table: a unit literal in
/// a match arm or beside a power of two or ten that spells its size, or
/// several unit literals. (A unit inside a message, as in `"{} MiB"`, is
/// not a table.)
fn byte_unit_table_line(line: &Line) -> bool {
    let units = unit_literals(line);
    if units >= 2 {
        return true;
    }
    if units == 0 {
        return false;
    }
    let code = line.code.replace(['_', ' '], "");
    let sizes = [
        "<<10", "<<20", "<<30", "<<40", ">>10", ">>20", ">>30", ">>40", "1024", "1000", "1048576",
    ];
    code.contains("=>") || sizes.iter().any(|s| code.contains(s))
}

/// Every line of library or binary code outside [`BYTE_UNITS_HOME`] that
/// pairs byte units with their sizes, as `path:line: code`.
fn byte_unit_tables(root: &Path) -> Vec<String> {
    non_test_code(root)
        .into_iter()
        .filter(|(path, _, line)| path != BYTE_UNITS_HOME && byte_unit_table_line(line))
        .map(|(path, n, line)| {
            let shown: String = line.code.trim().chars().take(100).collect();
            format!("{path}:{n}: {shown:?}")
        })
        .collect()
}

#[test]
fn one_home_for_byte_units() {
    let found = byte_unit_tables(&workspace_root());
    assert!(
        found.is_empty(),
        "byte units paired with their sizes outside {BYTE_UNITS_HOME} (parse and format \
         through memcore::bytes, or use its constants):\n{}",
        found.join("\n")
    );
}

#[test]
fn byte_unit_tables_are_told_from_labels() {
    for (code, expected) in [
        ("\"M\" | \"MiB\" => 1 << 20,", true),
        ("(\"KB\", 1_000),", true),
        ("((1u64 << 30) as f64, \"GiB\")", true),
        ("const UNITS: [&str; 2] = [\"B\", \"KiB\"];", true),
        (
            "format!(\"{:.1} MiB\", bytes as f64 / f64::from(1 << 20))",
            false,
        ),
        (".x_desc(\"GiB\")", false),
        ("format!(\"{} MiB free\", mib(bytes))", false),
        ("Value::Bytes(_) => \"bytes\",", false),
        ("Kind::A => \"a b c\",", false),
        ("let name = \"m\"; // 1 << 20", false),
    ] {
        let lines = split(code);
        assert_eq!(byte_unit_table_line(&lines[0]), expected, "{code}");
    }
}
