//! The page's script: what the pointer shows over the footprint chart (every
//! curve's bytes) and over a memory map (the block under it), and the
//! maps' zoom; with the data it reads from each chart's attributes.

use std::collections::HashMap;

use crate::replay::Placement;
use crate::report::charts::TimeAxis;
use crate::report::memory_map::AddressBands;
use trace::Trace;

/// The text over a map before the pointer is on it.
pub(super) const MAP_HINT: &str = "Point at a block for its size and lifetime; scroll to zoom, drag to \
pan, double-click to reset.";

/// The text over a map of a trace that recorded stacks, before the pointer
/// is on it.
pub(super) const MAP_HINT_STACKS: &str = "Point at a block for its size, its lifetime and where it was \
allocated; scroll to zoom, drag to pan, double-click to reset.";

/// The text over the footprint chart before the pointer is on it.
pub(super) const CURVES_HINT: &str = "Point at the chart for every curve's bytes at that moment.";

/// What each map's pointer shows and how it zooms: reads the plotting
/// area and the largest blocks from the map's data attributes.
pub(super) const MAP_SCRIPT: &str = r#"
// Bytes as memcore::bytes::human writes them: binary units, three
// significant digits.
function size(bytes) {
  var units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'], i = 0;
  while (bytes >= 1024 && i < units.length - 1) { bytes /= 1024; i++; }
  var digits = i === 0 ? 0 : bytes >= 100 ? 0 : bytes >= 10 ? 1 : 2;
  return bytes.toFixed(digits) + ' ' + units[i];
}
document.querySelectorAll('.map').forEach(function (box) {
  var svg = box.querySelector('svg'), tip = box.querySelector('.tip'), d = box.dataset;
  var blocks = JSON.parse(d.blocks), full = [0, 0, +svg.getAttribute('width'), +svg.getAttribute('height')];
  var table = box.closest('.maps'), stacks = table && table.dataset.stacks ? JSON.parse(table.dataset.stacks) : [];
  var view = full.slice(), drag = null, hint = tip.textContent;
  svg.setAttribute('viewBox', view.join(' '));
  function at(e) {
    var p = svg.createSVGPoint(); p.x = e.clientX; p.y = e.clientY;
    var u = p.matrixTransform(svg.getScreenCTM().inverse());
    return [(u.x - d.px0) / (d.px1 - d.px0) * d.x1, (d.py1 - u.y) / (d.py1 - d.py0) * d.y1, u];
  }
  function when(x) { return d.time === 'true' ? x.toFixed(3) + ' s' : 'event ' + Math.round(x); }
  svg.addEventListener('mousemove', function (e) {
    var p = at(e);
    if (drag) {
      view[0] = drag[0] - (p[2].x - drag[2]); view[1] = drag[1] - (p[2].y - drag[3]);
      svg.setAttribute('viewBox', view.join(' ')); return;
    }
    if (p[0] < 0 || p[0] > d.x1 || p[1] < 0 || p[1] > d.y1) { tip.textContent = hint; return; }
    var hit = blocks.find(function (b) { return p[0] >= b[0] && p[0] <= b[1] && p[1] >= b[2] && p[1] <= b[3]; });
    var lines = hit && hit[6] >= 0 ? stacks[hit[6]].split('\n') : [], stack = '';
    if (lines[0]) { stack += '\nallocated by your code at ' + lines[0]; }
    if (lines.length > 1) { stack += '\nallocated at ' + lines.slice(1).join('\n  called from '); }
    tip.textContent = hit
      ? 'block of ' + size(hit[4]) + ' at ' + size(hit[5]) + ', live from ' + when(hit[0]) + ' to ' + when(hit[1]) + stack
      : when(p[0]) + ', address ' + size(p[1] * d.unit) + ' (no large block here)';
  });
  svg.addEventListener('wheel', function (e) {
    e.preventDefault();
    var u = at(e)[2], k = e.deltaY < 0 ? 0.8 : 1.25;
    k = Math.min(k, full[2] / view[2]);
    view = [u.x - (u.x - view[0]) * k, u.y - (u.y - view[1]) * k, view[2] * k, view[3] * k];
    svg.setAttribute('viewBox', view.join(' '));
  }, { passive: false });
  svg.addEventListener('mousedown', function (e) { var u = at(e)[2]; drag = [view[0], view[1], u.x, u.y]; });
  window.addEventListener('mouseup', function () { drag = null; });
  svg.addEventListener('dblclick', function () { view = full.slice(); svg.setAttribute('viewBox', view.join(' ')); });
  box.dataset.ready = 'yes';
});
document.querySelectorAll('.curves').forEach(function (box) {
  var svg = box.querySelector('svg'), tip = box.querySelector('.tip'), d = box.dataset, hint = tip.textContent;
  var series = JSON.parse(d.series);
  svg.addEventListener('mousemove', function (e) {
    var p = svg.createSVGPoint(); p.x = e.clientX; p.y = e.clientY;
    var u = p.matrixTransform(svg.getScreenCTM().inverse());
    var x = (u.x - d.px0) / (d.px1 - d.px0) * d.x1;
    if (x < 0 || x > d.x1) { tip.textContent = hint; return; }
    var parts = series.map(function (s) {
      var value = 0;
      for (var i = 0; i < s[1].length && s[1][i][0] <= x; i++) { value = s[1][i][1]; }
      return s[0] + ' ' + size(value);
    });
    tip.textContent = (d.time === 'true' ? x.toFixed(3) + ' s: ' : 'event ' + Math.round(x) + ': ') + parts.join(', ');
  });
  box.dataset.ready = 'yes';
});
"#;

/// The ids of the largest blocks of `sizes` that `keep` accepts, at most
/// [`HOVER_BLOCKS`], largest first: the blocks a map's pointer can name.
fn largest(sizes: &[u64], keep: impl Fn(usize) -> bool) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..sizes.len()).filter(|&id| keep(id)).collect();
    ids.sort_unstable_by_key(|&id| std::cmp::Reverse(sizes[id]));
    ids.truncate(HOVER_BLOCKS);
    ids
}

/// The stacks a trace's maps can name, once each: a JSON list of the
/// stacks of the trace's largest blocks (at most [`HOVER_BLOCKS`] of them,
/// so the page grows with them, not with the trace), and each block's
/// index in it by id; `None` for a trace without stacks.
pub(super) fn hover_stacks(
    trace: &Trace,
    lifetimes: &[(usize, usize)],
    sizes: &[u64],
) -> Option<(String, Vec<Option<u32>>)> {
    if trace.stacks.is_empty() {
        return None;
    }
    let mut of_block = vec![None; sizes.len()];
    let mut listed: Vec<&str> = Vec::new();
    let mut index_of: HashMap<u32, u32> = HashMap::new();
    for id in largest(sizes, |_| true) {
        let Some(stack) = trace.stack_at(lifetimes[id].0) else {
            continue;
        };
        let next = listed.len() as u32;
        of_block[id] = Some(*index_of.entry(stack).or_insert_with(|| {
            listed.push(&trace.stacks[stack as usize]);
            next
        }));
    }
    Some((serde_json::to_string(&listed).ok()?, of_block))
}

/// The blocks a map's pointer can name: the largest ones, at most
/// [`HOVER_BLOCKS`], as JSON `[x0, x1, y0, y1, bytes, address, stack]` (x on
/// the map's axis, y in `unit` bytes of the address axis, until the block's
/// first move; `stack` its index in [`hover_stacks`]' list, -1 for none).
pub(super) fn hover_blocks(
    placement: &Placement,
    bands: &AddressBands,
    lifetimes: &[(usize, usize)],
    sizes: &[u64],
    stacks: &[Option<u32>],
    axis: &TimeAxis,
    unit: f64,
) -> String {
    let mut first_move = vec![usize::MAX; sizes.len()];
    for &(event, id, _) in &placement.moves {
        let first = &mut first_move[id as usize];
        *first = (*first).min(event);
    }
    let ids = largest(sizes, |id| placement.offsets[id] != u64::MAX);
    let rows: Vec<String> = ids
        .into_iter()
        .map(|id| {
            let (born, died) = lifetimes[id];
            let offset = placement.offsets[id];
            let low = bands.map(offset) as f64 / unit;
            format!(
                "[{:.6},{:.6},{:.6},{:.6},{},{},{}]",
                axis.x(born as f64),
                axis.x(died.min(first_move[id]) as f64),
                low,
                low + sizes[id] as f64 / unit,
                sizes[id],
                offset,
                stacks.get(id).copied().flatten().map_or(-1, i64::from)
            )
        })
        .collect();
    format!("[{}]", rows.join(","))
}

/// Blocks a map's pointer can name (the largest).
const HOVER_BLOCKS: usize = 400;
