//! A policy that cannot take a trace (a request of 2^48 bytes, live bytes
//! past stitch's arena, more page steps than its input allows) is skipped
//! with its reason, and the others still report; stitch's work per request
//! does not grow with the request's size (huge ones are one handle), and
//! its work over a trace is bounded by its step budget, counted in pages,
//! not by time.

mod support;

use support::alloc_count::{Counting, peak_during};
use support::*;

use memcore::{HUGE_REQUEST_BYTES, Stitch, StitchConfig};

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
fn pairs_of_huge_requests_are_modelled_within_bounded_memory() {
    // 200 alloc/free pairs of 128 TiB: each the whole arena, each one
    // handle of its own.
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
    assert_eq!(reported(&json), ["tlsf", "stitch", "pytorch-expandable"]);
    assert!(peak < 64 << 20, "{peak} bytes held");
    // The model's memory does not grow with a request's size, and each
    // pair is one handle made and released.
    let mut stitch = Stitch::new(StitchConfig::default());
    for size in [1 << 30, 8 << 40, 1 << 47] {
        let (result, peak) = peak_during(|| stitch.allocate(size));
        let block = result.unwrap();
        assert!(peak < 1 << 20, "{peak} bytes held for a request of {size}");
        assert_eq!(stitch.stats().peak_live_in_full_bandwidth_handles, size);
        stitch.free(block).unwrap();
    }
    let calls = stitch.stats().calls;
    // The 1 GiB request is in pages: 32 large handles, kept idle until the
    // 8 TiB block goes over them.
    assert_eq!((calls.create.calls, calls.release.calls), (32 + 2, 32 + 2));
}

#[test]
fn many_pairs_of_the_largest_request_in_pages_stop_at_the_traces_page_steps() {
    // The largest request that is not huge covers 16,384 pages, so every
    // pair is allowed alone and only the trace's page steps stop it.
    let size = HUGE_REQUEST_BYTES - 512;
    let pages = size.div_ceil(memcore::PAGE_BYTES);
    let rows: Vec<(&str, u64, u64)> = (0..6000)
        .flat_map(|_| [("allocate", 0x1000, size), ("free", 0x1000, size)])
        .collect();
    let path = csv(&rows);
    let json = replay_json(&path, &["--policy", "stitch"]);
    let (name, reason) = &skipped(&json)[0];
    assert_eq!(name, "stitch");
    let limit = memcore::model_steps(6000);
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
    assert_eq!(pairs, limit / (2 * pages));
    assert!(pairs < 6000);
}

#[test]
fn moving_pools_stop_at_the_traces_steps_when_every_request_needs_a_plan() {
    // Random sizes up to 4 MiB, a little more allocated than freed: the
    // live blocks pile up and nearly every request plans a compaction over
    // all of them. Unbounded, 100,000 such events took pool-vmm 30 s.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut rows = Vec::new();
    for index in 0..60_000u64 {
        if !live.is_empty() && next() % 100 < 45 {
            let (pointer, size) = live.swap_remove((next() % live.len() as u64) as usize);
            rows.push(("free", pointer, size));
        } else {
            let block = (0x1000 + index * 0x10_0000_0000, 1 + next() % (4 << 20));
            live.push(block);
            rows.push(("allocate", block.0, block.1));
        }
    }
    let requests = rows.iter().filter(|row| row.0 == "allocate").count() as u64;
    let path = csv(&rows);
    let json = replay_json(
        &path,
        &[
            "--policy",
            "pool-vmm",
            "--policy",
            "tlsf-compact",
            "--policy",
            "stitch",
        ],
    );
    let limit = memcore::model_steps(requests).to_string();
    let skipped = skipped(&json);
    assert_eq!(
        skipped
            .iter()
            .map(|(name, _)| name.as_str())
            .collect::<Vec<_>>(),
        ["pool-vmm", "tlsf-compact"]
    );
    assert!(
        skipped.iter().all(|(_, reason)| reason.contains(&limit)),
        "{skipped:?}"
    );
    assert_eq!(reported(&json), ["tlsf", "stitch"]);
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
    // The model itself refuses a chunk past the largest handle too.
    let mut stitch = Stitch::new(StitchConfig {
        large_pages: u32::MAX,
        ..StitchConfig::default()
    });
    assert!(matches!(
        stitch.allocate(512),
        Err(memcore::Error::StepBudget { .. })
    ));
}
