//! Every policy a trace can be replayed through, as one table of specs:
//! its name, what it is, whether it moves blocks, how a user gets it outside
//! cudamem, and how to build it. A new policy is one entry in [`POLICIES`];
//! the command line, the tables, the JSON and the report read the table.

use std::fmt;

use anyhow::Result;
use ctx::CompactionPolicy;
use memcore::bytes::human;
use memcore::{Fit, PAGE_BYTES, StitchConfig, pytorch};
use serde::Serialize;

use crate::replay::baseline::{OffsetAllocatorPolicy, RangeAllocPolicy};
use crate::replay::device;
use crate::replay::policy::{self, Arena, GRANULE};
use crate::replay::pool_policy::{self, PoolPolicy};
use crate::replay::stitch_policy::{ExpandablePolicy, StitchPolicy};
use crate::replay::{Done, Pass};
use trace::Trace;

/// What every policy of one replay is built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// The address space each policy starts with.
    pub arena: Arena,
    /// How the stitching policies back and recycle physical memory.
    pub stitch: StitchConfig,
    /// The CUDA device the policies that can run on one run on
    /// ([`PolicySpec::runs_on_gpu`]); `None`: a simulated H200.
    pub gpu: Option<u32>,
    /// The most work the moving pools' compaction plans may do over the
    /// whole replay, in blocks and holes looked at (`u64::MAX`: no bound);
    /// past it the policy cannot take the trace.
    pub plan_steps: u64,
}

impl Default for Settings {
    /// A growing arena, memcore's stitching defaults, no GPU: what
    /// `cudamem replay` runs with no option (a test holds the two equal).
    fn default() -> Self {
        Self {
            arena: Arena::Growable,
            stitch: StitchConfig::default(),
            gpu: None,
            plan_steps: u64::MAX,
        }
    }
}

/// The allocator library a trace's program ran on: whose settings a user of
/// the trace can pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Framework {
    /// A PyTorch memory snapshot.
    PyTorch,
    /// An RMM allocation log.
    Rmm,
}

impl Framework {
    /// The framework `trace` was recorded under: a snapshot names its CUDA
    /// device (or records PyTorch's reserved bytes), an RMM log does neither.
    pub fn of(trace: &Trace) -> Self {
        if trace.device.is_some() || trace.recorded.is_some() {
            Framework::PyTorch
        } else {
            Framework::Rmm
        }
    }

    /// "a PyTorch", "an RMM": the article its name takes.
    pub fn a_program(self) -> &'static str {
        match self {
            Framework::PyTorch => "a PyTorch",
            Framework::Rmm => "an RMM",
        }
    }

    /// Its name in sentences.
    pub fn name(self) -> &'static str {
        match self {
            Framework::PyTorch => "PyTorch",
            Framework::Rmm => "RMM",
        }
    }
}

/// A way for a framework's user to pick a policy without changing the
/// program's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Pick {
    /// What to set or use, as the user writes it.
    pub how: &'static str,
    /// Whether cudamem ships it (its PyTorch library), rather than the
    /// framework itself.
    pub cudamem: bool,
}

/// One allocation policy: what it is, and how a replay builds it.
pub struct PolicySpec {
    /// The name on the command line and in reports.
    pub name: &'static str,
    /// What it is and how it places blocks, in one sentence without its
    /// end, for the settings a replay runs with.
    describe: fn(&Settings) -> String,
    /// Whether it moves live blocks (compaction). A program that holds
    /// plain pointers (PyTorch, RMM, most CUDA code) cannot let its blocks
    /// move, so such a policy is only for callers that hold handles.
    pub moves_blocks: bool,
    /// How a PyTorch program gets this allocator, where it can: a setting
    /// of PyTorch's or a cudamem library. Only a policy that never moves a
    /// block can have one.
    pub pytorch: Option<Pick>,
    /// How an RMM program gets this allocator, where it can.
    pub rmm: Option<Pick>,
    /// How Rust code gets it: a crate or a ctx type. `None` with no pick
    /// either: a model for research and comparison only.
    pub rust: Option<&'static str>,
    /// Whether a block's offset lies in the bytes the policy maps from 0
    /// (false: a virtual address, whose pages are backed one by one, so
    /// offsets run past the mapped bytes).
    pub contiguous: bool,
    /// Whether `cudamem replay` runs it when no `--policy` is given.
    pub by_default: bool,
    /// Whether it runs on a device, CUDA device N with `--gpu N` (and with
    /// `--gpu`, only such policies run unless `--policy` names others).
    pub runs_on_gpu: bool,
    /// Build a fresh instance for `settings` and run `pass` through it.
    replay: fn(&Settings, Pass<'_>) -> Result<Done>,
}

impl PolicySpec {
    /// What the policy is, whether it moves blocks and how a user gets it,
    /// in a few sentences, for the report and `--help`.
    pub fn summary(&self, settings: &Settings) -> String {
        let moves = if self.moves_blocks {
            "Moves live blocks to close gaps, so only code that lets its blocks move can use it \
             (no PyTorch or RMM program can)."
        } else {
            "Never moves a block."
        };
        let mut ways = Vec::new();
        if let Some(pick) = self.pytorch {
            ways.push(format!("from PyTorch, {}", pick.how));
        }
        if let Some(pick) = self.rmm {
            ways.push(format!("from RMM, {}", pick.how));
        }
        if let Some(how) = self.rust {
            ways.push(format!("from Rust, {how}"));
        }
        let use_it = if ways.is_empty() {
            "A model for comparison: nothing outside cudamem runs it.".to_string()
        } else {
            format!("To use it: {}.", ways.join("; "))
        };
        format!("{}. {moves} {use_it}", (self.describe)(settings))
    }

    /// How a `framework` program picks this policy, if it can.
    pub fn pick(&self, framework: Framework) -> Option<Pick> {
        match framework {
            Framework::PyTorch => self.pytorch,
            Framework::Rmm => self.rmm,
        }
    }

    /// Build the policy for `settings` and run `pass` through it.
    pub(crate) fn run(&self, settings: &Settings, pass: Pass<'_>) -> Result<Done> {
        (self.replay)(settings, pass)
    }
}

impl fmt::Debug for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicySpec")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl PartialEq for PolicySpec {
    /// Specs are told apart by name, which the table keeps unique.
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for PolicySpec {}

/// The spec named `name`, if the table has one.
pub fn named(name: &str) -> Option<&'static PolicySpec> {
    POLICIES.iter().find(|spec| spec.name == name)
}

/// The policies a replay runs when none is named: with a GPU those that run
/// on it, else the default ones.
pub fn defaults(gpu: bool) -> Vec<&'static PolicySpec> {
    POLICIES
        .iter()
        .filter(|spec| {
            if gpu {
                spec.runs_on_gpu
            } else {
                spec.by_default
            }
        })
        .collect()
}

/// Every policy, in report order.
pub static POLICIES: &[PolicySpec] = &[
    PolicySpec {
        name: "first-fit",
        describe: |_| {
            "a plain free list: each request goes in the lowest gap that fits (the textbook \
             baseline)"
                .into()
        },
        moves_blocks: false,
        pytorch: None,
        rmm: None,
        rust: None,
        contiguous: true,
        by_default: true,
        runs_on_gpu: false,
        replay: |settings, pass| pass.run(&mut policy::free_list(Fit::First, settings.arena)?),
    },
    PolicySpec {
        name: "best-fit",
        describe: |_| {
            "the same free list, each request in the smallest gap that fits, as RMM's pool \
             places blocks (that pool also grows in steps of its own, so it holds at least this \
             much)"
                .into()
        },
        moves_blocks: false,
        pytorch: None,
        rmm: Some(Pick {
            how: "rmm::mr::pool_memory_resource",
            cudamem: false,
        }),
        rust: None,
        contiguous: true,
        by_default: true,
        runs_on_gpu: false,
        replay: |settings, pass| pass.run(&mut policy::free_list(Fit::Best, settings.arena)?),
    },
    PolicySpec {
        name: "tlsf",
        describe: |_| {
            "cudamem's default pool for PyTorch: one range of memory grown at its end, each \
             request put in a close-fitting gap in constant time (TLSF)"
                .into()
        },
        moves_blocks: false,
        pytorch: Some(Pick {
            how: "CUDAMEM_POLICY=tlsf with cudamem_torch",
            cudamem: true,
        }),
        rmm: None,
        rust: Some("ctx::Pool with CompactionPolicy::Never"),
        contiguous: true,
        by_default: true,
        runs_on_gpu: false,
        replay: |settings, pass| pass.run(&mut policy::tlsf(settings.arena)?),
    },
    PolicySpec {
        name: "tlsf-compact",
        describe: |_| {
            "a pool that moves blocks to grow the least: when a request does not fit, it first \
             moves the fewest blocks that make room, else slides every block down, and only \
             then grows"
                .into()
        },
        moves_blocks: true,
        pytorch: None,
        rmm: None,
        rust: Some("ctx::Pool with CompactionPolicy::SlideBeforeGrow"),
        contiguous: true,
        by_default: true,
        runs_on_gpu: false,
        replay: |settings, pass| {
            let pool = pool_policy::pool(settings.arena, CompactionPolicy::SlideBeforeGrow)?;
            pass.run(&mut PoolPolicy::new(&pool, settings))
        },
    },
    PolicySpec {
        name: "pool-vmm",
        describe: |_| {
            format!(
                "the same moving pool as it runs on a GPU: it moves blocks to close gaps before \
                 it grows, and grows by mapping {} pages",
                human(GRANULE)
            )
        },
        moves_blocks: true,
        pytorch: None,
        rmm: None,
        rust: Some("ctx::Pool with PoolConfig::vmm"),
        contiguous: true,
        by_default: true,
        runs_on_gpu: false,
        replay: |settings, pass| {
            let pool = pool_policy::pool(settings.arena, CompactionPolicy::BeforeGrow)?;
            pass.run(&mut PoolPolicy::new(&pool, settings))
        },
    },
    PolicySpec {
        name: "offset-allocator",
        describe: |_| {
            "the offset-allocator crate (a port of Sebastian Aaltonen's OffsetAllocator): \
             constant time, in one range of fixed size"
                .into()
        },
        moves_blocks: false,
        pytorch: None,
        rmm: None,
        rust: Some("the offset-allocator crate"),
        contiguous: true,
        by_default: true,
        runs_on_gpu: false,
        replay: |settings, pass| pass.run(&mut OffsetAllocatorPolicy::new(settings.arena)?),
    },
    PolicySpec {
        name: "range-alloc",
        describe: |_| "the range-alloc crate (wgpu's allocator): best fit, grown at its end".into(),
        moves_blocks: false,
        pytorch: None,
        rmm: None,
        rust: Some("the range-alloc crate"),
        contiguous: true,
        by_default: true,
        runs_on_gpu: false,
        replay: |settings, pass| pass.run(&mut RangeAllocPolicy::new(settings.arena)),
    },
    PolicySpec {
        name: "stitch",
        describe: |settings| describe_stitch(&settings.stitch),
        moves_blocks: false,
        pytorch: Some(Pick {
            how: "CUDAMEM_POLICY=stitch with cudamem_torch",
            cudamem: true,
        }),
        rmm: None,
        rust: Some("ctx::StitchedPool"),
        contiguous: false,
        by_default: true,
        runs_on_gpu: false,
        replay: |settings, pass| pass.run(&mut StitchPolicy::new(settings.stitch, settings.arena)),
    },
    PolicySpec {
        name: "pytorch-expandable",
        describe: |_| {
            format!(
                "a model of PyTorch's caching allocator with expandable segments: requests \
                 rounded up to {}; those up to {} in one segment grown by {} pages, the rest in \
                 another grown by {} pages; each segment keeps the pages it mapped",
                human(pytorch::MIN_BLOCK_BYTES),
                human(pytorch::SMALL_SIZE_BYTES),
                human(pytorch::SMALL_BUFFER_BYTES),
                human(pytorch::LARGE_BUFFER_BYTES),
            )
        },
        moves_blocks: false,
        pytorch: Some(Pick {
            how: "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            cudamem: false,
        }),
        rmm: None,
        rust: None,
        contiguous: false,
        by_default: true,
        runs_on_gpu: false,
        replay: |settings, pass| pass.run(&mut ExpandablePolicy::new(settings.arena)),
    },
    PolicySpec {
        name: "stitched-pool",
        describe: |settings| {
            let on = match settings.gpu {
                Some(ordinal) => format!("CUDA device {ordinal}"),
                None => "a simulated H200 (with --gpu N, CUDA device N)".to_string(),
            };
            format!(
                "the stitch policy run for real on {on}, through the driver's virtual memory \
                 calls, each allocate and free timed; its memory is the stitch row's, and what \
                 the device measured is listed under the table"
            )
        },
        moves_blocks: false,
        pytorch: None,
        rmm: None,
        rust: Some("ctx::StitchedPool"),
        contiguous: false,
        by_default: false,
        runs_on_gpu: true,
        replay: device::replay,
    },
];

/// What the stitched pool with `config` does, in a user's words: where
/// blocks sit, what backs them, and when it makes or reuses memory.
fn describe_stitch(config: &StitchConfig) -> String {
    let large = u64::from(config.large_pages) * PAGE_BYTES;
    let pieces = if config.large_pages > 1 {
        format!(
            "{} pieces of physical memory ({} ones where a whole piece would hold too much)",
            human(large),
            human(PAGE_BYTES)
        )
    } else {
        format!("{} pieces of physical memory", human(PAGE_BYTES))
    };
    let keep = if config.keep_idle_bytes > 0 {
        format!(
            ", and keeps {} of unused pieces ready beyond that",
            human(config.keep_idle_bytes)
        )
    } else {
        String::new()
    };
    format!(
        "cudamem's stitched pool: blocks stay where they are put, and only the memory they use \
         is backed, by {pieces}; it makes a new piece while holding at most {} over \
         the program's peak live bytes{}, otherwise it reuses a piece no block needs{keep}; \
         a block of {} or more gets its own piece, freed with it",
        permille(config.slack_permille),
        if config.large_pages > 1 && config.grow_in_large {
            " (or when none is unused)"
        } else {
            ""
        },
        human(memcore::HUGE_REQUEST_BYTES),
    )
}

/// Parts per thousand as a percentage.
fn permille(value: u32) -> String {
    let percent = f64::from(value) / 10.0;
    if value % 10 == 0 {
        format!("{percent:.0}%")
    } else {
        format!("{percent:.1}%")
    }
}

/// `--policy`'s values: the names of [`POLICIES`], each with its summary in
/// `--help`.
#[derive(Debug, Clone, Copy)]
pub struct PolicyParser;

impl clap::builder::TypedValueParser for PolicyParser {
    type Value = &'static PolicySpec;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        use clap::error::{ContextKind, ContextValue, ErrorKind};

        let text = value.to_string_lossy();
        named(&text).ok_or_else(|| {
            let mut err = clap::Error::new(ErrorKind::InvalidValue).with_cmd(cmd);
            if let Some(arg) = arg {
                err.insert(
                    ContextKind::InvalidArg,
                    ContextValue::String(arg.to_string()),
                );
            }
            err.insert(
                ContextKind::InvalidValue,
                ContextValue::String(text.chars().take(80).collect()),
            );
            err.insert(
                ContextKind::ValidValue,
                ContextValue::Strings(POLICIES.iter().map(|spec| spec.name.into()).collect()),
            );
            err
        })
    }

    fn possible_values(
        &self,
    ) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        Some(Box::new(POLICIES.iter().map(|spec| {
            clap::builder::PossibleValue::new(spec.name).help(spec.summary(&Settings::default()))
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found() {
        for (index, spec) in POLICIES.iter().enumerate() {
            assert_eq!(named(spec.name), Some(spec));
            assert!(
                POLICIES[index + 1..]
                    .iter()
                    .all(|other| other.name != spec.name),
                "{} twice",
                spec.name
            );
        }
        assert_eq!(named("no-such-policy"), None);
    }

    #[test]
    fn the_defaults_are_the_nine_policies_and_the_gpu_runs_the_device_one() {
        let names = |specs: Vec<&PolicySpec>| specs.iter().map(|s| s.name).collect::<Vec<_>>();
        assert_eq!(
            names(defaults(false)),
            [
                "first-fit",
                "best-fit",
                "tlsf",
                "tlsf-compact",
                "pool-vmm",
                "offset-allocator",
                "range-alloc",
                "stitch",
                "pytorch-expandable"
            ]
        );
        assert_eq!(names(defaults(true)), ["stitched-pool"]);
    }

    #[test]
    fn summaries_say_what_the_settings_make_of_the_stitch_policy() {
        let stitch = named("stitch").unwrap();
        let text = stitch.summary(&Settings::default());
        for said in [
            "cudamem's stitched pool",
            "32.0 MiB pieces of physical memory (2.00 MiB ones",
            "at most 2% over the program's peak live bytes (or when none is unused)",
            "reuses a piece no block needs",
            "a block of 32.0 GiB or more gets its own piece, freed with it",
            "Never moves a block.",
            "To use it: from PyTorch, CUDAMEM_POLICY=stitch with cudamem_torch; from Rust, ctx::StitchedPool.",
        ] {
            assert!(text.contains(said), "{said:?} not in {text}");
        }
        let pages_only = Settings {
            stitch: StitchConfig {
                large_pages: 1,
                slack_permille: 25,
                keep_idle_bytes: 64 << 20,
                ..StitchConfig::default()
            },
            ..Settings::default()
        };
        let text = stitch.summary(&pages_only);
        assert!(
            text.contains("by 2.00 MiB pieces of physical memory;"),
            "{text}"
        );
        assert!(text.contains("at most 2.5% over"), "{text}");
        assert!(
            text.contains("keeps 64.0 MiB of unused pieces ready"),
            "{text}"
        );
    }

    #[test]
    fn every_summary_is_in_a_users_words() {
        // The words of memcore's and ctx's insides, which a user of the
        // command never meets.
        let insides = [
            "Stitch",
            "StitchConfig",
            "Tlsf",
            "preferring_low",
            "handle",
            "budget",
            "arena",
            "chunk",
            "compacting",
            "SimDevice",
        ];
        for spec in POLICIES {
            let text = spec.summary(&Settings::default());
            let described = (spec.describe)(&Settings::default());
            for word in insides {
                assert!(
                    !described.contains(word),
                    "{}: {word:?} in {described}",
                    spec.name
                );
            }
            // What it is, then whether it moves blocks, then how to use it.
            let moves = text.find(if spec.moves_blocks {
                "Moves live blocks"
            } else {
                "Never moves"
            });
            let use_it = text
                .find("To use it")
                .or_else(|| text.find("A model for comparison"));
            assert!(
                matches!((moves, use_it), (Some(m), Some(u)) if 0 < m && m < u),
                "{}: {text}",
                spec.name
            );
            assert!(
                described.split_whitespace().count() < 80,
                "{}: {described}",
                spec.name
            );
        }
    }

    #[test]
    fn every_summary_says_whether_it_moves_blocks_and_how_to_use_it() {
        for spec in POLICIES {
            let text = spec.summary(&Settings::default());
            assert_eq!(
                text.contains("Moves live blocks"),
                spec.moves_blocks,
                "{}: {text}",
                spec.name
            );
            let picks = [spec.pytorch, spec.rmm];
            assert_eq!(
                text.contains("nothing outside cudamem runs it"),
                spec.rust.is_none() && picks.iter().all(Option::is_none),
                "{}: {text}",
                spec.name
            );
            // A framework's program holds plain pointers: no block may move.
            assert!(
                !spec.moves_blocks || picks.iter().all(Option::is_none),
                "{} moves blocks yet a framework can pick it",
                spec.name
            );
        }
        let expandable = named("pytorch-expandable").unwrap();
        let text = expandable.summary(&Settings::default());
        assert!(
            text.contains("up to 1.00 MiB")
                && text.contains("2.00 MiB pages")
                && text.contains("20.0 MiB pages")
                && text.contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
            "{text}"
        );
    }
}
