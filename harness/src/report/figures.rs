//! The figures of a trace on the page: the grouped table, what its columns
//! mean, and the peak footprints as bars on an axis from zero.

use memcore::bytes::human;
use plotters::style::RGBColor;

use crate::report::charts::curve_color;
use crate::report::summary::{COLUMNS, DRIVER_TIME_NOTE, PolicySummary, TraceSummary};
use crate::report::{FootprintCurve, escape};

/// Each curve's peak as a bar on an axis from zero to the largest, so a
/// bar twice as long is twice the bytes; the peak live bytes as a black
/// line. Each bar carries its figure and its ratio to the peak live bytes
/// (small differences are read there), and hovering it gives its figures.
pub(super) fn peak_bars(curves: &[FootprintCurve<'_>], peak_live: u64) -> String {
    let peaks: Vec<u64> = curves
        .iter()
        .map(|curve| {
            curve
                .mapped
                .iter()
                .map(|&(_, bytes)| bytes)
                .max()
                .unwrap_or(0)
        })
        .collect();
    let high = peaks
        .iter()
        .copied()
        .chain([peak_live])
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let low = 0.0;
    let (left, width, row) = (190.0, 600.0, 26.0);
    let x = |bytes: f64| left + (bytes.min(high) - low) / (high - low).max(1.0) * width;
    let height = row * curves.len() as f64 + 60.0;
    let mut svg = format!(
        "<svg class=\"peaks\" width=\"960\" height=\"{height}\" viewBox=\"0 0 960 {height}\" \
         xmlns=\"http://www.w3.org/2000/svg\" font-family=\"sans-serif\" font-size=\"14\">"
    );
    for (index, (curve, &bytes)) in curves.iter().zip(&peaks).enumerate() {
        let RGBColor(r, g, b) = curve_color(index);
        let y = 10.0 + row * index as f64;
        let ratio = bytes as f64 / peak_live.max(1) as f64;
        // The figure right of the bar (the axis leaves room for it), clear
        // of the black line of the peak live bytes.
        let (vx, anchor, fill) = (x(bytes as f64) + 6.0, "start", "black");
        svg += &format!(
            "<g><title>{name}: peak {human} ({bytes} B), {ratio:.3} x the peak live bytes</title>\
             <text x=\"{tx}\" y=\"{ty}\" text-anchor=\"end\">{name}</text>\
             <rect x=\"{left}\" y=\"{y}\" width=\"{w:.1}\" height=\"{h}\" fill=\"rgb({r},{g},{b})\"/>\
             <text x=\"{vx:.1}\" y=\"{ty}\" text-anchor=\"{anchor}\" fill=\"{fill}\">{human} ({ratio:.3})</text></g>",
            name = escape(curve.name),
            human = human(bytes),
            tx = left - 8.0,
            ty = y + 16.0,
            w = (x(bytes as f64) - left).max(1.0),
            h = row - 6.0,
        );
    }
    let bottom = 10.0 + row * curves.len() as f64;
    let live = x(peak_live as f64);
    svg += &format!(
        "<line x1=\"{live:.1}\" x2=\"{live:.1}\" y1=\"4\" y2=\"{bottom}\" stroke=\"black\" \
         stroke-width=\"2\"><title>peak live bytes: {}</title></line>\
         <line x1=\"{left}\" x2=\"{}\" y1=\"{bottom}\" y2=\"{bottom}\" stroke=\"black\"/>",
        human(peak_live),
        left + width
    );
    for tick in 0..=4 {
        let bytes = low + (high - low) * f64::from(tick) / 4.0;
        svg += &format!(
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x(bytes),
            bottom + 20.0,
            human(bytes as u64)
        );
    }
    svg += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">peak bytes mapped (the axis starts at \
         0; the black line is the peak live bytes)</text></svg>\n",
        left + width / 2.0,
        bottom + 40.0,
    );
    svg
}

/// The figures table of one trace, grouped as the text table is: what the
/// trace's program can use, then the rest for comparison.
pub(super) fn figures_table(summary: &TraceSummary) -> String {
    let mut html = String::from("<table><tr>");
    for column in COLUMNS {
        html += &format!(
            "<th title=\"{}\">{}</th>",
            escape(column.means),
            escape(column.header)
        );
    }
    html += "</tr>\n";
    let cells = |cells: &[String]| {
        let mut row = String::from("<tr>");
        for cell in cells {
            row += &format!("<td>{}</td>", escape(cell));
        }
        row + "</tr>\n"
    };
    let group = |title: String| {
        format!(
            "<tr><td class=\"group\" colspan=\"{}\">{}</td></tr>\n",
            COLUMNS.len(),
            escape(&title)
        )
    };
    let policy_cells = |policy: &PolicySummary| {
        let mut row = policy.cells().to_vec();
        row.push(policy.pick.map_or("", |pick| pick.how).to_string());
        cells(&row)
    };
    let (mut usable, models): (Vec<&PolicySummary>, Vec<&PolicySummary>) = summary
        .policies
        .iter()
        .partition(|policy| policy.pick.is_some());
    usable.sort_by_key(|policy| policy.pick.is_some_and(|pick| pick.cudamem));
    if !usable.is_empty() || summary.pytorch_recorded.is_some() {
        html += &group(format!(
            "What {} program can use (none moves a block)",
            summary.framework.a_program()
        ));
    }
    if let Some(recorded) = &summary.pytorch_recorded {
        let mut row = vec![
            recorded.name.to_string(),
            "no".to_string(),
            human(recorded.peak_reserved_bytes),
            format!("{:.3}", recorded.footprint_ratio),
        ];
        row.resize(COLUMNS.len() - 1, "-".to_string());
        row.push(recorded.ran());
        html += &cells(&row);
    }
    for policy in usable {
        html += &policy_cells(policy);
    }
    if !models.is_empty() {
        html += &group(format!(
            "For comparison: research models, libraries {} program cannot pick",
            summary.framework.a_program()
        ));
    }
    for policy in models {
        html += &policy_cells(policy);
    }
    html + "</table>\n"
}

/// What every column of the figures tables means.
pub(super) fn columns_section() -> String {
    let mut html = String::from("<h2>The columns</h2>\n<dl>\n");
    for column in COLUMNS {
        html += &format!(
            "<dt>{}</dt><dd>{}</dd>\n",
            escape(column.header),
            escape(column.means)
        );
    }
    html + &format!("</dl>\n<p>* {}.</p>\n", escape(DRIVER_TIME_NOTE))
}
