//! The HTML replay report: per trace, the figures table, footprint against
//! live bytes over time, and each policy's memory map, all as inline SVG
//! drawn with plotters.

use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::byte_size::human;
use crate::memory_map::Raster;
use crate::policy::PolicyName;
use crate::replay::{Outcome, Placement};
use crate::summary::{FOOTPRINT_RULE, TraceSummary};
use crate::trace::Trace;

/// Memory-map raster: time buckets by address buckets. 240 x 120 cells at
/// most, merged into runs, keeps a policy's map well under 1 MB.
const MAP_COLUMNS: usize = 240;
const MAP_ROWS: usize = 120;
/// Points of the live-bytes curve (each the peak of its stretch of events).
const CURVE_POINTS: usize = 1000;

/// One policy color per [`PolicyName::ALL`] entry, colorblind-safe (Okabe-Ito).
const POLICY_COLORS: [RGBColor; 7] = [
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 158, 115),
    RGBColor(213, 94, 0),
    RGBColor(0, 114, 178),
    RGBColor(204, 121, 167),
    RGBColor(120, 120, 120),
];

/// Occupancy shades of the memory map, from a sliver used to full.
const OCCUPANCY_SHADES: [RGBColor; 4] = [
    RGBColor(198, 219, 239),
    RGBColor(107, 174, 214),
    RGBColor(33, 113, 181),
    RGBColor(8, 48, 107),
];

/// What the report needs of one replayed trace.
pub struct TraceReport<'a> {
    /// The trace.
    pub trace: &'a Trace,
    /// Its figures.
    pub summary: &'a TraceSummary,
    /// Each policy's outcome and placement.
    pub policies: Vec<(&'a Outcome, &'a Placement)>,
}

/// A whole HTML page around `body` (already HTML).
pub fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\n\
         <style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}}\
         table{{border-collapse:collapse}}td,th{{padding:2px 10px;text-align:right;border-bottom:1px solid #ddd}}\
         th:first-child,td:first-child{{text-align:left}}svg{{display:block;margin:1em 0}}</style>\n\
         </head><body>\n<h1>{title}</h1>\n{body}</body></html>\n",
        title = escape(title)
    )
}

/// Escape text for HTML.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The replay report for `traces`.
pub fn replay_page(traces: &[TraceReport<'_>]) -> Result<String> {
    let mut body = format!("<p>{}</p>\n", escape(FOOTPRINT_RULE));
    for report in traces {
        body += &trace_section(report)?;
    }
    Ok(page("cudamem replay", &body))
}

fn trace_section(report: &TraceReport<'_>) -> Result<String> {
    let summary = report.summary;
    let mut html = format!(
        "<h2>{}</h2>\n<p>{} events, {} allocations, peak live {} ({} bytes){}</p>\n",
        escape(&summary.trace),
        summary.events,
        report.trace.allocations,
        human(summary.peak_live_bytes),
        summary.peak_live_bytes,
        summary
            .capacity_bytes
            .map(|bytes| format!(", fixed arena of {}", human(bytes)))
            .unwrap_or_default()
    );
    html += "<table><tr><th>policy</th><th>peak footprint</th><th>footprint / live</th>\
             <th>compaction moved</th><th>failed allocations</th><th>ns per op</th></tr>\n";
    for policy in &summary.policies {
        html += &format!(
            "<tr><td>{}</td><td>{}</td><td>{:.3}</td><td>{}</td><td>{}</td><td>{:.0}</td></tr>\n",
            policy.name,
            human(policy.peak_footprint_bytes),
            policy.footprint_ratio,
            human(policy.compaction_bytes_moved),
            policy.failed_allocations,
            policy.ns_per_op
        );
    }
    if let Some(recorded) = &summary.pytorch_recorded {
        html += &format!(
            "<tr><td>{}</td><td>{}</td><td>{:.3}</td><td>-</td><td>-</td><td>-</td></tr>\n",
            recorded.name,
            human(recorded.peak_reserved_bytes),
            recorded.footprint_ratio
        );
    }
    html += "</table>\n";
    if summary.unknown_frees > 0 {
        html += &format!(
            "<p>{} frees of blocks allocated before the trace began: taken as live from the first event.</p>\n",
            summary.unknown_frees
        );
    }

    let span = report
        .policies
        .iter()
        .map(|(outcome, placement)| {
            let highest = placement
                .mapped
                .iter()
                .map(|&(_, bytes)| bytes)
                .max()
                .unwrap_or(0);
            highest.max(outcome.peak_footprint_bytes)
        })
        .max()
        .unwrap_or(0)
        .max(summary.peak_live_bytes)
        .max(
            summary
                .pytorch_recorded
                .as_ref()
                .map_or(0, |recorded| recorded.peak_reserved_bytes),
        )
        .max(1);
    html += "<h3>Footprint and live bytes over the trace</h3>\n";
    html += &footprint_chart(report, span)?;

    let lifetimes = report.trace.lifetimes();
    let mut sizes = vec![0u64; report.trace.allocations as usize];
    for event in &report.trace.events {
        if let crate::trace::Event::Alloc { id, size } = *event {
            sizes[id as usize] = size;
        }
    }
    for (outcome, placement) in &report.policies {
        let raster = Raster::new(
            placement,
            &lifetimes,
            &sizes,
            report.trace.events.len(),
            span,
            MAP_COLUMNS,
            MAP_ROWS,
        );
        html += &format!(
            "<h3>Memory map: {}</h3>\n<p>Address (y) over event index (x); darker is fuller. \
             The red line is what the policy had mapped.</p>\n",
            outcome.policy.as_str()
        );
        html += &memory_map_chart(&raster, placement, report.trace.events.len(), span)?;
    }
    Ok(html)
}

/// The unit an axis of `span` bytes reads best in.
fn axis_unit(span: u64) -> (f64, &'static str) {
    if span >= 1 << 30 {
        ((1u64 << 30) as f64, "GiB")
    } else {
        ((1u64 << 20) as f64, "MiB")
    }
}

/// A step curve of mapped bytes, ending at event `events`.
fn mapped_steps(placement: &Placement, events: usize, unit: f64) -> Vec<(f64, f64)> {
    steps(&placement.mapped, events, unit)
}

/// A step curve of (event from which it holds, bytes), ending at `events`.
fn steps(mapped: &[(usize, u64)], events: usize, unit: f64) -> Vec<(f64, f64)> {
    let mut points = Vec::with_capacity(mapped.len() * 2 + 1);
    let mut last = 0.0;
    for &(event, bytes) in mapped {
        let y = bytes as f64 / unit;
        if !points.is_empty() {
            points.push((event as f64, last));
        }
        points.push((event as f64, y));
        last = y;
    }
    points.push((events as f64, last));
    points
}

fn footprint_chart(report: &TraceReport<'_>, span: u64) -> Result<String> {
    let events = report.trace.events.len().max(1);
    let (unit, unit_name) = axis_unit(span);
    let live = report.trace.live_bytes_curve();
    let stride = live.len().div_ceil(CURVE_POINTS).max(1);
    let live_points: Vec<(f64, f64)> = live
        .chunks(stride)
        .enumerate()
        .map(|(chunk, values)| {
            let peak = values.iter().copied().max().unwrap_or(0);
            ((chunk * stride) as f64, peak as f64 / unit)
        })
        .collect();

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 420)).into_drawing_area();
        root.fill(&WHITE)?;
        let y_desc = format!("bytes ({unit_name})");
        let mut chart = chart_on(&root, events, span as f64 * 1.05 / unit, &y_desc)?;
        for (outcome, placement) in &report.policies {
            let index = PolicyName::ALL
                .iter()
                .position(|&name| name == outcome.policy)
                .unwrap_or(0);
            let color = POLICY_COLORS[index % POLICY_COLORS.len()];
            chart
                .draw_series(LineSeries::new(
                    mapped_steps(placement, events, unit),
                    color.stroke_width(2),
                ))?
                .label(outcome.policy.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        if let Some(recorded) = &report.trace.recorded {
            let color = RGBColor(200, 30, 30);
            chart
                .draw_series(LineSeries::new(
                    steps(&recorded.reserved, events, unit),
                    color.stroke_width(2),
                ))?
                .label(crate::summary::RECORDED_ROW)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .draw_series(LineSeries::new(live_points, BLACK.stroke_width(1)))?
            .label("live bytes")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
    }
    Ok(svg)
}

type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

fn chart_on<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    events: usize,
    y_max: f64,
    y_desc: &str,
) -> Result<Chart<'a, 'b>> {
    let mut chart = ChartBuilder::on(root)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..events as f64, 0f64..y_max)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc("event index")
        .y_desc(y_desc)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    Ok(chart)
}

fn memory_map_chart(
    raster: &Raster,
    placement: &Placement,
    events: usize,
    span: u64,
) -> Result<String> {
    let (unit, unit_name) = axis_unit(span);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 380)).into_drawing_area();
        root.fill(&WHITE)?;
        let y_desc = format!("address ({unit_name})");
        let mut chart = chart_on(&root, events.max(1), span as f64 / unit, &y_desc)?;
        let mut cells = Vec::new();
        for (row, occupancy) in raster.cells.iter().enumerate() {
            let y0 = row as f64 * raster.bytes_per_row / unit;
            let y1 = (row + 1) as f64 * raster.bytes_per_row / unit;
            let mut column = 0;
            while column < raster.columns {
                let shade = shade_of(occupancy[column]);
                let start = column;
                while column < raster.columns && shade_of(occupancy[column]) == shade {
                    column += 1;
                }
                if let Some(shade) = shade {
                    let x0 = start as f64 * raster.events_per_column;
                    let x1 = column as f64 * raster.events_per_column;
                    cells.push(Rectangle::new(
                        [(x0, y0), (x1, y1)],
                        OCCUPANCY_SHADES[shade].filled(),
                    ));
                }
            }
        }
        chart.draw_series(cells)?;
        chart.draw_series(LineSeries::new(
            mapped_steps(placement, events, unit),
            RED.stroke_width(2),
        ))?;
        root.present()?;
    }
    Ok(svg)
}

/// Which shade a cell gets; `None` for an empty one.
fn shade_of(occupancy: f64) -> Option<usize> {
    if occupancy < 0.01 {
        None
    } else {
        Some(
            ((occupancy * OCCUPANCY_SHADES.len() as f64).ceil() as usize)
                .clamp(1, OCCUPANCY_SHADES.len())
                - 1,
        )
    }
}
