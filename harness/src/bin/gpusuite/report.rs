//! What the suite found: checks grouped by section, each logged with its
//! numbers as it is made, and the summary table printed at the end.

use std::fs::File;
use std::io::{self, Write as _};
use std::path::Path;

/// One verdict with the numbers behind it.
#[derive(Debug, Clone)]
pub struct Check {
    /// What was checked, short.
    pub name: String,
    /// Whether it held.
    pub passed: bool,
    /// The measured (and predicted) numbers, with units.
    pub numbers: String,
}

/// Lines of detail, written to stdout and to the log file.
pub struct Log {
    file: Option<File>,
}

impl Log {
    /// A log that also writes to `path`, when given.
    pub fn create(path: Option<&Path>) -> io::Result<Self> {
        let file = path.map(File::create).transpose()?;
        Ok(Self { file })
    }

    /// Writes one line. A log file that stops accepting writes loses lines;
    /// stdout still has them.
    pub fn line(&mut self, text: &str) {
        println!("{text}");
        if let Some(file) = &mut self.file {
            let _ = writeln!(file, "{text}");
        }
    }
}

/// The checks of the section that is running, logged as they are made.
pub struct Checks<'a> {
    log: &'a mut Log,
    checks: Vec<Check>,
}

impl<'a> Checks<'a> {
    pub fn new(log: &'a mut Log) -> Self {
        Self {
            log,
            checks: Vec::new(),
        }
    }

    /// Records a verdict.
    pub fn check(&mut self, name: &str, passed: bool, numbers: String) {
        let verdict = if passed { "PASS" } else { "FAIL" };
        self.log.line(&format!("  {verdict} {name}: {numbers}"));
        self.checks.push(Check {
            name: name.to_string(),
            passed,
            numbers,
        });
    }

    /// Logs a detail that is not a verdict.
    pub fn note(&mut self, text: &str) {
        self.log.line(&format!("    {text}"));
    }

    pub fn into_checks(self) -> Vec<Check> {
        self.checks
    }
}

/// One section's outcome.
pub struct Section {
    pub letter: char,
    pub title: &'static str,
    pub checks: Vec<Check>,
    /// Why the section stopped early, if it did (an error or a panic).
    pub error: Option<String>,
    pub seconds: f64,
}

impl Section {
    /// Passed: finished, made at least one check, and every check held.
    pub fn passed(&self) -> bool {
        self.error.is_none() && !self.checks.is_empty() && self.checks.iter().all(|c| c.passed)
    }
}

/// A signed difference of byte counts as MiB with its sign
/// ([`memcore::bytes::mib`] with `+` or `-`).
pub fn mib_signed(bytes: i128) -> String {
    memcore::bytes::signed(bytes, true, memcore::bytes::mib)
}

/// The markdown summary: one row per check, one per section error.
pub fn summary_table(sections: &[Section]) -> String {
    let mut table =
        String::from("| section | check | result | numbers |\n| --- | --- | --- | --- |\n");
    for s in sections {
        for c in &s.checks {
            let verdict = if c.passed { "PASS" } else { "FAIL" };
            table.push_str(&format!(
                "| {} {} | {} | {verdict} | {} |\n",
                s.letter, s.title, c.name, c.numbers
            ));
        }
        if let Some(error) = &s.error {
            table.push_str(&format!(
                "| {} {} | (stopped) | FAIL | {} |\n",
                s.letter,
                s.title,
                error.replace('|', "/").replace('\n', " ")
            ));
        } else if s.checks.is_empty() {
            table.push_str(&format!(
                "| {} {} | (no checks) | FAIL | |\n",
                s.letter, s.title
            ));
        }
    }
    let passed = sections.iter().filter(|s| s.passed()).count();
    let seconds: f64 = sections.iter().map(|s| s.seconds).sum();
    table.push_str(&format!(
        "\n{passed} of {} sections passed in {seconds:.1} s\n",
        sections.len()
    ));
    table
}
