//! The HTML replay report: per trace, the figures table, footprint against
//! live bytes over time, and each policy's memory map, all as inline SVG
//! (charts.rs draws them).

mod charts;
pub mod conclusion;
mod figures;
pub mod memory_map;
mod script;
pub mod snapshot_map;
pub mod summary;

use anyhow::Result;
use memcore::bytes::human;
use plotters::style::RGBColor;

use crate::replay::policy::FOOTPRINT_RULE;
use crate::replay::{Outcome, Placement, PolicySpec, Settings};
use crate::report::charts::{
    LIVE_COLOR, MAPPED_COLOR, OCCUPANCY_SHADES, TimeAxis, curve_color, footprint_chart,
    memory_map_chart, overhead_chart,
};
use crate::report::figures::{columns_section, figures_table, peak_bars};
use crate::report::memory_map::{AddressBands, Raster};
use crate::report::script::{
    CURVES_HINT, MAP_HINT, MAP_HINT_STACKS, MAP_SCRIPT, hover_blocks, hover_stacks,
};
use crate::report::summary::TraceSummary;
use trace::Trace;

/// Memory-map raster: time buckets by address buckets. 240 x 120 cells at
/// most, merged into runs, keeps a policy's map well under 1 MB.
const MAP_COLUMNS: usize = 240;
const MAP_ROWS: usize = 120;
/// What the report needs of one replayed trace.
pub struct TraceReport<'a> {
    /// The trace.
    pub trace: &'a Trace,
    /// Its figures.
    pub summary: &'a TraceSummary,
    /// Each policy's outcome and placement.
    pub policies: Vec<(&'a Outcome, &'a Placement)>,
    /// More footprint curves drawn beside the policies' (e.g. what a
    /// recorded allocator had reserved), in legend order after them.
    pub extra_curves: Vec<FootprintCurve<'a>>,
}

/// A named curve of bytes mapped over a trace.
#[derive(Debug, Clone, Copy)]
pub struct FootprintCurve<'a> {
    /// Its name in the legend.
    pub name: &'a str,
    /// Bytes mapped, as (event index from which it holds, bytes), in event
    /// order, as [`Placement::mapped`].
    pub mapped: &'a [(usize, u64)],
}

/// A whole HTML page around `body` (already HTML).
pub fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\n\
         <style>body{{font-family:sans-serif;font-size:16px;max-width:1180px;margin:2em auto;color:#222}}\
         .conclusion{{background:#eef6ee;border-left:5px solid #0a7f3f;padding:.6em 1em;margin:1em 0}}\
         table td.group{{text-align:left;font-weight:bold;background:#f4f4f4;font-family:sans-serif;word-break:normal}}dt{{font-weight:bold}}\
         .map svg,.curves svg{{cursor:crosshair;max-width:100%;height:auto}}\
         .tip{{font-size:14px;min-height:1.4em;color:#333;margin:0 0 .3em 80px;white-space:pre-line}}\
         .maps[data-stacks] .map .tip{{min-height:7.2em}}\
         table{{border-collapse:collapse;font-size:14px}}td,th{{padding:2px 8px;text-align:right;border-bottom:1px solid #ddd;white-space:nowrap}}\
         td:last-child{{text-align:left;white-space:normal;word-break:normal;overflow-wrap:anywhere;font-family:monospace}}th{{vertical-align:bottom}}th:last-child{{text-align:left}}\
         th:first-child,td:first-child{{text-align:left}}svg{{display:block;margin:1em 0 .3em}}\
         .legend{{margin:0 0 1.5em 70px;line-height:1.8}}.legend span{{display:inline-block;margin-right:1.4em;white-space:nowrap}}\
         .legend i{{display:inline-block;width:24px;height:3px;vertical-align:middle;margin-right:.4em}}\
         .legend i.box{{width:14px;height:14px;border:1px solid #999}}</style>\n\
         </head><body>\n<h1>{title}</h1>\n{body}<script>{MAP_SCRIPT}</script></body></html>\n",
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

/// How a legend entry shows its color.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swatch {
    /// A line, for a curve.
    Line,
    /// A filled box, for an area.
    Box,
}

/// A legend as HTML, laid out by the browser under its chart so it never
/// covers the data or gets cut off by the chart's edge.
pub fn legend(entries: &[(String, RGBColor, Swatch)]) -> String {
    let mut html = String::from("<div class=\"legend\">");
    for (name, RGBColor(r, g, b), swatch) in entries {
        let class = match swatch {
            Swatch::Line => "",
            Swatch::Box => " class=\"box\"",
        };
        html += &format!(
            "<span><i{class} style=\"background:rgb({r},{g},{b})\"></i>{}</span>",
            escape(name)
        );
    }
    html + "</div>\n"
}

/// What each policy of the replay is and what compaction costs, for the
/// top of the page.
fn policies_section(policies: &[&PolicySpec], settings: &Settings) -> String {
    let mut html = String::from("<h2>The policies</h2>\n<ul>\n");
    for spec in policies {
        html += &format!(
            "<li><b>{}</b>: {}</li>\n",
            spec.name,
            escape(&spec.summary(settings))
        );
    }
    html += "</ul>\n<p><b>Moved bytes</b> (compaction moved): the bytes compaction copied, the sum of \
             the sizes of the blocks it relocated to close gaps. Each moved byte is read and written \
             once by a device-to-device copy, so a compaction costs time in proportion to its moved \
             bytes (BENCHMARKS.md measures the copy kernels on an H200), and a block cannot be used \
             while it moves. The policies that never move a block show 0 B and pay for their gaps in \
             footprint instead.</p>\n";
    html
}

/// The replay report for `traces`, whose policies were built from
/// `settings`.
pub fn replay_page(traces: &[TraceReport<'_>], settings: &Settings) -> Result<String> {
    let mut policies: Vec<&PolicySpec> = Vec::new();
    for (outcome, _) in traces.iter().flat_map(|report| &report.policies) {
        if !policies.contains(&outcome.policy) {
            policies.push(outcome.policy);
        }
    }
    let mut body =
        String::from("<div class=\"conclusion\" id=\"conclusion\"><h2>What you can do</h2>\n");
    for report in traces {
        body += &format!(
            "<p><b>{}</b>: {}</p>\n",
            escape(&report.summary.trace),
            escape(&report.summary.conclusion.join(" "))
        );
    }
    body += "</div>\n";
    body += &format!("<p>{}</p>\n", escape(FOOTPRINT_RULE));
    body += &policies_section(&policies, settings);
    body += &columns_section();
    for report in traces {
        body += &trace_section(report)?;
    }
    Ok(page("cudamem replay", &body))
}

fn trace_section(report: &TraceReport<'_>) -> Result<String> {
    let summary = report.summary;
    let mut html = format!(
        "<h2>{}</h2>\n<p>{} events, {} allocations, peak live {}{}</p>\n",
        escape(&summary.trace),
        summary.events,
        report.trace.allocations,
        memcore::bytes::exact(summary.peak_live_bytes),
        summary
            .capacity_bytes
            .map(|bytes| format!(", fixed arena of {}", human(bytes)))
            .unwrap_or_default()
    );
    html += &figures_table(summary);
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
    let mut curves: Vec<FootprintCurve<'_>> = report
        .policies
        .iter()
        .map(|(outcome, placement)| FootprintCurve {
            name: outcome.policy.name,
            mapped: &placement.mapped,
        })
        .collect();
    curves.extend(report.extra_curves.iter().copied());
    let live = report.trace.live_bytes_curve();
    let axis = TimeAxis::new(&report.trace.clock, report.trace.events.len());
    let curve_legend = |live_name: &str| {
        let mut entries: Vec<(String, RGBColor, Swatch)> = curves
            .iter()
            .enumerate()
            .map(|(index, curve)| (curve.name.to_owned(), curve_color(index), Swatch::Line))
            .collect();
        entries.push((live_name.to_owned(), LIVE_COLOR, Swatch::Line));
        legend(&entries)
    };
    html += "<h3>Peak footprint</h3>\n";
    html += &peak_bars(&curves, summary.peak_live_bytes);
    html += "<h3>Footprint and live bytes over the trace</h3>\n";
    let (svg, frame, series) = footprint_chart(&curves, &live, span, &axis)?;
    html += &format!(
        "<div class=\"curves\" data-px0=\"{}\" data-px1=\"{}\" data-x1=\"{}\" data-time=\"{}\" \
         data-series=\"{}\"><div class=\"tip\">{CURVES_HINT}</div>{svg}</div>\n",
        frame.px.0,
        frame.px.1,
        frame.x.1,
        axis.is_time(),
        escape(&series)
    );
    html += &curve_legend("live bytes");
    html += &format!(
        "<h3>Overhead over the trace</h3>\n<p>What each policy had mapped above the highest live \
         bytes so far, in percent of the trace's peak live bytes ({}): the memory its gaps cost. \
         No allocator can map less than the live bytes, so 0% is the bound; where a curve ends is \
         the table's footprint / live minus 1.</p>\n",
        human(summary.peak_live_bytes)
    );
    html += &overhead_chart(&curves, &live, summary.peak_live_bytes, &axis)?;
    html += &curve_legend("0%: the peak live bytes so far");
    let same: Vec<String> = coinciding(&curves)
        .iter()
        .map(|names| names.join(" = "))
        .collect();
    if !same.is_empty() {
        html += &format!(
            "<p>Curves drawn over each other (the same footprint at every event): {}.</p>\n",
            escape(&same.join("; "))
        );
    }

    let lifetimes = report.trace.lifetimes();
    let mut sizes = vec![0u64; report.trace.allocations as usize];
    for event in &report.trace.events {
        if let trace::Event::Alloc { id, size } = *event {
            sizes[id as usize] = size;
        }
    }
    html += &format!(
        "<h3>Memory maps</h3>\n<p>{}</p>\n",
        escape(MEMORY_MAP_INTRO)
    );
    // The recorded stacks, once for every map of the trace.
    let stacks = hover_stacks(report.trace, &lifetimes, &sizes);
    let block_stacks = match &stacks {
        Some((table, of_block)) => {
            html += &format!("<div class=\"maps\" data-stacks=\"{}\">\n", escape(table));
            of_block.clone()
        }
        None => {
            html += "<div class=\"maps\">\n";
            Vec::new()
        }
    };
    for (outcome, placement) in &report.policies {
        let bands = if outcome.policy.contiguous {
            AddressBands::default()
        } else {
            AddressBands::of(placement, &sizes)
        };
        let map_span = span.max(bands.span());
        let columns = MAP_COLUMNS as f64 / axis.end();
        let raster = Raster::new(
            placement,
            &bands,
            &|event| axis.x(event as f64) * columns,
            &lifetimes,
            &sizes,
            map_span,
            MAP_COLUMNS,
            MAP_ROWS,
        );
        html += &format!("<h3>Memory map: {}</h3>\n", outcome.policy.name);
        if !outcome.policy.contiguous {
            html += VIRTUAL_MAP_NOTE;
            let cuts: Vec<String> = bands
                .starts()
                .iter()
                .skip(1)
                .map(|&(at, from)| {
                    format!(
                        "from {} up: virtual addresses from {}",
                        human(at),
                        human(from)
                    )
                })
                .collect();
            if !cuts.is_empty() {
                html += &format!(
                    "<p>The empty virtual addresses between its ranges are cut out: {}.</p>\n",
                    escape(&cuts.join("; "))
                );
            }
        }
        let (svg, frame) = memory_map_chart(
            &raster,
            placement,
            report.trace.events.len(),
            map_span,
            &axis,
            if outcome.policy.contiguous {
                "address"
            } else if bands.starts().is_empty() {
                "virtual address"
            } else {
                "virtual address, gaps cut"
            },
        )?;
        let blocks = hover_blocks(
            placement,
            &bands,
            &lifetimes,
            &sizes,
            &block_stacks,
            &axis,
            frame.unit,
        );
        html += &format!(
            "<div class=\"map\" data-px0=\"{}\" data-px1=\"{}\" data-py0=\"{}\" data-py1=\"{}\" \
             data-x1=\"{}\" data-y1=\"{}\" data-unit=\"{}\" data-time=\"{}\" data-blocks=\"{}\">\
             <div class=\"tip\">{}</div>{svg}</div>\n",
            frame.px.0,
            frame.px.1,
            frame.py.0,
            frame.py.1,
            frame.x.1,
            frame.y.1,
            frame.unit,
            axis.is_time(),
            escape(&blocks),
            if stacks.is_some() {
                MAP_HINT_STACKS
            } else {
                MAP_HINT
            }
        );
        html += &memory_map_key();
    }
    html += "</div>\n";
    Ok(html)
}

/// What the memory maps show and what to compare.
const MEMORY_MAP_INTRO: &str = "Each map shows where a policy put the blocks: address upwards, time \
(or, where the trace records none, the event) to the right, every cell shaded by how much of it live \
blocks filled; the red line is what the policy had mapped. Compare across policies the room between the top of the dark area at its highest \
and the red line: memory mapped but not usable when it mattered, which is what costs footprint. \
Light cells above dense ones are holes left by freed blocks. A policy that compacts (tlsf-compact, \
pool-vmm) packs its blocks low, so its red line sits just above the dark area.";

/// Under the map of a policy whose offsets are virtual addresses.
const VIRTUAL_MAP_NOTE: &str = "<p>Its addresses are virtual: pages are backed one by one, so \
blocks can lie above the red line, which counts the physical bytes mapped.</p>\n";

/// The memory maps' colour key.
fn memory_map_key() -> String {
    let bands = OCCUPANCY_SHADES.len();
    let mut entries: Vec<(String, RGBColor, Swatch)> = OCCUPANCY_SHADES
        .iter()
        .enumerate()
        .map(|(band, &shade)| {
            let low = if band == 0 { 1 } else { band * 100 / bands };
            let high = (band + 1) * 100 / bands;
            (format!("{low}-{high}% live"), shade, Swatch::Box)
        })
        .collect();
    entries.push(("bytes mapped".to_owned(), MAPPED_COLOR, Swatch::Line));
    legend(&entries)
}

/// Names of the curves that are the same as another, in groups, in legend
/// order: in a chart the later hides the earlier.
fn coinciding<'a>(curves: &[FootprintCurve<'a>]) -> Vec<Vec<&'a str>> {
    // Each group: the index of its first curve, and the names.
    let mut groups: Vec<(usize, Vec<&str>)> = Vec::new();
    for (index, curve) in curves.iter().enumerate() {
        match groups
            .iter_mut()
            .find(|(first, _)| curves[*first].mapped == curve.mapped)
        {
            Some((_, names)) => names.push(curve.name),
            None => groups.push((index, vec![curve.name])),
        }
    }
    groups
        .into_iter()
        .filter(|(_, names)| names.len() > 1)
        .map(|(_, names)| names)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay;
    use trace;

    #[test]
    fn curves_that_coincide_are_named_together() {
        let one = [(0, 10), (5, 20)];
        let other = [(0, 10)];
        let curves = [
            FootprintCurve {
                name: "a",
                mapped: &one,
            },
            FootprintCurve {
                name: "b",
                mapped: &other,
            },
            FootprintCurve {
                name: "c",
                mapped: &one,
            },
        ];
        assert_eq!(coinciding(&curves), [vec!["a", "c"]]);
        assert!(coinciding(&curves[..2]).is_empty());
    }

    #[test]
    fn the_page_explains_the_policies_keys_the_maps_and_takes_an_extra_curve() {
        let trace = trace::file::load_embedded().unwrap().remove(0);
        let names = ["first-fit", "stitch"];
        let settings = Settings::default();
        let mut runs = Vec::new();
        for name in names {
            let (outcome, placement) = replay::run(
                replay::spec::named(name).unwrap(),
                &trace,
                &settings,
                &indicatif::ProgressBar::hidden(),
                true,
            )
            .unwrap();
            runs.push((outcome, placement.unwrap()));
        }
        let outcomes: Vec<Outcome> = runs.iter().map(|(outcome, _)| outcome.clone()).collect();
        let summary = TraceSummary::new(&trace, None, &outcomes, Vec::new());
        let recorded = [(0, summary.peak_live_bytes * 2)];
        let report = TraceReport {
            trace: &trace,
            summary: &summary,
            policies: runs.iter().map(|(o, p)| (o, p)).collect(),
            extra_curves: vec![FootprintCurve {
                name: "pytorch (recorded)",
                mapped: &recorded,
            }],
        };
        let html = replay_page(&[report], &settings).unwrap();

        for spec in replay::POLICIES {
            let listed = html.contains(&escape(&spec.summary(&settings)));
            assert_eq!(listed, names.contains(&spec.name), "{}", spec.name);
        }
        // The stitch map says its addresses are virtual; first-fit's does not.
        assert_eq!(html.matches(VIRTUAL_MAP_NOTE).count(), 1);
        assert!(html.contains("<b>Moved bytes</b>"));
        assert!(html.contains("<h3>Overhead over the trace</h3>"));
        assert!(html.contains(&escape(MEMORY_MAP_INTRO)));

        let legends: Vec<&str> = html
            .split("<div class=\"legend\">")
            .skip(1)
            .map(|rest| rest.split("</div>").next().unwrap())
            .collect();
        // Footprint and overhead, then one key per memory map.
        assert_eq!(legends.len(), 2 + names.len(), "{legends:?}");
        for curves in &legends[..2] {
            for name in ["first-fit", "stitch", "pytorch (recorded)"] {
                assert!(curves.contains(&format!("</i>{name}</span>")), "{curves}");
            }
        }
        assert!(legends[0].contains("</i>live bytes</span>"));
        // The extra curve is drawn in the next color after the policies'.
        let RGBColor(r, g, b) = curve_color(names.len());
        assert!(legends[0].contains(&format!("rgb({r},{g},{b})")));
        assert!(
            html.contains(&format!("#{r:02X}{g:02X}{b:02X}")),
            "no path in the extra curve's color"
        );
        for key in &legends[2..] {
            for band in [
                "1-25% live",
                "25-50% live",
                "50-75% live",
                "75-100% live",
                "bytes mapped",
            ] {
                assert!(key.contains(band), "{key}");
            }
        }
    }
}
