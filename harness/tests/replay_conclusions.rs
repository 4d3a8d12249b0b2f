//! What `cudamem replay` concludes on the repository's traces: the rows a
//! program of the trace's framework can use come first, each row says
//! whether it moves blocks, and the closing sentences name the setting or
//! allocator to pick with figures taken from the rows.

mod support;

use std::path::{Path, PathBuf};

use memcore::bytes::human;
use serde_json::Value;

fn trace(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../traces")
        .join(path)
}

/// The JSON line of `cudamem replay PATH --json`.
fn replay_json(path: &Path) -> Value {
    support::json(&["replay", path.to_str().unwrap(), "--json"])
}

/// The row named `name` of a JSON line.
fn row<'a>(json: &'a Value, name: &str) -> &'a Value {
    json["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["name"] == name)
        .unwrap_or_else(|| panic!("no row {name}: {json}"))
}

fn bytes(row: &Value) -> u64 {
    row["peak_footprint_bytes"].as_u64().unwrap()
}

fn sentences(json: &Value) -> Vec<&str> {
    json["conclusion"]
        .as_array()
        .unwrap()
        .iter()
        .map(|sentence| sentence.as_str().unwrap())
        .collect()
}

#[test]
fn a_pytorch_trace_ends_with_what_expandable_segments_and_cudamem_save() {
    let json = replay_json(&trace("pytorch/resnet50_train.fixture.default.pickle.gz"));
    assert_eq!(json["framework"], "pytorch");
    let reserved = json["pytorch_recorded"]["peak_reserved_bytes"]
        .as_u64()
        .unwrap();
    let expandable = bytes(row(&json, "pytorch-expandable"));
    let said = sentences(&json);
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(
        said[0].contains(&format!("PyTorch reserved {} at its peak", human(reserved)))
            && said[0].contains(&format!(
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True would reserve {}",
                human(expandable)
            )),
        "{}",
        said[0]
    );
    let sign = if expandable < reserved { "-" } else { "+" };
    assert!(
        said[0].contains(&format!("({sign}{}", human(expandable.abs_diff(reserved)))),
        "{}",
        said[0]
    );
    // cudamem's PyTorch library: the smaller of its two pools, against the
    // smaller of what PyTorch reserved and what expandable segments would.
    let (name, ours) = ["tlsf", "stitch"]
        .into_iter()
        .map(|name| (name, bytes(row(&json, name))))
        .min_by_key(|&(_, bytes)| bytes)
        .unwrap();
    assert!(
        said[1].starts_with(&format!(
            "cudamem's PyTorch allocator (CUDAMEM_POLICY={name} with cudamem_torch) would map {}",
            human(ours)
        )),
        "{}",
        said[1]
    );
    let against = expandable.min(reserved);
    if ours < against {
        assert!(
            said[1].contains(&format!("{} (", human(against - ours))) && said[1].contains("less"),
            "{}",
            said[1]
        );
    } else {
        assert!(said[1].contains("no saving against"), "{}", said[1]);
    }
    // The table says the same under its rows.
    let path = trace("pytorch/resnet50_train.fixture.default.pickle.gz");
    let table = support::output(&["replay", path.to_str().unwrap()]);
    // Wrapped to the line width: compared word by word.
    let words = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    for sentence in said {
        assert!(
            words(&table).contains(&format!("=> {}", words(sentence))),
            "{table}"
        );
    }
}

/// The repository's RMM log without PyTorch's segment rows: a log RMM's
/// own `logging_resource_adaptor` writes (its allocations and frees only).
fn rmm_only_log() -> PathBuf {
    use std::io::Read as _;
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(trace("rmm/resnet50_train.csv.gz")).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    let kept: String = text
        .lines()
        .filter(|line| !line.contains(",segment_"))
        .map(|line| format!("{line}\n"))
        .collect();
    support::write_file("rmm-only.csv", kept.as_bytes())
}

#[test]
fn an_rmm_trace_names_the_rmm_resource_and_the_most_gaps_can_cost() {
    let path = rmm_only_log();
    let json = replay_json(&path);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(json["framework"], "rmm");
    let best_fit = row(&json, "best-fit");
    assert_eq!(best_fit["pick"]["how"], "rmm::mr::pool_memory_resource");
    let said = sentences(&json);
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(
        said[0].starts_with("rmm::mr::pool_memory_resource places blocks as the best-fit row")
            && said[0].contains(&format!("at least {}", human(bytes(best_fit)))),
        "{}",
        said[0]
    );
    let floor = json["policies"]
        .as_array()
        .unwrap()
        .iter()
        .min_by_key(|row| bytes(row))
        .unwrap();
    assert!(
        said[1].contains(&format!(
            "needs less than {} ({}",
            human(bytes(floor)),
            floor["name"].as_str().unwrap()
        )) && said[1].contains(&human(bytes(best_fit) - bytes(floor))),
        "{}",
        said[1]
    );
}

#[test]
fn the_table_lists_what_the_user_can_pick_first_and_whether_each_row_moves() {
    let path = trace("pytorch/resnet50_train.fixture.default.pickle.gz");
    let table = support::output(&["replay", path.to_str().unwrap()]);
    let lines: Vec<&str> = table.lines().collect();
    let at = |text: &str| {
        lines
            .iter()
            .position(|line| line.trim_start().starts_with(text))
            .unwrap_or_else(|| panic!("no line {text:?}:\n{table}"))
    };
    let usable = at("what a PyTorch program can use");
    let models = at("for comparison");
    let order = [
        "pytorch (recorded)",
        "pytorch-expandable",
        "tlsf ",
        "stitch ",
    ]
    .map(at);
    assert!(
        usable < order[0] && order.is_sorted() && order[3] < models,
        "{table}"
    );
    for name in ["first-fit", "best-fit", "tlsf-compact", "pool-vmm"] {
        assert!(at(name) > models, "{name}:\n{table}");
    }
    for (name, moves) in [
        ("tlsf-compact", "yes"),
        ("pool-vmm", "yes"),
        ("stitch", "no"),
    ] {
        let line = lines[at(&format!("{name} "))];
        assert_eq!(line.split_whitespace().nth(1), Some(moves), "{line}");
    }
    // How to use a row is said on the line under it.
    assert_eq!(
        lines[order[1] + 1].trim(),
        "how to use it: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    );
    assert!(table.contains("modelled"), "{table}");
}

#[test]
fn replay_help_explains_every_column_in_plain_words() {
    let (printed, result) = support::attempt(&["replay", "--help"]);
    assert!(printed.is_empty());
    let err = result.unwrap_err();
    let help = err.downcast_ref::<clap::Error>().unwrap().to_string();
    for column in cudamem::report::summary::COLUMNS {
        assert!(
            help.lines()
                .any(|line| line.trim_start().starts_with(column.header)
                    && line.contains(column.means.split(' ').next().unwrap())),
            "{} not explained:\n{help}",
            column.header
        );
    }
    for jargon in [
        "SimDevice",
        "ctx::Pool over",
        "drv calls",
        ">=32MiB",
        "ns/op",
        "memcore's",
    ] {
        assert!(!help.contains(jargon), "{jargon:?} in:\n{help}");
    }
    assert!(help.contains("H200"), "{help}");
}

/// The rows of a replay table with the host-time column blanked, each
/// trace's from its header on (its title names the file): what two runs of
/// the same traces must print alike.
fn rows_but_time(table: &str) -> Vec<String> {
    // Words of a policy row: name, moves, peak (a number and a unit),
    // x live, copied (number, unit), failed, then the host time.
    let time = 8;
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in table.lines() {
        // A title (or a line after the tables) starts at the margin.
        if !line.starts_with(' ') {
            in_table = false;
            continue;
        }
        in_table |= line.trim_start().starts_with("policy ");
        if !in_table {
            continue;
        }
        let mut cells: Vec<&str> = line.split_whitespace().collect();
        // A policy row: name, moves, then figures; the host time is the
        // only figure that changes from run to run.
        if cells.len() > time && matches!(cells[1], "yes" | "no") {
            cells[time] = "-";
        }
        rows.push(cells.join(" "));
    }
    rows
}

/// The bare command (as `cli::run` runs it: `ReplayArgs::defaults()`, its
/// report sent elsewhere) and `cudamem replay` of the built-in traces'
/// files print the same tables, groups, rows and conclusions; the PyTorch
/// snapshot and its conclusion come first, and the last line says how to ask
/// about one's own program.
#[test]
fn the_bare_command_prints_what_replay_of_its_trace_prints() {
    use cudamem::cli::replay_command::{self, ASK_ABOUT_YOURS, ReplayArgs};
    use trace::file::EMBEDDED;

    let mut bare = ReplayArgs::defaults().unwrap();
    bare.report = Some(support::temp_path("bare.html"));
    let mut printed = Vec::new();
    replay_command::run(bare, &mut printed).unwrap();
    let bare = String::from_utf8(printed).unwrap();
    let files: Vec<PathBuf> = EMBEDDED
        .iter()
        .map(|embedded| trace(embedded.path))
        .collect();
    let mut args = vec!["replay"];
    args.extend(files.iter().map(|file| file.to_str().unwrap()));
    let replayed = support::output(&args);
    let rows = rows_but_time(&bare);
    assert!(rows.iter().any(|row| row.starts_with("=> ")), "{bare}");
    assert_eq!(rows, rows_but_time(&replayed));

    // A PyTorch user meets PyTorch first: its trace, its rows, its conclusion.
    assert!(
        bare.starts_with("resnet50_train.full.default.pickle.gz (embedded): "),
        "{bare}"
    );
    let first_conclusion = rows.iter().find(|row| row.starts_with("=> ")).unwrap();
    assert!(
        first_conclusion.starts_with("=> PyTorch reserved "),
        "{bare}"
    );
    // The built-in CSV was written from PyTorch's allocator (its segment
    // rows): it gets PyTorch's recorded row and conclusion too.
    assert_eq!(
        bare.matches("what a PyTorch program can use").count(),
        2,
        "{bare}"
    );
    assert_eq!(bare.matches("  pytorch (recorded) ").count(), 2, "{bare}");
    assert_eq!(bare.lines().last(), Some(ASK_ABOUT_YOURS), "{bare}");
    assert!(!replayed.contains(ASK_ABOUT_YOURS), "{replayed}");
}

/// In a fixed arena the conclusion says who refused and why: below the
/// peak live bytes nothing can run; just above it, the policies whose gaps
/// cost more than the room left.
#[test]
fn a_fixed_arena_says_who_refused_and_why() {
    let path = trace("pytorch/resnet50_train.fixture.default.pickle.gz");
    let peak = replay_json(&path)["peak_live_bytes"].as_u64().unwrap();
    let in_arena = |bytes: u64| {
        let capacity = bytes.to_string();
        support::json(&[
            "replay",
            path.to_str().unwrap(),
            "--json",
            "--capacity",
            &capacity,
        ])
    };
    let below = in_arena(peak / (2 << 20) * (2 << 20));
    let said = sentences(&below);
    assert!(
        said.last()
            .unwrap()
            .starts_with("No allocator can run this trace in ")
            && said
                .last()
                .unwrap()
                .contains(&format!("{} live", human(peak))),
        "{said:?}"
    );
    let above = in_arena(peak.div_ceil(2 << 20) * (2 << 20) + (32 << 20));
    let refused: Vec<&str> = above["policies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| row["failed_allocations"].as_u64().unwrap() > 0)
        .map(|row| row["name"].as_str().unwrap())
        .collect();
    let said = sentences(&above);
    // This trace's gaps leave some policies short of 32 MiB of room.
    assert!(!refused.is_empty(), "{above}");
    let last = said.last().unwrap();
    assert!(last.contains(&refused.join(", ")), "{said:?}");
    assert!(last.contains("though the live bytes would fit"), "{said:?}");
    // The rows that fit still give the conclusion its figures.
    assert!(
        said.iter().any(|s| s.starts_with("PyTorch reserved ")),
        "{said:?}"
    );
}

#[test]
fn a_trace_recorded_with_expandable_segments_is_not_told_to_set_them() {
    let json = replay_json(&trace("pytorch/bert_train.full.expandable.pickle.gz"));
    assert_eq!(json["pytorch_recorded"]["expandable_segments"], true);
    let said = sentences(&json);
    assert!(
        said[0].contains("expandable_segments:True already set"),
        "{said:?}"
    );
    assert!(
        !said.iter().any(|s| s.contains("would reserve")),
        "{said:?}"
    );
    let json = replay_json(&trace("pytorch/bert_train.full.default.pickle.gz"));
    assert_eq!(json["pytorch_recorded"]["expandable_segments"], false);
}

#[test]
fn a_csv_recorded_from_pytorch_gets_the_recorded_row_and_pytorchs_advice() {
    // An RMM-style log PyTorch's allocator wrote: its segment rows add up
    // to 24 MiB at their peak (20, then 22, back to 20, then 24).
    let mib = 1u64 << 20;
    let rows = [
        ("segment_alloc", 0x1000_0000u64, 20 * mib),
        ("allocate", 0x1000_0000, 8 * mib),
        ("allocate", 0x1080_0000, 6 * mib),
        ("segment_alloc", 0x2000_0000, 2 * mib),
        ("allocate", 0x2000_0000, 1000),
        ("free", 0x2000_0000, 1000),
        ("segment_free", 0x2000_0000, 2 * mib),
        ("segment_alloc", 0x3000_0000, 4 * mib),
        ("allocate", 0x3000_0000, 3 * mib),
        ("free", 0x1000_0000, 8 * mib),
        ("free", 0x1080_0000, 6 * mib),
        ("free", 0x3000_0000, 3 * mib),
    ];
    let mut csv = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    for (index, (action, pointer, size)) in rows.iter().enumerate() {
        csv.push_str(&format!(
            "0,00:00:0{index}.0,{action},{pointer:#x},{size},0\n"
        ));
    }
    let path = support::write_file("from-pytorch.csv", csv.as_bytes());
    let json = replay_json(&path);
    assert_eq!(json["framework"], "pytorch");
    assert_eq!(json["pytorch_recorded"]["peak_reserved_bytes"], 24 * mib);
    let expandable = bytes(row(&json, "pytorch-expandable"));
    let said = sentences(&json);
    assert!(
        said[0].contains("PyTorch reserved 24.0 MiB at its peak")
            && said[0].contains(&format!(
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True would reserve {}",
                human(expandable)
            )),
        "{said:?}"
    );
    let table = support::output(&["replay", path.to_str().unwrap()]);
    let recorded = table
        .lines()
        .find(|line| line.trim_start().starts_with("pytorch (recorded)"))
        .unwrap_or_else(|| panic!("no recorded row:\n{table}"));
    assert!(recorded.contains("24.0 MiB"), "{recorded}");
    assert!(table.contains("what a PyTorch program can use"), "{table}");
    std::fs::remove_file(&path).unwrap();
}
