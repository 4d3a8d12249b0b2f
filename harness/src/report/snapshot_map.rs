//! The picture of a PyTorch snapshot's moment for `explain --snapshot
//! --report`: one row per segment, drawn to one scale (bytes per pixel the
//! same for every row), its blocks at their offsets, coloured by what they
//! are; every segment and block has a hover title with its size, and a
//! block's with the stack that allocated it.

use std::fmt::Write as _;

use memcore::bytes::human;

use super::escape;
use trace::snapshot::state::{BlockState, Segment, State};

/// Rows drawn; the rest are counted under the picture.
const DRAWN_SEGMENTS: usize = 160;
/// Width of the bar area, pixels.
const BAR_WIDTH: f64 = 700.0;
/// Width of the label column, pixels.
const LABEL_WIDTH: f64 = 230.0;
/// Height of a row, pixels.
const ROW: f64 = 20.0;
/// Text size, pixels.
const FONT: u32 = 12;
/// The narrowest a drawn piece gets, pixels, so a small block still shows.
const MIN_PIECE: f64 = 1.5;

/// Colours and names of what a piece of a segment is.
const KEY: [(&str, &str); 4] = [
    ("#1f6fb4", "allocated"),
    ("#e69f00", "freed, waiting on its stream"),
    ("#d1495b", "free, stranded (its segment holds live blocks)"),
    ("#9bd3ae", "free, in a segment PyTorch's retry would free"),
];

/// The SVG picture of `state`'s segments and blocks, with its key.
pub fn picture(state: &State) -> String {
    let largest = state
        .segments
        .iter()
        .map(|segment| segment.total_bytes)
        .max()
        .unwrap_or(0)
        .max(1);
    let scale = BAR_WIDTH / largest as f64;
    let rows = state.segments.len().min(DRAWN_SEGMENTS);
    let key_height = ROW * 1.5;
    let height = key_height + ROW * (rows as f64 + 1.0);
    let width = LABEL_WIDTH + BAR_WIDTH + 20.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"snapshot-map\" width=\"{width}\" \
         height=\"{height}\" font-family=\"sans-serif\" font-size=\"{FONT}\">\n"
    );
    let mut x = 0.0;
    for (color, name) in KEY {
        let _ = writeln!(
            svg,
            "<rect x=\"{x}\" y=\"4\" width=\"14\" height=\"14\" fill=\"{color}\"/>\
             <text x=\"{}\" y=\"16\">{}</text>",
            x + 18.0,
            escape(name)
        );
        x += 30.0 + 6.5 * name.len() as f64;
    }
    let _ = writeln!(
        svg,
        "<text x=\"{LABEL_WIDTH}\" y=\"{}\">one scale: the widest row is {}</text>",
        key_height + ROW * 0.7,
        human(largest)
    );
    for (row, segment) in state.segments.iter().take(rows).enumerate() {
        let y = key_height + ROW * (row as f64 + 1.0);
        segment_row(&mut svg, segment, y, scale);
    }
    svg += "</svg>\n";
    if state.segments.len() > rows {
        let _ = writeln!(
            svg,
            "<p>and {} more segments (all in the table below)</p>",
            state.segments.len() - rows
        );
    }
    svg
}

/// One segment: its label, its outline, its free gaps and its blocks.
fn segment_row(svg: &mut String, segment: &Segment, y: f64, scale: f64) {
    let pinned = !segment.live_blocks.is_empty();
    let _ = writeln!(
        svg,
        "<text x=\"0\" y=\"{}\">{:#x} {}{}</text>",
        y + ROW * 0.7,
        segment.address,
        human(segment.total_bytes),
        if segment.expandable {
            " expandable"
        } else {
            ""
        }
    );
    let free_color = if pinned { KEY[2].0 } else { KEY[3].0 };
    let width = (segment.total_bytes as f64 * scale).max(MIN_PIECE);
    let _ = writeln!(
        svg,
        "<rect x=\"{LABEL_WIDTH}\" y=\"{}\" width=\"{width:.1}\" height=\"{}\" fill=\"{free_color}\" \
         stroke=\"#555\" stroke-width=\"0.5\"><title>segment {:#x}: {}, {} free ({} pool, stream \
         {})</title></rect>",
        y + 2.0,
        ROW - 4.0,
        segment.address,
        human(segment.total_bytes),
        human(segment.free_bytes),
        escape(&segment.pool),
        segment.stream
    );
    for block in &segment.live_blocks {
        let offset = block.address.saturating_sub(segment.address);
        let x = LABEL_WIDTH + offset as f64 * scale;
        let width = (block.size_bytes as f64 * scale).max(MIN_PIECE);
        let (color, what) = match block.state {
            BlockState::PendingFree => (KEY[1].0, KEY[1].1),
            BlockState::Allocated | BlockState::Free => (KEY[0].0, KEY[0].1),
        };
        let mut title = format!(
            "block {:#x}: {} {what} (requested {})",
            block.address,
            human(block.size_bytes),
            human(block.requested_bytes)
        );
        for frame in &block.stack {
            let _ = write!(
                title,
                "\n  {}:{} in {}",
                frame.file, frame.line, frame.function
            );
        }
        let _ = writeln!(
            svg,
            "<rect x=\"{x:.1}\" y=\"{}\" width=\"{width:.1}\" height=\"{}\" fill=\"{color}\">\
             <title>{}</title></rect>",
            y + 3.0,
            ROW - 6.0,
            escape(&printable(&title))
        );
    }
}

/// `text` with control characters other than the line breaks of a title
/// written as escapes.
fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            if c.is_control() && c != '\n' {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}
