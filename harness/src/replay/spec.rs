//! Every policy a trace can be replayed through, as one table of specs:
//! its name, what it is, whether it moves blocks, how a user gets it outside
//! cudamem, and how to build it. A new policy is one entry in [`POLICIES`];
//! the command line, the tables, the JSON and the report read the table.

use std::fmt;

use anyhow::Result;
use ctx::CompactionPolicy;
use memcore::bytes::human;
use memcore::{Fit, PAGE_BYTES, STITCH_ALIGN, StitchConfig, VIRTUAL_BYTES, pytorch};
use serde::Serialize;

use crate::replay::baseline::{OffsetAllocatorPolicy, RangeAllocPolicy};
use crate::replay::device;
use crate::replay::policy::{self, Arena, GRANULE};
use crate::replay::pool_policy::{self, PoolPolicy};
use crate::replay::stitch_policy::{ExpandablePolicy, StitchPolicy};
use crate::replay::{Done, Pass};
use crate::trace::Trace;

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
}

impl Default for Settings {
    /// A growing arena, memcore's stitching defaults, no GPU: what
    /// `cudamem replay` runs with no option (a test holds the two equal).
    fn default() -> Self {
        Self {
            arena: Arena::Growable,
            stitch: StitchConfig::default(),
            gpu: None,
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
            "Moves live blocks (compaction): only for callers that hold handles, not pointers."
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
            "a reference free list: each request takes the lowest free range that fits".into()
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
            "the same free list, taking the smallest free range that fits: how RMM's \
             pool_memory_resource places blocks (that pool grows by whole steps of its own, so \
             it holds at least this footprint)"
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
            "two-level segregated fit (TLSF): constant-time allocate and free over size \
             classes, in one address range grown at its end, never moving a block"
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
            "a compacting pool (TLSF whose blocks the caller names by handles, so they can \
             move), set to grow the least: when a request does not fit, it first moves the \
             fewest blocks that make room; when no move can, it slides every block down and \
             grows by what is still missing"
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
            pass.run(&mut PoolPolicy::new(&pool, settings.arena))
        },
    },
    PolicySpec {
        name: "pool-vmm",
        describe: |_| {
            format!(
                "the compacting pool as it runs on a GPU: moves blocks to close gaps before it \
                 grows, and grows by mapping {} pages of virtual memory",
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
            pass.run(&mut PoolPolicy::new(&pool, settings.arena))
        },
    },
    PolicySpec {
        name: "offset-allocator",
        describe: |_| {
            "the offset-allocator crate (Sebastian Aaltonen's OffsetAllocator): constant-time, in \
             one fixed arena"
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
        describe: |_| {
            "the range-alloc crate (wgpu's range allocator): best fit, grown at its end".into()
        },
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
        describe: |settings| describe_stitch("cudamem's stitching allocator", &settings.stitch),
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
                 rounded up to {} blocks; those up to {} in the small pool's segment, grown by {} \
                 pages, the rest in the large pool's, grown by {} pages; best fit over what is \
                 mapped, pages mapped at the end and kept",
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
                "the stitching pool on {on}: the stitch policy carried out through the driver's \
                 virtual memory calls, each allocate and free timed; its footprint and driver calls are the \
                 stitch row's, and what the device measured is listed under the table"
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

/// What a stitching allocator with `config` does, after `what`: the
/// placement, the handles, the budget and the idle cache, as memcore's
/// `Stitch` carries them out.
fn describe_stitch(what: &str, config: &StitchConfig) -> String {
    let large = u64::from(config.large_pages) * PAGE_BYTES;
    let mut text = format!(
        "{what}: blocks at any {} address{} in a {} virtual range, placed by TLSF preferring low \
         addresses (close to best fit, so blocks stay dense on few pages); ",
        human(STITCH_ALIGN),
        if config.align_large && config.large_pages > 1 && large.is_power_of_two() {
            format!(
                " (requests of {} or more at a multiple of it)",
                human(large)
            )
        } else {
            String::new()
        },
        human(VIRTUAL_BYTES),
    );
    let budget = format!(
        "a budget of {} over the most bytes live so far",
        permille(config.slack_permille)
    );
    if config.large_pages > 1 {
        text += &format!(
            "a {large} chunk no handle backs yet gets one {large} handle while that keeps the \
             footprint within {budget} (a new handle may pass it by {} of its bytes){}, else its \
             pages get {page} handles, idle ones first (moved from the highest place they are \
             mapped), then new ones; ",
            permille(config.overshoot_permille),
            if config.grow_in_large {
                " or nothing is idle"
            } else {
                ""
            },
            large = human(large),
            page = human(PAGE_BYTES),
        );
    } else {
        text += &format!(
            "every page a live block touches is backed by its own {} handle, created while the \
             footprint stays within {budget}, else moved from an idle page; ",
            human(PAGE_BYTES)
        );
    }
    text += "handles no live block touches stay mapped for the next request";
    if config.keep_idle_bytes > 0 {
        text += &format!(
            " ({} of them even past the budget)",
            human(config.keep_idle_bytes)
        );
    }
    text + "; footprint is the bytes in created handles"
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
            clap::builder::PossibleValue::new(spec.name).help((spec.describe)(&Settings::default()))
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
            "any 512 B address",
            "128 TiB virtual range",
            "TLSF preferring low addresses",
            "one 32.0 MiB handle",
            "a budget of 2% over the most bytes live so far",
            "by 100% of its bytes) or nothing is idle, else",
            "2.00 MiB handles",
            "Never moves a block.",
            "To use it: from PyTorch, CUDAMEM_POLICY=stitch with cudamem_torch; from Rust, ctx::StitchedPool.",
        ] {
            assert!(text.contains(said), "{said:?} not in {text}");
        }
        assert!(!text.contains("best fit in"), "{text}");
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
        assert!(text.contains("its own 2.00 MiB handle"), "{text}");
        assert!(text.contains("a budget of 2.5% over"), "{text}");
        assert!(
            text.contains("64.0 MiB of them even past the budget"),
            "{text}"
        );
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
