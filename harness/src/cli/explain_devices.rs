//! `cudamem explain --device all`: the ledger of every device of the host,
//! then the peer links: which device can read and write which other's
//! memory (`cuDeviceCanAccessPeer`), and whether a VMM grant of one page
//! (`cuMemSetAccess`, what a pool with `PoolConfig::peers` does) works.

use std::fmt::Write as _;

use anyhow::Result;
use ctx::PeerLinks;
use serde_json::{Value, json};

use crate::cli::explain::ExplainArgs;

/// Whether device `peer` was granted one page of device `owner`'s memory.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The device whose memory was granted.
    pub owner: u32,
    /// The device granted access.
    pub peer: u32,
    /// `Ok`, or the error the grant ended with.
    pub outcome: Result<(), String>,
}

/// Run `cudamem explain --device all`.
#[cfg(not(feature = "cuda"))]
pub fn run(_args: &ExplainArgs, _out: &mut dyn std::io::Write) -> Result<()> {
    Err(anyhow::anyhow!(
        "--device all: cudamem was built without the cuda feature; rebuild with \
         `--features cuda` to measure the GPUs, or use --profile"
    ))
}

/// Run `cudamem explain --device all`, writing the ledgers to `out`.
#[cfg(feature = "cuda")]
pub fn run(args: &ExplainArgs, out: &mut dyn std::io::Write) -> Result<()> {
    use anyhow::{Context, bail};
    use ctx::CudaContext;

    use crate::cli::explain;

    let count = CudaContext::device_count()?;
    if count == 0 {
        bail!("--device all: the driver sees no CUDA device");
    }
    let mut ledgers = Vec::new();
    for ordinal in 0..count {
        let explained =
            explain::measure(ordinal, args).with_context(|| format!("device {ordinal}"))?;
        explained
            .ledger
            .check_fits()
            .with_context(|| format!("device {ordinal}: the ledger"))?;
        ledgers.push(explained);
    }
    let links = CudaContext::peer_links()?;
    let mut grants = Vec::new();
    for owner in 0..links.device_count() {
        for peer in (0..links.device_count()).filter(|&peer| peer != owner) {
            grants.push(Grant {
                owner,
                peer,
                outcome: grant_one_page(owner, peer).map_err(|e| e.to_string()),
            });
        }
    }
    if args.json {
        let devices: Vec<Value> = ledgers
            .iter()
            .map(|e| explain::to_json(e, &args.kernel_local_bytes))
            .collect();
        let value = json!({
            "devices": devices,
            "peer_links": links_json(&links, &grants),
        });
        writeln!(out, "{}", serde_json::to_string(&value)?)?;
    } else {
        for (ordinal, explained) in ledgers.iter().enumerate() {
            writeln!(
                out,
                "== device {ordinal}: {} ==",
                explained.profile.full_name
            )?;
            write!(out, "{}", crate::cli::explain::text(explained))?;
            writeln!(out)?;
        }
        write!(out, "{}", links_text(&links, &grants))?;
    }
    Ok(())
}

/// Maps one page of `owner`'s memory and grants it to `peer`, as a pool
/// with peers does for every mapping; everything is given back after.
#[cfg(feature = "cuda")]
fn grant_one_page(owner: u32, peer: u32) -> ctx::Result<()> {
    use ctx::{CudaContext, CudaDevice, DeviceMemory, PeerSet};

    let context = CudaContext::new(owner)?;
    let mut device = CudaDevice::new(&context)?;
    let page = device.granularity();
    let base = device.reserve(page)?;
    let handle = device.create_physical(page)?;
    device.map_physical(handle, base)?;
    device.grant_access(base, page, PeerSet::of(&[owner])?)?;
    let granted = device.grant_access(base, page, PeerSet::of(&[peer])?);
    device.unmap_physical(base, page)?;
    device.release_physical(handle)?;
    device.release(base, page)?;
    granted
}

/// The peer links as text: the `cuDeviceCanAccessPeer` matrix, then each
/// grant's outcome.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn links_text(links: &PeerLinks, grants: &[Grant]) -> String {
    let count = links.device_count();
    let mut text = String::from(
        "== peer links ==\ncuDeviceCanAccessPeer: can the row's device access the column's memory\n",
    );
    let _ = write!(text, "{:>8}", "");
    for to in 0..count {
        let _ = write!(text, "{:>6}", format!("gpu{to}"));
    }
    text.push('\n');
    for from in 0..count {
        let _ = write!(text, "{:>8}", format!("gpu{from}"));
        for to in 0..count {
            let cell = if from == to {
                "-"
            } else if links.can_access(from, to) {
                "yes"
            } else {
                "no"
            };
            let _ = write!(text, "{cell:>6}");
        }
        text.push('\n');
    }
    if count < 2 {
        text.push_str("one device: no peers\n");
        return text;
    }
    text.push_str("VMM grant of one page (cuMemSetAccess, as a pool with peers makes):\n");
    for grant in grants {
        let outcome = match &grant.outcome {
            Ok(()) => "ok".to_owned(),
            Err(why) => format!("failed: {why}"),
        };
        let _ = writeln!(
            text,
            "  gpu{} -> memory of gpu{}: {outcome}",
            grant.peer, grant.owner
        );
    }
    text
}

/// The peer links as JSON: one entry per ordered pair of devices.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn links_json(links: &PeerLinks, grants: &[Grant]) -> Value {
    let count = links.device_count();
    let mut pairs = Vec::new();
    for from in 0..count {
        for to in (0..count).filter(|&to| to != from) {
            let grant = grants.iter().find(|g| g.peer == from && g.owner == to);
            pairs.push(json!({
                "from": from,
                "to": to,
                "can_access_peer": links.can_access(from, to),
                "vmm_grant_ok": grant.map(|g| g.outcome.is_ok()),
                "vmm_grant_error": grant.and_then(|g| g.outcome.clone().err()),
            }));
        }
    }
    Value::Array(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grants() -> Vec<Grant> {
        vec![
            Grant {
                owner: 0,
                peer: 1,
                outcome: Ok(()),
            },
            Grant {
                owner: 1,
                peer: 0,
                outcome: Err("device 0 cannot access memory of device 1: no".into()),
            },
        ]
    }

    #[test]
    fn the_matrix_reads_row_to_column() {
        let links = PeerLinks::none(2).with(1, 0);
        let text = links_text(&links, &grants());
        let rows: Vec<&str> = text.lines().collect();
        assert_eq!(
            rows[2].split_whitespace().collect::<Vec<_>>(),
            ["gpu0", "gpu1"]
        );
        assert_eq!(
            rows[3].split_whitespace().collect::<Vec<_>>(),
            ["gpu0", "-", "no"]
        );
        assert_eq!(
            rows[4].split_whitespace().collect::<Vec<_>>(),
            ["gpu1", "yes", "-"]
        );
        assert!(text.contains("gpu1 -> memory of gpu0: ok"), "{text}");
        assert!(
            text.contains("gpu0 -> memory of gpu1: failed: device 0"),
            "{text}"
        );
    }

    #[test]
    fn one_device_has_no_peers() {
        let text = links_text(&PeerLinks::none(1), &[]);
        assert!(text.ends_with("one device: no peers\n"), "{text}");
    }

    #[test]
    fn json_has_every_ordered_pair() {
        let links = PeerLinks::all(2);
        let value = links_json(&links, &grants());
        let pairs = value.as_array().unwrap();
        assert_eq!(pairs.len(), 2);
        assert_eq!(pairs[0]["from"], 0);
        assert_eq!(pairs[0]["to"], 1);
        assert_eq!(pairs[0]["can_access_peer"], true);
        // Device 0 granted memory of device 1: the failed grant.
        assert_eq!(pairs[0]["vmm_grant_ok"], false);
        assert_eq!(pairs[1]["vmm_grant_ok"], true);
        assert!(pairs[1]["vmm_grant_error"].is_null());
    }
}
