//! One name per concept across subcommands, and every column of `explain`
//! explained in its help.

mod support;

use clap::Parser;
use cudamem::cli::{Cli, Command};

fn help(args: &[&str]) -> String {
    let mut argv = vec!["cudamem"];
    argv.extend_from_slice(args);
    argv.push("--help");
    let err = Cli::try_parse_from(argv).unwrap_err();
    assert_eq!(err.kind(), clap::error::ErrorKind::DisplayHelp);
    err.to_string()
}

fn replay_args(args: &[&str]) -> cudamem::cli::replay_command::ReplayArgs {
    let mut argv = vec!["cudamem", "replay", "trace.csv"];
    argv.extend_from_slice(args);
    match Cli::try_parse_from(argv).unwrap().command {
        Some(Command::Replay(args)) => args,
        other => panic!("not a replay: {other:?}"),
    }
}

#[test]
fn a_snapshots_device_is_snapshot_device_and_the_old_spelling_warns() {
    let new = replay_args(&["--snapshot-device", "1"]);
    assert_eq!(new.snapshot_device(), (Some(1), None));
    let old = replay_args(&["--device", "1"]);
    let (device, warning) = old.snapshot_device();
    assert_eq!(device, Some(1));
    let warning = warning.expect("a deprecation warning");
    assert!(warning.contains("--snapshot-device 1"), "{warning}");
    assert_eq!(replay_args(&[]).snapshot_device(), (None, None));
    let both = Cli::try_parse_from([
        "cudamem",
        "replay",
        "t.csv",
        "--device",
        "1",
        "--snapshot-device",
        "2",
    ])
    .unwrap_err();
    assert_eq!(both.kind(), clap::error::ErrorKind::ArgumentConflict);

    let replay = help(&["replay"]);
    assert!(replay.contains("--snapshot-device <N>"), "{replay}");
    assert!(!replay.contains("--device"), "{replay}");
    // In explain and heap, --device is a GPU of this machine.
    assert!(help(&["explain"]).contains("--device <DEVICE>"));
    assert!(help(&["heap"]).contains("--device"));
}

#[test]
fn explains_help_names_every_column_it_prints() {
    let help = help(&["explain"]);
    let ledger = support::output(&["explain"]);
    let header = ledger
        .lines()
        .find(|line| line.starts_with("item"))
        .expect("a header");
    for column in header.split_whitespace() {
        assert!(help.contains(&format!("  {column} ")), "{column}: {help}");
    }
    for line in [
        "driver + context",
        "local memory",
        "fragmentation",
        "cm_malloc heap",
    ] {
        assert!(help.contains(line), "{line}");
    }
    for column in [
        "segment",
        "pool",
        "size",
        "allocated",
        "active",
        "free",
        "largest free",
    ] {
        assert!(help.contains(&format!("  {column} ")), "{column}: {help}");
    }
    // Plain words: no internal type names.
    for internal in ["ctx::", "DeviceHeap", "Ledger::", "memcore"] {
        assert!(!help.contains(internal), "{internal}: {help}");
    }
}

/// Every command that reads a size says how its units read, and they read
/// so.
#[test]
fn every_command_taking_a_size_says_which_units_are_binary_and_which_decimal() {
    let said = "K, KiB, M, MiB, G, GiB are binary (16K = 16384 B), KB, MB, GB decimal (16KB = \
                16000 B)";
    let words = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    for command in ["replay", "explain", "heap", "run"] {
        let text = help(&[command]);
        assert!(
            words(&text).contains(said),
            "cudamem {command} --help:\n{text}"
        );
        // A size's default reads as the output writes sizes, not as a
        // quoted string of clap's.
        assert!(
            !text.contains("[default: \""),
            "cudamem {command} --help:\n{text}"
        );
    }
    assert!(
        words(&help(&["replay"])).contains("default 32.0 MiB (33554432 B)"),
        "{}",
        help(&["replay"])
    );
    use cudamem::cli::byte_size::parse;
    assert_eq!((parse("16K"), parse("16KiB")), (Ok(16384), Ok(16384)));
    assert_eq!(parse("16KB"), Ok(16000));
    assert_eq!(
        (parse("1G"), parse("1GB")),
        (Ok(1 << 30), Ok(1_000_000_000))
    );
}
