//! A policy that cannot take a trace (a request of 2^48 bytes, live bytes
//! past stitch's arena, requests whose pages the model will not track) is
//! skipped with its reason, and the others still report; stitch's work per
//! request is bounded by its step budget, counted in pages, not by time.

mod support;

use support::alloc_count::{Counting, peak_during};
use support::*;

use memcore::{MAX_MODEL_PAGES, Stitch, StitchConfig};

#[global_allocator]
static COUNTING: Counting = Counting;

fn csv(rows: &[(&str, u64, u64)]) -> std::path::PathBuf {
    let mut text = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    for (action, pointer, size) in rows {
        text += &format!("0,0,{action},0x{pointer:x},{size},0\n");
    }
    write_file("policies.csv", text.as_bytes())
}

fn skipped(json: &serde_json::Value) -> Vec<(String, String)> {
    json["skipped_policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|policy| {
            (
                policy["name"].as_str().unwrap().to_string(),
                policy["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn reported(json: &serde_json::Value) -> Vec<String> {
    json["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|policy| policy["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_request_of_the_largest_size_skips_stitch_and_the_others_report() {
    let path = csv(&[("allocate", 0x1000, 1 << 48), ("free", 0x1000, 1 << 48)]);
    let json = replay_json(
        &path,
        &["--policy", "stitch", "--policy", "pytorch-expandable"],
    );
    let skipped = skipped(&json);
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0].0, "stitch");
    assert!(
        skipped[0].1.contains("cannot take this trace"),
        "{skipped:?}"
    );
    assert!(!skipped[0].1.to_lowercase().contains("cuda"), "{skipped:?}");
    assert_eq!(reported(&json), ["tlsf", "pytorch-expandable"]);
}

#[test]
fn live_bytes_past_the_stitch_arena_skip_it() {
    let size = 100u64 << 40;
    let path = csv(&[("allocate", 0x1000, size), ("allocate", 0x2000, size)]);
    let json = replay_json(&path, &["--policy", "stitch"]);
    assert_eq!(skipped(&json)[0].0, "stitch");
    assert_eq!(reported(&json), ["tlsf"]);
}

#[test]
fn pairs_of_huge_requests_cost_stitch_a_bounded_count_of_pages() {
    // 200 alloc/free pairs of 128 TiB.
    let rows: Vec<(&str, u64, u64)> = (0..200)
        .flat_map(|_| [("allocate", 0x1000, 1 << 47), ("free", 0x1000, 1 << 47)])
        .collect();
    let path = csv(&rows);
    let (json, peak) = peak_during(|| {
        replay_json(
            &path,
            &["--policy", "stitch", "--policy", "pytorch-expandable"],
        )
    });
    assert_eq!(skipped(&json)[0].0, "stitch");
    assert_eq!(reported(&json), ["tlsf", "pytorch-expandable"]);
    assert!(peak < 64 << 20, "{peak} bytes held");
    // The model refuses past its page table before it touches a page.
    let mut stitch = Stitch::new(StitchConfig::default());
    let (result, peak) = peak_during(|| stitch.allocate(1 << 47));
    assert!(matches!(
        result,
        Err(memcore::Error::StepBudget { limit, .. }) if limit == MAX_MODEL_PAGES
    ));
    assert!(peak < 1 << 20, "{peak} bytes held");
    // And a request within it still works.
    let block = stitch.allocate(1 << 30).unwrap();
    stitch.free(block).unwrap();
}

#[test]
fn many_pairs_of_requests_just_inside_the_model_stop_at_the_traces_page_steps() {
    // Each 8 TiB less a page: the most pages one request may cover, so
    // every pair is allowed alone and only the trace's page steps stop it.
    let size = memcore::MAX_MODEL_PAGES * memcore::PAGE_BYTES - memcore::PAGE_BYTES;
    let rows: Vec<(&str, u64, u64)> = (0..2000)
        .flat_map(|_| [("allocate", 0x1000, size), ("free", 0x1000, size)])
        .collect();
    let path = csv(&rows);
    let json = replay_json(&path, &["--policy", "stitch"]);
    let (name, reason) = &skipped(&json)[0];
    assert_eq!(name, "stitch");
    let limit = memcore::model_page_steps(2000);
    assert!(reason.contains(&limit.to_string()), "{reason}");
    // Without the bound the model would take every page of every pair.
    let mut stitch = Stitch::new(StitchConfig {
        page_steps: limit,
        ..StitchConfig::default()
    });
    let mut pairs = 0u64;
    while let Ok(block) = stitch.allocate(size) {
        stitch.free(block).unwrap();
        pairs += 1;
    }
    assert_eq!(pairs, limit / (2 * (memcore::MAX_MODEL_PAGES - 1)));
}

#[test]
fn a_huge_capacity_skips_what_cannot_manage_it() {
    let path = csv(&[("allocate", 0x1000, 4096), ("free", 0x1000, 4096)]);
    let json = replay_json(
        &path,
        &["--capacity", "16383PiB", "--policy", "offset-allocator"],
    );
    assert_eq!(skipped(&json)[0].0, "offset-allocator");
    assert_eq!(reported(&json), ["tlsf"]);
}

#[test]
fn a_large_handle_past_the_model_is_refused_before_any_replay() {
    let path = csv(&[("allocate", 0x1000, 4096), ("free", 0x1000, 4096)]);
    let (said, peak) = peak_during(|| {
        replay_message(
            &path,
            &["--policy", "stitch", "--stitch-large", "8589932544MiB"],
        )
    });
    assert!(
        said.contains("--stitch-large") && said.contains("pages"),
        "{said}"
    );
    assert!(peak < 1 << 20, "{peak} bytes held");
    // The model itself refuses a chunk past its page table too.
    let mut stitch = Stitch::new(StitchConfig {
        large_pages: u32::MAX,
        ..StitchConfig::default()
    });
    assert!(matches!(
        stitch.allocate(512),
        Err(memcore::Error::StepBudget { .. })
    ));
}
