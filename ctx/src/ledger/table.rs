//! The one text form of a ledger: rows of what, bytes predicted, bytes
//! measured and why, in columns sized to their cells, each figure in
//! [`memcore::bytes::human`]'s form, within [`LINE_WIDTH`]. [`Ledger`](super::Ledger)'s `Display` writes
//! its items so; a caller with rows of its own (a pool's, a process's)
//! writes them the same way.

use std::fmt;

use crate::text::{LINE_WIDTH, wrap};
use memcore::bytes::human;

use super::Prediction;

/// One row of a ledger table. Sizes in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerRow {
    /// What the bytes are (an item's name; leading spaces indent a part of
    /// the row above).
    pub item: String,
    /// What a model says (bytes, a bound, or unknown), if a model covers
    /// the row at all.
    pub predicted: Option<Prediction>,
    /// What a device or pool showed, where someone measured it.
    pub measured: Option<u64>,
    /// Where the figures come from, one line.
    pub why: String,
}

/// Writes `rows` under a header line (`item  predicted  measured  why`),
/// one a line, each column as wide as its widest cell and every figure in
/// [`memcore::bytes::human`]'s form; the why column is wrapped at words so
/// that no line passes [`LINE_WIDTH`], later lines indented under it. A row
/// no model covers shows `-`, a model's unknown shows `unknown`, a bound
/// `at most ...`.
///
/// ```
/// use ctx::{LedgerRow, render_rows};
///
/// let rows = [LedgerRow {
///     item: "pool".into(),
///     predicted: None,
///     measured: Some(3 << 20),
///     why: "mapped pages".into(),
/// }];
/// let mut text = String::new();
/// render_rows(&mut text, &rows)?;
/// assert_eq!(text.lines().nth(1).unwrap(), "pool         - 3.00 MiB  mapped pages");
/// # Ok::<(), std::fmt::Error>(())
/// ```
pub fn render_rows(out: &mut impl fmt::Write, rows: &[LedgerRow]) -> fmt::Result {
    let cells: Vec<[String; 3]> = rows
        .iter()
        .map(|row| {
            [
                row.item.clone(),
                prediction(row.predicted),
                figure(row.measured),
            ]
        })
        .collect();
    let headers = ["item", "predicted", "measured"];
    let widths: [usize; 3] = core::array::from_fn(|column| {
        cells
            .iter()
            .map(|cell| cell[column].chars().count())
            .chain([headers[column].len()])
            .max()
            .unwrap_or(0)
    });
    let why_at = widths.iter().sum::<usize>() + 4;
    let indent = " ".repeat(why_at);
    let [item, predicted, measured] = widths;
    writeln!(
        out,
        "{:<item$} {:>predicted$} {:>measured$}  why",
        headers[0], headers[1], headers[2]
    )?;
    for (row, cell) in rows.iter().zip(&cells) {
        let lead = format!(
            "{:<item$} {:>predicted$} {:>measured$}  ",
            cell[0], cell[1], cell[2]
        );
        writeln!(out, "{}", wrap(&row.why, LINE_WIDTH, &lead, &indent))?;
    }
    Ok(())
}

/// `bytes` for people, or `-` for a figure nobody has.
fn figure(bytes: Option<u64>) -> String {
    match bytes {
        Some(bytes) => human(bytes),
        None => "-".into(),
    }
}

/// A prediction as [`figure`] writes bytes, a bound prefixed `at most`.
fn prediction(predicted: Option<Prediction>) -> String {
    match predicted {
        None => "-".into(),
        Some(predicted) => predicted.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_fit_their_cells_and_the_why_wraps_under_itself() {
        let row = |item: &str, predicted, measured, why: &str| LedgerRow {
            item: item.into(),
            predicted,
            measured,
            why: why.into(),
        };
        let long = "because ".repeat(30);
        let mut text = String::new();
        render_rows(
            &mut text,
            &[
                row("total", Some(Prediction::Bytes(1 << 30)), None, "because"),
                row("    freed, waiting on streams", None, Some(512), "because"),
                row("driver + context", Some(Prediction::Unknown), None, &long),
                row("free", Some(Prediction::AtMost(1 << 20)), None, "because"),
            ],
        )
        .unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.len() > 5, "{text}");
        assert!(
            lines.iter().all(|line| line.chars().count() <= LINE_WIDTH),
            "{text}"
        );
        let why_at = lines[0].find("why").unwrap();
        for line in &lines[1..] {
            assert_eq!(line.find("because"), Some(why_at), "{text}");
        }
        assert!(lines[1].contains("1.00 GiB        -  because"), "{text}");
        assert!(lines[2].contains("-    512 B  because"), "{text}");
        assert!(lines[3].contains("unknown"), "{text}");
        assert!(
            lines.iter().any(|line| line.contains("at most 1.00 MiB")),
            "{text}"
        );
        // The item column is as wide as its widest cell, no wider.
        assert_eq!(lines[0].find("predicted"), Some(37), "{text}");
    }
}
