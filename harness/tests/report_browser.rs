//! The replay report as a browser shows it: Debian's chromium, headless,
//! renders the page; its DOM (after the page's script ran) has the
//! conclusion, the axes, the legends and the memory maps, and its
//! screenshot is a picture, not a blank page. Without chromium the test
//! fails and names the script that installs it.

mod support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where Debian puts chromium.
const CHROMIUM: &str = "/usr/bin/chromium";

/// Debian's chromium; the test fails, naming the install script, without it.
fn chromium() -> Command {
    assert!(
        Path::new(CHROMIUM).is_file(),
        "{CHROMIUM} is missing: run scripts/install_browser.sh (cargo xtask ci runs it) to \
         install the browser the report tests render pages in"
    );
    let mut command = Command::new(CHROMIUM);
    // Root in a container has no sandbox to use, and there is no GPU.
    command.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--window-size=1250,2400",
    ]);
    command
}

/// The report of the PyTorch fixture through three policies, written in
/// process.
fn report() -> PathBuf {
    let trace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../traces/pytorch/resnet50_train.fixture.default.pickle.gz");
    let path = support::temp_path("report.html");
    support::output(&[
        "replay",
        trace.to_str().unwrap(),
        "--policy",
        "pytorch-expandable",
        "--policy",
        "stitch",
        "--policy",
        "tlsf-compact",
        "--report",
        path.to_str().unwrap(),
    ]);
    path
}

/// The DOM chromium builds of page `html` with script `probe` run at its
/// end (the probe replaces `</body>`), through temporary file `name`.
fn probed_dom(html: &str, probe: &str, name: &str) -> String {
    let probed = support::temp_path(name);
    std::fs::write(&probed, html.replace("</body>", probe)).unwrap();
    dump_dom(&probed)
}

/// The DOM chromium builds of the page at `path`.
fn dump_dom(path: &Path) -> String {
    String::from_utf8(chromium_on(path, "--dump-dom".into())).unwrap()
}

/// Chromium's standard output for the page at `path` with `flag`; it must
/// succeed.
fn chromium_on(path: &Path, flag: String) -> Vec<u8> {
    let out = chromium().arg(flag).arg(url(path)).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn url(path: &Path) -> String {
    format!("file://{}", path.display())
}

#[test]
fn the_rendered_report_has_its_conclusion_axes_legends_and_maps() {
    let page = report();
    let dom = dump_dom(&page);
    let conclusion = dom
        .split("id=\"conclusion\"")
        .nth(1)
        .and_then(|rest| rest.split("</div>").next())
        .unwrap_or_else(|| panic!("no conclusion in the rendered page"));
    assert!(
        conclusion.contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True would reserve")
            && conclusion.contains("CUDAMEM_POLICY=stitch"),
        "{conclusion}"
    );
    // The conclusion comes before any chart.
    assert!(dom.find("id=\"conclusion\"") < dom.find("<svg"));
    for axis in [
        "time since the first record (s)",
        "bytes (GiB)",
        "% of peak live bytes",
        "virtual address, gaps cut (GiB)",
        "peak bytes mapped (the axis starts at",
    ] {
        assert!(dom.contains(axis), "no axis {axis:?}");
    }
    // Footprint and overhead legends, and a key under each of three maps.
    assert_eq!(dom.matches("<div class=\"legend\">").count(), 2 + 3);
    // The footprint chart and each map ran the page's script (hover and
    // zoom are wired).
    assert_eq!(dom.matches("class=\"map\"").count(), 3);
    assert_eq!(dom.matches("class=\"curves\"").count(), 1);
    assert_eq!(
        dom.matches("data-ready=\"yes\"").count(),
        4,
        "the map script did not run"
    );
    for name in ["pytorch-expandable", "stitch", "tlsf-compact"] {
        assert!(dom.contains(&format!("Memory map: {name}")), "{name}");
    }
    std::fs::remove_file(&page).unwrap();
}

#[test]
fn the_screenshot_is_a_picture_with_the_maps_colours() {
    let page = report();
    let shot = support::temp_path("report.png");
    chromium_on(&page, format!("--screenshot={}", shot.display()));
    let image = Png::read(&std::fs::read(&shot).unwrap());
    assert_eq!((image.width, image.height), (1250, 2400));
    let pixels = image.pixels();
    let drawn = pixels.iter().filter(|&&p| p != [255, 255, 255]).count();
    assert!(
        drawn * 20 > pixels.len(),
        "only {drawn} of {} pixels are not white",
        pixels.len()
    );
    // The conclusion's green box and the charts' colours are on it.
    let near = |[r, g, b]: [u8; 3], [x, y, z]: [u8; 3]| {
        r.abs_diff(x) < 12 && g.abs_diff(y) < 12 && b.abs_diff(z) < 12
    };
    for (what, colour) in [
        ("the conclusion's background", [0xee, 0xf6, 0xee]),
        ("a curve (orange)", [230, 159, 0]),
    ] {
        assert!(
            pixels.iter().any(|&p| near(p, colour)),
            "no pixel of {what} {colour:?}"
        );
    }
    std::fs::remove_file(&page).unwrap();
    std::fs::remove_file(&shot).unwrap();
}

/// An 8-bit RGB or RGBA PNG, decoded as far as the test needs.
struct Png {
    width: usize,
    height: usize,
    /// Bytes per pixel: 3 or 4.
    depth: usize,
    /// Unfiltered rows, `width * depth` bytes each.
    rows: Vec<u8>,
}

impl Png {
    fn read(bytes: &[u8]) -> Self {
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
        let (mut width, mut height, mut depth) = (0, 0, 0);
        let mut data = Vec::new();
        let mut at = 8;
        while at + 8 <= bytes.len() {
            let length = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            let kind = &bytes[at + 4..at + 8];
            let body = &bytes[at + 8..at + 8 + length];
            match kind {
                b"IHDR" => {
                    width = u32::from_be_bytes(body[0..4].try_into().unwrap()) as usize;
                    height = u32::from_be_bytes(body[4..8].try_into().unwrap()) as usize;
                    assert_eq!(body[8], 8, "bit depth");
                    depth = match body[9] {
                        2 => 3,
                        6 => 4,
                        other => panic!("colour type {other}"),
                    };
                }
                b"IDAT" => data.extend_from_slice(body),
                _ => {}
            }
            at += 12 + length;
        }
        let mut raw = Vec::new();
        flate2::read::ZlibDecoder::new(&data[..])
            .read_to_end(&mut raw)
            .unwrap();
        let stride = width * depth;
        assert_eq!(raw.len(), height * (stride + 1));
        let mut rows = vec![0u8; height * stride];
        for y in 0..height {
            let filter = raw[y * (stride + 1)];
            let line = &raw[y * (stride + 1) + 1..(y + 1) * (stride + 1)];
            for x in 0..stride {
                let a = if x >= depth {
                    rows[y * stride + x - depth]
                } else {
                    0
                };
                let b = if y > 0 { rows[(y - 1) * stride + x] } else { 0 };
                let c = if x >= depth && y > 0 {
                    rows[(y - 1) * stride + x - depth]
                } else {
                    0
                };
                let predicted = match filter {
                    0 => 0,
                    1 => a,
                    2 => b,
                    3 => ((u16::from(a) + u16::from(b)) / 2) as u8,
                    4 => {
                        let p = i16::from(a) + i16::from(b) - i16::from(c);
                        let (pa, pb, pc) = (
                            (p - i16::from(a)).abs(),
                            (p - i16::from(b)).abs(),
                            (p - i16::from(c)).abs(),
                        );
                        if pa <= pb && pa <= pc {
                            a
                        } else if pb <= pc {
                            b
                        } else {
                            c
                        }
                    }
                    other => panic!("filter {other}"),
                };
                rows[y * stride + x] = line[x].wrapping_add(predicted);
            }
        }
        Self {
            width,
            height,
            depth,
            rows,
        }
    }

    /// Every pixel's red, green and blue.
    fn pixels(&self) -> Vec<[u8; 3]> {
        self.rows
            .chunks(self.depth)
            .map(|p| [p[0], p[1], p[2]])
            .collect()
    }
}

/// A pointer on the page, as the browser moves it: over a map's largest
/// block it names the block's size and lifetime, over the footprint chart
/// every curve's bytes.
#[test]
fn pointing_at_a_map_names_a_block_and_at_the_curves_their_bytes() {
    let page = report();
    // The page with a script after its own that moves the pointer over
    // each chart and keeps what the chart's line of text then says.
    let probe = r#"<script>
document.querySelectorAll('.map, .curves').forEach(function (box) {
  var svg = box.querySelector('svg'), r = svg.getBoundingClientRect(), d = box.dataset;
  var scale = r.width / svg.viewBox.baseVal.width;
  var top = d.py0 === undefined ? 100 : +d.py0, bottom = d.py1 === undefined ? 300 : +d.py1;
  // The map's block of the largest area, at its middle; the curves at a third.
  var at = [0.35 * d.x1, 0];
  if (d.blocks) {
    var area = function (b) { return (b[1] - b[0]) * (b[3] - b[2]); };
    var b = JSON.parse(d.blocks).reduce(function (x, y) { return area(y) > area(x) ? y : x; });
    at = [(b[0] + b[1]) / 2, (b[2] + b[3]) / 2];
  }
  var x = r.left + (+d.px0 + (d.px1 - d.px0) * at[0] / d.x1) * scale;
  var y = r.top + (bottom - (bottom - top) * (d.y1 ? at[1] / d.y1 : 0.5)) * scale;
  svg.dispatchEvent(new MouseEvent('mousemove', { clientX: x, clientY: y, bubbles: true }));
  box.setAttribute('data-probe', box.querySelector('.tip').textContent);
});
</script></body>"#;
    let html = std::fs::read_to_string(&page).unwrap();
    let dom = probed_dom(&html, probe, "probed.html");
    let said: Vec<&str> = dom
        .split("data-probe=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap())
        .collect();
    assert_eq!(said.len(), 4, "{said:?}");
    assert!(
        said[0].contains(" s: ")
            && said[0].contains("pytorch (recorded) ")
            && said[0].contains("live bytes"),
        "{}",
        said[0]
    );
    for map in &said[1..] {
        assert!(
            map.starts_with("block of ") && map.contains(", live from "),
            "{map}"
        );
        // The fixture was recorded with Python frames: the block's stack
        // follows its lifetime, its innermost frame a file, line and
        // function of the recorded program.
        let stack = map
            .split("allocated at ")
            .nth(1)
            .unwrap_or_else(|| panic!("no stack in {map:?}"));
        let frame = stack.lines().next().unwrap();
        assert!(
            frame.contains(".py:") && frame.contains(" in "),
            "{frame:?} in {map:?}"
        );
    }
    std::fs::remove_file(&page).unwrap();
}

/// An RMM log records no stacks: its maps' pointer says size and lifetime
/// and nothing more, and the page carries no table of stacks.
#[test]
fn a_trace_without_stacks_shows_none() {
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces/rmm/resnet50_train.csv.gz");
    let page = support::temp_path("rmm.html");
    support::output(&[
        "replay",
        trace.to_str().unwrap(),
        "--policy",
        "best-fit",
        "--report",
        page.to_str().unwrap(),
    ]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        !html.contains("data-stacks=\""),
        "a table of stacks in the page"
    );
    let probe = r#"<script>
var box = document.querySelector('.map'), svg = box.querySelector('svg'), d = box.dataset;
var r = svg.getBoundingClientRect(), scale = r.width / svg.viewBox.baseVal.width;
var area = function (b) { return (b[1] - b[0]) * (b[3] - b[2]); };
var b = JSON.parse(d.blocks).reduce(function (x, y) { return area(y) > area(x) ? y : x; });
var x = r.left + (+d.px0 + (d.px1 - d.px0) * (b[0] + b[1]) / 2 / d.x1) * scale;
var y = r.top + (+d.py1 - (d.py1 - d.py0) * (b[2] + b[3]) / 2 / d.y1) * scale;
svg.dispatchEvent(new MouseEvent('mousemove', { clientX: x, clientY: y, bubbles: true }));
box.setAttribute('data-probe', box.querySelector('.tip').textContent);
</script></body>"#;
    let dom = probed_dom(&html, probe, "rmm-probed.html");
    let said = dom
        .split("data-probe=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap();
    assert!(
        said.starts_with("block of ") && said.contains(", live from "),
        "{said}"
    );
    assert!(!said.contains("allocated at"), "{said}");
    std::fs::remove_file(&page).unwrap();
}
