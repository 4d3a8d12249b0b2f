//! The HTML pages `cudamem` writes, as a user opens them: legends sit under
//! their charts as HTML (never over the data, never cut off), the maps have a
//! colour key, and the page says what the policies are.

mod support;

use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// The page `cudamem ARGS... --report FILE` writes, run in process.
fn report_of(name: &str, args: &[&str]) -> String {
    let path = support::temp_path(name);
    let mut args = args.to_vec();
    args.extend(["--report", path.to_str().unwrap()]);
    support::output(&args);
    let html = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    html
}

/// The text of each HTML legend of `html`.
fn legends(html: &str) -> Vec<&str> {
    html.split("<div class=\"legend\">")
        .skip(1)
        .map(|rest| rest.split("</div>").next().unwrap())
        .collect()
}

#[test]
fn the_ledger_legend_lists_every_item_under_the_chart() {
    let html = report_of("ledger.html", &["explain", "--lmem", "16KiB"]);
    let legends = legends(&html);
    assert_eq!(legends.len(), 1, "{html}");
    let svg_end = html.find("</svg>").unwrap();
    assert!(html.find("<div class=\"legend\">").unwrap() > svg_end);
    for item in [
        "driver + context",
        "local memory",
        "malloc heap",
        "printf FIFO",
    ] {
        assert!(
            legends[0].contains(&format!("</i>{item} (")),
            "{item} missing from {}",
            legends[0]
        );
    }
    // Nothing of the legend is drawn inside the chart any more.
    assert!(!html[..svg_end].contains("malloc heap ("));
}

#[test]
fn the_replay_report_has_legends_keys_and_the_overhead_chart() {
    let trace = root().join("traces/rmm/resnet50_train.csv.gz");
    let html = report_of("replay.html", &["replay", trace.to_str().unwrap()]);
    let legends = legends(&html);
    // Footprint, overhead, and a key under each of the nine memory maps.
    assert_eq!(legends.len(), 2 + 9);
    for name in [
        "first-fit",
        "best-fit",
        "tlsf",
        "tlsf-compact",
        "pool-vmm",
        "offset-allocator",
        "range-alloc",
        "stitch",
        "pytorch-expandable",
    ] {
        assert!(legends[0].contains(&format!("</i>{name}</span>")), "{name}");
        assert!(html.contains(&format!("<li><b>{name}</b>: ")), "{name}");
    }
    assert!(html.contains("<h3>Overhead over the trace</h3>"));
    assert!(html.contains("<b>Moved bytes</b>"));
    assert!(legends[2].contains("75-100% live") && legends[2].contains("bytes mapped"));
}
