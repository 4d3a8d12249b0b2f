//! Prose for a terminal: the one line width of the workspace's text output
//! and the one way a sentence is broken to fit it, so a ledger, a replay
//! table and a conclusion wrap alike.
//!
//! ```
//! use ctx::text::wrap;
//! let text = wrap("local memory is the big item, 4.12 GiB", 20, "=> ", "   ");
//! assert_eq!(text, "=> local memory is\n   the big item,\n   4.12 GiB");
//! assert!(text.lines().all(|line| line.chars().count() <= 20));
//! ```

use std::string::String;
use std::vec::Vec;

use memcore::bytes::is_unit;

/// The widest line a command prints, characters: what fits a terminal, a
/// pull request and a bug report without wrapping.
pub const LINE_WIDTH: usize = 100;

/// `text` broken at spaces into lines of at most `width` characters (the
/// indents count), the first line opening with `first`, every later one
/// with `rest`; the lines joined by `\n`, with no newline at the end. Runs
/// of spaces become one; a byte unit stays on the line of its number
/// (`30.0 MiB` is never split) and a command in backquotes is not broken,
/// unless either is wider than a line; a word longer than a line is cut where the
/// line ends, so no line is ever wider than `width` (unless an indent alone
/// is).
pub fn wrap(text: &str, width: usize, first: &str, rest: &str) -> String {
    let mut out = String::from(first);
    let mut line = first.chars().count();
    // Whether the line holds a word yet (an indent alone does not count).
    let mut started = false;
    let room = width.saturating_sub(rest.chars().count());
    // A joined word no line holds goes back to its own words.
    let words = words(text).into_iter().flat_map(|word| {
        if word.contains(' ') && word.chars().count() > room {
            word.split(' ').map(String::from).collect()
        } else {
            vec![word]
        }
    });
    for word in words {
        let mut word = word.as_str();
        let mut len = word.chars().count();
        if started && line + 1 + len > width {
            out.push('\n');
            out.push_str(rest);
            line = rest.chars().count();
            started = false;
        }
        if started {
            out.push(' ');
            line += 1;
        }
        // A word that no line holds is cut at the line's end.
        while line + len > width && width > line {
            let room = width - line;
            let cut = word
                .char_indices()
                .nth(room)
                .map_or(word.len(), |(at, _)| at);
            out.push_str(&word[..cut]);
            out.push('\n');
            out.push_str(rest);
            line = rest.chars().count();
            word = &word[cut..];
            len -= room;
        }
        out.push_str(word);
        line += len;
        started = true;
    }
    out
}

/// The words of `text`, a byte unit joined to the word before it and a
/// command in backquotes kept whole.
fn words(text: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    // Whether the last word opened a backquoted span it has not closed.
    let mut quoted = false;
    for word in text.split_whitespace() {
        match words.last_mut() {
            Some(last) if quoted || is_unit(word) => {
                last.push(' ');
                last.push_str(word);
            }
            _ => words.push(word.into()),
        }
        if word.matches('`').count() % 2 == 1 {
            quoted = !quoted;
        }
    }
    words
}

/// `text` wrapped within [`LINE_WIDTH`] (see [`wrap`] for `first` and
/// `rest`) and added to `out` as whole lines, the last one ended too.
pub fn push_wrapped(out: &mut String, text: &str, first: &str, rest: &str) {
    out.push_str(&wrap(text, LINE_WIDTH, first, rest));
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_break_at_spaces_and_never_pass_the_width() {
        let text = "a bb ccc dddd eeeee ffffff";
        for width in 1..30 {
            let wrapped = wrap(text, width, "", "");
            for line in wrapped.lines() {
                assert!(line.chars().count() <= width, "{width}: {wrapped:?}");
            }
            let words: String = wrapped.split_whitespace().collect();
            let whole: String = text.split_whitespace().collect();
            assert_eq!(words, whole, "{width}: {wrapped:?}");
        }
        assert_eq!(wrap(text, 10, "", ""), "a bb ccc\ndddd eeeee\nffffff");
        assert_eq!(
            wrap(text, 100, "  ", "    "),
            "  a bb ccc dddd eeeee ffffff"
        );
        assert_eq!(wrap("", 10, "> ", ""), "> ");
    }

    /// Each `(text, width, wrapped)`: `text` wrapped at `width` with no
    /// indent is `wrapped`.
    fn wraps_as(cases: &[(&str, usize, &str)]) {
        for &(text, width, wrapped) in cases {
            assert_eq!(wrap(text, width, "", ""), wrapped, "{text:?} at {width}");
        }
    }

    #[test]
    fn a_quoted_command_stays_on_one_line() {
        wraps_as(&[
            (
                "or `cudamem run -- PROGRAM` here",
                20,
                "or `cudamem run --\nPROGRAM` here",
            ),
            (
                "or `cudamem run -- PROGRAM` here",
                30,
                "or `cudamem run -- PROGRAM`\nhere",
            ),
        ]);
    }

    #[test]
    fn a_size_keeps_its_unit() {
        wraps_as(&[
            ("would map 30.0 MiB less", 14, "would map\n30.0 MiB less"),
            ("(-2.23 GiB, -42.9%)", 12, "(-2.23 GiB,\n-42.9%)"),
        ]);
    }

    #[test]
    fn a_word_wider_than_a_line_is_cut_at_its_end() {
        assert_eq!(wrap("abcdefgh ij", 4, "", " "), "abcd\n efg\n h\n ij");
        assert_eq!(wrap("üüüüü", 3, "", ""), "üüü\nüü");
    }
}
