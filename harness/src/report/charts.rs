//! The replay report's charts as inline SVG drawn with plotters: footprint
//! and overhead curves over a trace, and each policy's memory map.

use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::replay::Placement;
use crate::report::FootprintCurve;
use crate::report::memory_map::Raster;

/// Points of the live-bytes curve (each the peak of its stretch of events).
const CURVE_POINTS: usize = 1000;

/// Curve colors, given in order to the footprint curves (policies in report
/// order, then any extra curve such as a recorded allocator): Okabe-Ito's
/// colorblind-safe set without its black, which is the live bytes', then a
/// purple, an olive and a wine, all far from black.
pub(super) const CURVE_COLORS: [RGBColor; 11] = [
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 158, 115),
    RGBColor(213, 94, 0),
    RGBColor(0, 114, 178),
    RGBColor(204, 121, 167),
    RGBColor(117, 72, 166),
    RGBColor(153, 153, 51),
    RGBColor(136, 34, 85),
    RGBColor(200, 30, 30),
    RGBColor(68, 170, 153),
];

/// The live bytes' curve.
pub(super) const LIVE_COLOR: RGBColor = BLACK;

/// The memory maps' line of mapped bytes.
pub(super) const MAPPED_COLOR: RGBColor = RED;

/// Occupancy shades of the memory map, from a sliver used to full.
pub(super) const OCCUPANCY_SHADES: [RGBColor; 4] = [
    RGBColor(198, 219, 239),
    RGBColor(107, 174, 214),
    RGBColor(33, 113, 181),
    RGBColor(8, 48, 107),
];
/// The color of the footprint curve at `index` in legend order.
pub(super) fn curve_color(index: usize) -> RGBColor {
    CURVE_COLORS[index % CURVE_COLORS.len()]
}

/// The unit an axis of `span` bytes reads best in.
fn axis_unit(span: u64) -> (f64, &'static str) {
    if span >= memcore::bytes::GIB {
        (memcore::bytes::GIB as f64, "GiB")
    } else {
        (memcore::bytes::MIB as f64, "MiB")
    }
}

/// A step curve of mapped bytes, ending at event `events`.
fn mapped_steps(mapped: &[(usize, u64)], events: usize, unit: f64) -> Vec<(f64, f64)> {
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

/// The peak of each stretch of `values`, at most [`CURVE_POINTS`] points,
/// each at the event index its stretch starts.
fn downsample(values: &[f64]) -> Vec<(f64, f64)> {
    let stride = values.len().div_ceil(CURVE_POINTS).max(1);
    values
        .chunks(stride)
        .enumerate()
        .map(|(chunk, values)| {
            let peak = values.iter().copied().fold(f64::MIN, f64::max);
            ((chunk * stride) as f64, peak)
        })
        .collect()
}

pub(super) fn footprint_chart(
    curves: &[FootprintCurve<'_>],
    live: &[u64],
    span: u64,
) -> Result<String> {
    let events = live.len().max(1);
    let (unit, unit_name) = axis_unit(span);
    let live: Vec<f64> = live.iter().map(|&bytes| bytes as f64 / unit).collect();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 420)).into_drawing_area();
        root.fill(&WHITE)?;
        let y_desc = format!("bytes ({unit_name})");
        let mut chart = chart_on(&root, events, 0.0, span as f64 * 1.05 / unit, &y_desc)?;
        for (index, curve) in curves.iter().enumerate() {
            chart.draw_series(LineSeries::new(
                mapped_steps(curve.mapped, events, unit),
                curve_color(index).stroke_width(2),
            ))?;
        }
        chart.draw_series(LineSeries::new(
            downsample(&live),
            LIVE_COLOR.stroke_width(1),
        ))?;
        root.present()?;
    }
    Ok(svg)
}

/// For each event, bytes `mapped` above the highest live bytes up to it, in
/// percent of `peak_live` bytes.
fn overhead_percent(mapped: &[(usize, u64)], live: &[u64], peak_live: u64) -> Vec<f64> {
    let mut steps = mapped.iter().peekable();
    let mut mapped_now = 0u64;
    let mut live_high = 0u64;
    live.iter()
        .enumerate()
        .map(|(event, &bytes)| {
            while let Some(&&(from, to)) = steps.peek() {
                if from > event {
                    break;
                }
                mapped_now = to;
                steps.next();
            }
            live_high = live_high.max(bytes);
            (mapped_now as f64 - live_high as f64) * 100.0 / peak_live.max(1) as f64
        })
        .collect()
}

pub(super) fn overhead_chart(
    curves: &[FootprintCurve<'_>],
    live: &[u64],
    peak_live: u64,
) -> Result<String> {
    let events = live.len().max(1);
    let series: Vec<Vec<(f64, f64)>> = curves
        .iter()
        .map(|curve| downsample(&overhead_percent(curve.mapped, live, peak_live)))
        .collect();
    let values = || series.iter().flatten().map(|&(_, y)| y);
    let high = values().fold(0.0f64, f64::max);
    let low = values().fold(0.0f64, f64::min);
    let margin = ((high - low) * 0.08).max(0.05);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 360)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = chart_on(
            &root,
            events,
            low - if low < 0.0 { margin } else { 0.0 },
            high + margin,
            "% of peak live bytes",
        )?;
        chart.draw_series(LineSeries::new(
            [(0.0, 0.0), (events as f64, 0.0)],
            LIVE_COLOR.stroke_width(1),
        ))?;
        for (index, points) in series.into_iter().enumerate() {
            chart.draw_series(LineSeries::new(points, curve_color(index).stroke_width(2)))?;
        }
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
    y_min: f64,
    y_max: f64,
    y_desc: &str,
) -> Result<Chart<'a, 'b>> {
    let mut chart = ChartBuilder::on(root)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..events as f64, y_min..y_max)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc("event index")
        .y_desc(y_desc)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    Ok(chart)
}

pub(super) fn memory_map_chart(
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
        let mut chart = chart_on(&root, events.max(1), 0.0, span as f64 / unit, &y_desc)?;
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
            mapped_steps(&placement.mapped, events, unit),
            MAPPED_COLOR.stroke_width(2),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overhead_is_what_was_mapped_above_the_highest_live_bytes_so_far() {
        let mapped = [(0, 100), (3, 200)];
        let live = [50, 100, 80, 150, 100];
        let percent = overhead_percent(&mapped, &live, 150);
        let expected = [100.0 / 3.0, 0.0, 0.0, 100.0 / 3.0, 100.0 / 3.0];
        assert_eq!(percent.len(), expected.len());
        for (got, want) in percent.iter().zip(expected) {
            assert!((got - want).abs() < 1e-9, "{percent:?}");
        }
    }

    /// A curve must not read as a grey beside the black live-bytes line.
    #[test]
    fn curve_colors_are_distinct_and_none_looks_like_the_live_line() {
        let chroma = |RGBColor(r, g, b): RGBColor| r.max(g).max(b) - r.min(g).min(b);
        assert_eq!(chroma(LIVE_COLOR), 0);
        for (index, &color) in CURVE_COLORS.iter().enumerate() {
            assert!(
                chroma(color) >= 60,
                "curve color {index} is greyish: {color:?}"
            );
            for &other in &CURVE_COLORS[index + 1..] {
                assert_ne!(color, other);
            }
        }
        assert_ne!(curve_color(0), curve_color(crate::replay::POLICIES.len()));
    }
}
