//! TLSF, the production allocator, against best fit on real traces it was
//! not tuned on: it must waste no more than best fit does, give or take
//! half a percent of peak live bytes or one 2 MiB granule (a granule is more
//! than half a percent of the smallest traces).

mod support;

use std::path::{Path, PathBuf};

use support::*;

const GRANULE: f64 = (2 << 20) as f64;

fn real_traces() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces");
    let mut found: Vec<PathBuf> = std::fs::read_dir(root.join("pytorch"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().ends_with(".pickle.gz"))
        .collect();
    found.push(root.join("rmm/resnet50_train.csv.gz"));
    found.sort();
    found
}

#[test]
fn tlsf_wastes_no_more_than_best_fit_on_real_traces() {
    let traces = real_traces();
    assert!(traces.len() >= 19, "{traces:?}");
    for path in traces {
        let json = replay_json(&path, &["--policy", "best-fit"]);
        let policies = json["policies"].as_array().unwrap();
        let footprint = |name: &str| {
            policies
                .iter()
                .find(|policy| policy["name"] == name)
                .unwrap_or_else(|| panic!("{name} missing for {}", path.display()))
                ["peak_footprint_bytes"]
                .as_f64()
                .unwrap()
        };
        let live = json["peak_live_bytes"].as_f64().unwrap();
        let (tlsf, best) = (footprint("tlsf"), footprint("best-fit"));
        let slack = (0.005 * live).max(GRANULE);
        assert!(
            tlsf <= best + slack,
            "{}: tlsf {tlsf} bytes, best fit {best}, peak live {live}",
            path.display()
        );
    }
}
