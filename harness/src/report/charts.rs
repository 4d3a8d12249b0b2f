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
    RGBColor(140, 86, 30),
    RGBColor(68, 170, 153),
];

/// The live bytes' curve.
pub(super) const LIVE_COLOR: RGBColor = BLACK;

/// The memory maps' line of mapped bytes: red, which no curve uses.
pub(super) const MAPPED_COLOR: RGBColor = RGBColor(220, 20, 60);

/// Axis labels' and descriptions' font sizes as plotters takes them: its
/// SVG text comes out at about 0.8 of the size, 12.9 and 14.5 pixels.
const LABEL_PX: u32 = 16;
const DESC_PX: u32 = 18;

/// The x axis of a trace's charts: seconds since its first record where
/// the trace carries time, else the event's index.
#[derive(Debug, Clone)]
pub(super) struct TimeAxis {
    /// (event index, seconds since the first record), both rising.
    samples: Vec<(f64, f64)>,
    events: usize,
}

impl TimeAxis {
    /// The axis of a trace of `events` events whose [`Trace::clock`] is
    /// `clock` (times that run backwards are held, so the axis only rises).
    ///
    /// [`Trace::clock`]: trace::Trace::clock
    pub(super) fn new(clock: &[(usize, u64)], events: usize) -> Self {
        let first = clock.first().map_or(0, |&(_, ns)| ns);
        let mut latest = 0.0f64;
        let samples = clock
            .iter()
            .map(|&(event, ns)| {
                latest = latest.max(ns.saturating_sub(first) as f64 / 1e9);
                (event as f64, latest)
            })
            .collect();
        Self { samples, events }
    }

    /// Whether the axis is time.
    pub(super) fn is_time(&self) -> bool {
        self.samples.len() > 1
    }

    /// Where event `event` (fractional: a point between two) lies on it.
    pub(super) fn x(&self, event: f64) -> f64 {
        if !self.is_time() {
            return event;
        }
        let next = self.samples.partition_point(|&(at, _)| at <= event);
        match (
            next.checked_sub(1).map(|i| self.samples[i]),
            self.samples.get(next),
        ) {
            (None, _) => self.samples[0].1,
            (Some((_, at)), None) => at,
            (Some((from, t0)), Some(&(to, t1))) => t0 + (event - from) / (to - from) * (t1 - t0),
        }
    }

    /// The axis's end: where the last event ends.
    pub(super) fn end(&self) -> f64 {
        if self.is_time() {
            self.samples.last().map_or(0.0, |&(_, t)| t).max(1e-9)
        } else {
            self.events.max(1) as f64
        }
    }

    /// Its description under the chart.
    pub(super) fn desc(&self) -> &'static str {
        if self.is_time() {
            "time since the first record (s)"
        } else {
            "event (each allocate or free, in order; the trace records no time)"
        }
    }
}

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

/// A step curve of mapped bytes, ending at event `events`, on `axis`.
fn mapped_steps(
    mapped: &[(usize, u64)],
    events: usize,
    unit: f64,
    axis: &TimeAxis,
) -> Vec<(f64, f64)> {
    let mut points = Vec::with_capacity(mapped.len() * 2 + 1);
    let mut last = 0.0;
    for &(event, bytes) in mapped {
        let y = bytes as f64 / unit;
        let x = axis.x(event as f64);
        if !points.is_empty() {
            points.push((x, last));
        }
        points.push((x, y));
        last = y;
    }
    points.push((axis.x(events as f64), last));
    points
}

/// The peak of each stretch of `values`, at most [`CURVE_POINTS`] points,
/// each at its own event on `axis` (not the stretch's start: on a time
/// axis a stretch of a few events can span much of the run).
fn downsample(values: &[f64], axis: &TimeAxis) -> Vec<(f64, f64)> {
    let stride = values.len().div_ceil(CURVE_POINTS).max(1);
    values
        .chunks(stride)
        .enumerate()
        .map(|(chunk, values)| {
            let (at, peak) =
                values
                    .iter()
                    .copied()
                    .enumerate()
                    .fold((0, f64::MIN), |best, (at, value)| {
                        if value > best.1 { (at, value) } else { best }
                    });
            (axis.x((chunk * stride + at) as f64), peak)
        })
        .collect()
}

pub(super) fn footprint_chart(
    curves: &[FootprintCurve<'_>],
    live: &[u64],
    span: u64,
    axis: &TimeAxis,
) -> Result<(String, PlotFrame, String)> {
    let events = live.len().max(1);
    let (unit, unit_name) = axis_unit(span);
    let live: Vec<f64> = live.iter().map(|&bytes| bytes as f64 / unit).collect();
    let mut svg = String::new();
    let frame;
    // Each curve's points for the page's script: its name and (x, bytes).
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 420)).into_drawing_area();
        root.fill(&WHITE)?;
        let y_desc = format!("bytes ({unit_name})");
        let y_max = span as f64 * 1.05 / unit;
        let mut chart = chart_on(&root, axis, 0.0, y_max, &y_desc)?;
        frame = PlotFrame::of(&chart, axis, y_max, unit);
        for (index, curve) in curves.iter().enumerate() {
            let points = mapped_steps(curve.mapped, events, unit, axis);
            chart.draw_series(LineSeries::new(
                points.iter().copied(),
                curve_color(index).stroke_width(2),
            ))?;
            series.push((curve.name.to_owned(), points));
        }
        let live = downsample(&live, axis);
        chart.draw_series(LineSeries::new(
            live.iter().copied(),
            LIVE_COLOR.stroke_width(1),
        ))?;
        series.push(("live bytes".to_owned(), live));
        root.present()?;
    }
    Ok((svg, frame, series_json(&series, unit)))
}

/// `series` as JSON for the page's script: `[[name, [[x, bytes], ...]], ...]`,
/// each curve thinned to at most [`HOVER_POINTS`] points.
fn series_json(series: &[(String, Vec<(f64, f64)>)], unit: f64) -> String {
    let curves: Vec<String> = series
        .iter()
        .map(|(name, points)| {
            let stride = points.len().div_ceil(HOVER_POINTS).max(1);
            let points: Vec<String> = points
                .iter()
                .step_by(stride)
                .map(|&(x, y)| format!("[{x:.6},{:.0}]", y * unit))
                .collect();
            format!(
                "[{},[{}]]",
                serde_json::to_string(name).unwrap_or_default(),
                points.join(",")
            )
        })
        .collect();
    format!("[{}]", curves.join(","))
}

/// Points of a curve the footprint chart's pointer reads.
const HOVER_POINTS: usize = 2000;

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
    axis: &TimeAxis,
) -> Result<String> {
    let series: Vec<Vec<(f64, f64)>> = curves
        .iter()
        .map(|curve| downsample(&overhead_percent(curve.mapped, live, peak_live), axis))
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
            axis,
            low - if low < 0.0 { margin } else { 0.0 },
            high + margin,
            "% of peak live bytes",
        )?;
        chart.draw_series(LineSeries::new(
            [(0.0, 0.0), (axis.end(), 0.0)],
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
    axis: &TimeAxis,
    y_min: f64,
    y_max: f64,
    y_desc: &str,
) -> Result<Chart<'a, 'b>> {
    let mut chart = ChartBuilder::on(root)
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(78)
        .build_cartesian_2d(0f64..axis.end(), y_min..y_max)?;
    let time = axis.is_time();
    chart
        .configure_mesh()
        .disable_mesh()
        .label_style(("sans-serif", LABEL_PX))
        .axis_desc_style(("sans-serif", DESC_PX))
        .x_desc(axis.desc())
        .y_desc(y_desc)
        .x_label_formatter(&|x| {
            if time {
                format!("{x:.2}")
            } else {
                format!("{x:.0}")
            }
        })
        .draw()?;
    Ok(chart)
}

/// Where a chart's plotting area lies: its pixels and the data ranges they
/// show, for the page's script to read a pointer's position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct PlotFrame {
    /// Left and right pixel.
    pub px: (i32, i32),
    /// Top and bottom pixel.
    pub py: (i32, i32),
    /// The x range shown, axis units.
    pub x: (f64, f64),
    /// The y range shown, in `unit` bytes.
    pub y: (f64, f64),
    /// Bytes per y unit.
    pub unit: f64,
}

impl PlotFrame {
    /// Where `chart` draws `axis` against 0 to `y_max` units of `unit` bytes.
    fn of(chart: &Chart<'_, '_>, axis: &TimeAxis, y_max: f64, unit: f64) -> Self {
        let (px, py) = chart.plotting_area().get_pixel_range();
        PlotFrame {
            px: (px.start, px.end),
            py: (py.start, py.end),
            x: (0.0, axis.end()),
            y: (0.0, y_max),
            unit,
        }
    }
}

pub(super) fn memory_map_chart(
    raster: &Raster,
    placement: &Placement,
    events: usize,
    span: u64,
    axis: &TimeAxis,
    address_desc: &str,
) -> Result<(String, PlotFrame)> {
    let (unit, unit_name) = axis_unit(span);
    let mut svg = String::new();
    let frame;
    {
        let root = SVGBackend::with_string(&mut svg, (960, 400)).into_drawing_area();
        root.fill(&WHITE)?;
        let y_desc = format!("{address_desc} ({unit_name})");
        let y_max = span as f64 / unit;
        let mut chart = chart_on(&root, axis, 0.0, y_max, &y_desc)?;
        frame = PlotFrame::of(&chart, axis, y_max, unit);
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
                    let width = axis.end() / raster.columns as f64;
                    let x0 = start as f64 * width;
                    let x1 = column as f64 * width;
                    cells.push(Rectangle::new(
                        [(x0, y0), (x1, y1)],
                        OCCUPANCY_SHADES[shade].filled(),
                    ));
                }
            }
        }
        chart.draw_series(cells)?;
        chart.draw_series(LineSeries::new(
            mapped_steps(&placement.mapped, events, unit, axis),
            MAPPED_COLOR.stroke_width(2),
        ))?;
        root.present()?;
    }
    Ok((svg, frame))
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
        // Red is the maps' mapped line and nothing else's.
        let reddish = |RGBColor(r, g, b): RGBColor| r >= 180 && g < 80 && b < 80;
        assert!(reddish(MAPPED_COLOR));
        assert!(CURVE_COLORS.iter().all(|&color| !reddish(color)));
    }

    #[test]
    fn the_axis_is_time_where_the_trace_has_it() {
        let axis = TimeAxis::new(
            &[(0, 5_000_000_000), (10, 6_000_000_000), (20, 5_500_000_000)],
            30,
        );
        assert!(axis.is_time());
        assert_eq!(axis.x(0.0), 0.0);
        assert!((axis.x(5.0) - 0.5).abs() < 1e-12);
        // A clock that runs back is held.
        assert_eq!(axis.x(25.0), 1.0);
        assert_eq!(axis.end(), 1.0);
        let events = TimeAxis::new(&[], 30);
        assert!(!events.is_time());
        assert_eq!((events.x(7.0), events.end()), (7.0, 30.0));
    }
}
