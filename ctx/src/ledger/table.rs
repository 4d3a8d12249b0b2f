//! The one text form of a ledger: rows of what, bytes predicted, bytes
//! measured and why, in aligned columns, each figure exact and in MiB
//! ([`memcore::bytes::mib`]). [`Ledger`](super::Ledger)'s `Display` writes
//! its items so; a caller with rows of its own (a pool's, a process's)
//! writes them the same way.

use std::fmt;

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

/// The narrowest the item column gets, characters: as wide as the ledger's
/// own names need.
const ITEM_WIDTH: usize = 18;
/// Width of each figure column, characters: a bound on a device of a
/// hundred-odd GiB fits.
const FIGURE_WIDTH: usize = 36;

/// Writes `rows` under a header line (`item  predicted  measured  why`),
/// one a line; a row no model covers shows `-`, a model's unknown shows
/// `unknown`, a bound `at most ...`.
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
/// assert!(text.lines().nth(1).unwrap().contains("3145728 (3.0 MiB)  mapped pages"));
/// # Ok::<(), std::fmt::Error>(())
/// ```
pub fn render_rows(out: &mut impl fmt::Write, rows: &[LedgerRow]) -> fmt::Result {
    let width = rows
        .iter()
        .map(|row| row.item.chars().count())
        .max()
        .unwrap_or(0)
        .max(ITEM_WIDTH);
    writeln!(
        out,
        "{:<width$} {:>FIGURE_WIDTH$} {:>FIGURE_WIDTH$}  why",
        "item", "predicted", "measured"
    )?;
    for row in rows {
        writeln!(
            out,
            "{:<width$} {:>FIGURE_WIDTH$} {:>FIGURE_WIDTH$}  {}",
            row.item,
            prediction(row.predicted),
            figure(row.measured),
            row.why
        )?;
    }
    Ok(())
}

/// `bytes` exactly and in MiB, or `-` for a figure nobody has.
fn figure(bytes: Option<u64>) -> String {
    match bytes {
        Some(bytes) => format!("{bytes} ({})", memcore::bytes::mib(bytes)),
        None => "-".into(),
    }
}

/// A prediction as [`figure`] writes bytes, a bound prefixed `at most`.
fn prediction(predicted: Option<Prediction>) -> String {
    match predicted {
        None => "-".into(),
        Some(Prediction::Bytes(bytes)) => figure(Some(bytes)),
        Some(Prediction::AtMost(bytes)) => format!("at most {}", figure(Some(bytes))),
        Some(Prediction::Unknown) => "unknown".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_and_widen_for_long_items() {
        let row = |item: &str, predicted, measured| LedgerRow {
            item: item.into(),
            predicted,
            measured,
            why: "because".into(),
        };
        let mut text = String::new();
        render_rows(
            &mut text,
            &[
                row("total", Some(Prediction::Bytes(1 << 30)), None),
                row("    freed, waiting on streams", None, Some(512)),
                row("driver + context", Some(Prediction::Unknown), None),
                row("free", Some(Prediction::AtMost(1 << 20)), None),
            ],
        )
        .unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5);
        let why_at: Vec<usize> = lines.iter().map(|l| l.rfind("  ").unwrap()).collect();
        assert!(why_at.windows(2).all(|w| w[0] == w[1]), "{text}");
        assert!(lines[1].contains("1073741824 (1024.0 MiB)"), "{text}");
        assert!(lines[2].contains("512 (0.0 MiB)  because"), "{text}");
        assert!(lines[1].trim_end().ends_with("-  because"), "{text}");
        assert!(lines[3].contains("unknown"), "{text}");
        assert!(lines[4].contains("at most 1048576 (1.0 MiB)"), "{text}");
    }
}
