//! The real snapshots in traces/pytorch (PyTorch 2.11 on an H200) against
//! what PyTorch said in the same process, and random damage to them, read
//! and replayed in process.

mod support;

use std::io::Read;
use std::path::{Path, PathBuf};

use cudamem::replay::{self, Settings};
use proptest::prelude::*;
use support::alloc_count::{Counting, peak_during};
use support::*;
use trace::budget::ReadBudget;
use trace::file::read_limited;

#[global_allocator]
static COUNTING: Counting = Counting;

fn traces_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces/pytorch")
}

/// Every snapshot with its `.json` of PyTorch's own figures.
fn real_snapshots() -> Vec<(PathBuf, serde_json::Value)> {
    let mut found: Vec<_> = std::fs::read_dir(traces_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().ends_with(".pickle.gz"))
        .map(|path| {
            let json = path.to_string_lossy().replace(".pickle.gz", ".json");
            let said = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
            (path, said)
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(found.len(), 18, "6 workloads x 3 recordings");
    found
}

#[test]
fn every_real_snapshot_replays_with_pytorchs_own_figures() {
    for (path, said) in real_snapshots() {
        let json = replay_json(&path, &[]);
        let name = path.display();
        let recorded = &json["pytorch_recorded"];
        assert_eq!(
            recorded["peak_reserved_bytes"], said["max_memory_reserved"],
            "{name}: reserved peak"
        );
        assert_eq!(
            recorded["peak_allocated_bytes"], said["max_memory_allocated"],
            "{name}: allocated peak as PyTorch counts blocks"
        );
        let live = json["peak_live_bytes"].as_u64().unwrap();
        let allocated = said["max_memory_allocated"].as_u64().unwrap();
        assert!(live <= allocated, "{name}: {live} requested > {allocated}");
        assert_eq!(json["unknown_frees"], 0, "{name}: recorded from the start");
        assert!(json["events"].as_u64().unwrap() > 1000, "{name}");
    }
}

#[test]
fn every_real_snapshot_is_explained() {
    for (path, said) in real_snapshots() {
        let name = path.display();
        let json = json(&["explain", "--snapshot", path.to_str().unwrap(), "--json"]);
        assert_eq!(
            json["reserved_bytes"], said["memory_reserved_at_dump"],
            "{name}"
        );
        assert_eq!(
            json["allocated_bytes"], said["memory_allocated_at_dump"],
            "{name}"
        );
        let free = json["free_bytes"].as_u64().unwrap();
        let largest = json["largest_free_bytes"].as_u64().unwrap();
        assert_eq!(
            json["fragmented_bytes"].as_u64().unwrap(),
            free - largest,
            "{name}"
        );
        assert!(!json["segments"].as_array().unwrap().is_empty(), "{name}");
    }
    // With Python frames, a block that pins a segment names the user's line.
    let path = traces_dir().join("vit_infer.fixture.default.pickle.gz");
    let text = output(&["explain", "--snapshot", path.to_str().unwrap()]);
    assert!(text.contains("scripts/torch/workloads.py:"), "{text}");
    assert!(text.contains(" in vit_infer"), "{text}");
}

#[test]
fn the_report_draws_pytorchs_curve() {
    let path = traces_dir().join("gpt2_train.fixture.default.pickle.gz");
    let report = temp_path("gpt2.html");
    output(&[
        "replay",
        path.to_str().unwrap(),
        "--policy",
        "tlsf",
        "--report",
        report.to_str().unwrap(),
    ]);
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(
        html.contains("<td>pytorch (recorded)</td><td>no</td><td>3.40 GiB</td>"),
        "table row"
    );
    assert!(
        html.matches("pytorch (recorded)").count() >= 2,
        "and the curve's legend"
    );
}

/// The smallest real snapshots with frames, decompressed.
fn fixture_pickles() -> Vec<Vec<u8>> {
    [
        "vit_infer.fixture.default.pickle.gz",
        "gpt2_train.fixture.default.pickle.gz",
    ]
    .iter()
    .map(|name| {
        let file = std::fs::File::open(traces_dir().join(name)).unwrap();
        let mut bytes = Vec::new();
        flate2::read::GzDecoder::new(file)
            .read_to_end(&mut bytes)
            .unwrap();
        bytes
    })
    .collect()
}

/// The most bytes a damaged snapshot may have the reader and a replay hold
/// at once, per byte of the pickle: the reader keeps the decoded objects,
/// the trace its events, the replay its blocks.
const BYTES_PER_PICKLE_BYTE: u64 = 10;

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// Damaged snapshots end in traces that replay or in an error naming
    /// the file, never a panic, and within memory bounded by their size.
    #[test]
    fn damaged_real_snapshots_never_crash(
        which in 0usize..2,
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let pickles = fixture_pickles();
        let mut bytes = pickles[which].clone();
        for (at, value) in flips {
            let index = at.index(bytes.len());
            bytes[index] = value;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len()));
        }
        let path = Path::new("damaged.pickle");
        let tlsf = replay::spec::named("tlsf").unwrap();
        let hidden = indicatif::ProgressBar::hidden();
        let (outcome, peak) = peak_during(|| {
            read_limited(path, "damaged.pickle", &bytes[..], &ReadBudget::CEILING).map(|traces| {
                traces
                    .iter()
                    .map(|trace| replay::run(tlsf, trace, &Settings::default(), &hidden, false))
                    .collect::<Vec<_>>()
            })
        });
        match outcome {
            Ok(replays) => {
                for replayed in replays {
                    let (outcome, _) = replayed.map_err(|err| TestCaseError::fail(format!("{err:#}")))?;
                    prop_assert_eq!(outcome.failed_allocations, 0);
                }
            }
            Err(err) => prop_assert_eq!(err.path.as_path(), path, "{}", err),
        }
        let bound = BYTES_PER_PICKLE_BYTE * pickles[which].len() as u64;
        prop_assert!(peak <= bound, "{} bytes held at once, over {}", peak, bound);
    }
}
