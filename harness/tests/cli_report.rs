//! The HTML pages `cudamem` writes, as a user opens them: legends sit under
//! their charts as HTML (never over the data, never cut off), the maps have a
//! colour key, and the page says what the policies are.

mod support;

use std::path::Path;
use support::default_policies;

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
    for name in default_policies() {
        assert!(legends[0].contains(&format!("</i>{name}</span>")), "{name}");
        assert!(html.contains(&format!("<li><b>{name}</b>: ")), "{name}");
    }
    assert!(html.contains("<h3>Overhead over the trace</h3>"));
    assert!(html.contains("<b>Moved bytes</b>"));
    assert!(legends[2].contains("75-100% live") && legends[2].contains("bytes mapped"));
}

/// Where a snapshot recorded stacks, the page carries each stack its maps
/// can name once, in one table for all of the trace's maps, and only the
/// largest blocks' stacks, each a few frames: it grows with the blocks a
/// map names, not with the trace. An RMM log's page carries no table.
#[test]
fn a_snapshots_stacks_are_in_its_page_once_and_bounded() {
    let fixture = root().join("traces/pytorch/resnet50_train.fixture.default.pickle.gz");
    let html = report_of(
        "stacks.html",
        &[
            "replay",
            fixture.to_str().unwrap(),
            "--policy",
            "first-fit",
            "--policy",
            "stitch",
        ],
    );
    let tables: Vec<&str> = html
        .split("data-stacks=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap())
        .collect();
    assert_eq!(tables.len(), 1, "one table for both maps");
    let json = tables[0]
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    let stacks: Vec<String> = serde_json::from_str(&json).unwrap();
    assert!(!stacks.is_empty());
    let mut distinct = stacks.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), stacks.len(), "a stack twice: {stacks:?}");
    // The blocks a map names (400 at most), each stack the user's frame and
    // the top frames, every frame's names cut to 80 characters.
    let frame_bytes = 2 * 80 + 30;
    assert!(
        tables[0].len() <= 400 * (1 + trace::HOVER_FRAMES) * frame_bytes,
        "{} bytes of stacks",
        tables[0].len()
    );
    for stack in &stacks {
        let lines: Vec<&str> = stack.lines().collect();
        assert!(lines.len() <= 1 + trace::HOVER_FRAMES, "{stack}");
        assert!(
            lines[1..].iter().all(|frame| frame.contains(" in ")),
            "{stack}"
        );
        // A frame of an installed package is named from the package on.
        assert!(!stack.contains("site-packages"), "{stack}");
    }
    // Every map's blocks name stacks of that one table.
    for blocks in html.split("data-blocks=\"").skip(1) {
        let blocks: Vec<Vec<f64>> =
            serde_json::from_str(blocks.split('"').next().unwrap()).unwrap();
        assert!(blocks.iter().any(|block| block[6] >= 0.0));
        assert!(blocks.iter().all(|block| block[6] < stacks.len() as f64));
    }

    let rmm = root().join("traces/rmm/resnet50_train.csv.gz");
    let html = report_of(
        "no-stacks.html",
        &["replay", rmm.to_str().unwrap(), "--policy", "best-fit"],
    );
    assert!(!html.contains("data-stacks=\""));
    let blocks = html.split("data-blocks=\"").nth(1).unwrap();
    let blocks: Vec<Vec<f64>> = serde_json::from_str(blocks.split('"').next().unwrap()).unwrap();
    assert!(blocks.iter().all(|block| block[6] == -1.0));
}
