#!/usr/bin/env python3
"""Write hostile inputs for cudamem into a folder, one file per case.

Each case is small on disk and built to cost a reader or a policy a lot:
compression bombs, pickles whose memo references multiply what they hold,
sums that would wrap, control characters, formats cudamem does not read.
`run.sh` replays each under a memory and time limit.

usage: gen.py OUT_DIR
"""

import bz2
import gzip
import lzma
import os
import pickle
import struct
import sys
import zlib

HEADER = "Thread,Time,Action,Pointer,Size,Stream\n"


def proto(body: bytes) -> bytes:
    return b"\x80\x04" + body + b"."


def short_str(text: str) -> bytes:
    data = text.encode()
    return b"\x8c" + bytes([len(data)]) + data


def uint(value: int) -> bytes:
    return b"\x8a\x09" + value.to_bytes(8, "little") + b"\x00"


def snapshot(segments, device_traces) -> bytes:
    return pickle.dumps({"segments": segments, "device_traces": device_traces}, protocol=4)


def cases():
    # CSV: a gzip of one alloc/free pair repeated 20 million times.
    rows = "0,0,allocate,0x1000,512,0\n0,0,free,0x1000,512,0\n" * 2_000_000
    yield "csv_repeat.csv.gz", gzip.compress((HEADER + rows * 10).encode(), 9)
    # CSV: one row per distinct pointer, never freed, in a gzip.
    live = "".join(f"0,0,allocate,0x{0x1000 + i * 512:x},512,0\n" for i in range(400_000))
    yield "csv_live.csv.gz", gzip.compress((HEADER + live).encode(), 9)
    # CSV: sizes that together pass 2^64.
    yield "csv_wrap.csv", (HEADER + "".join(
        f"0,0,allocate,0x{i + 1:x},{(1 << 48)},0\n" for i in range(70_000))).encode()
    # CSV: pairs of the largest request, page-heavy for stitched models.
    yield "csv_huge_pairs.csv", (HEADER + "0,0,allocate,0x1000,281474976710656,0\n"
                                 "0,0,free,0x1000,281474976710656,0\n" * 500).encode()
    # CSV: a request just under 2^47 with many small live blocks beside it.
    small = "".join(f"0,0,allocate,0x{0x10_0000 + i * 4096:x},4096,0\n" for i in range(50_000))
    yield "csv_mixed_huge.csv", (HEADER + small + "0,0,allocate,0x1,140737488355000,0\n").encode()
    # CSV: an endless field (no line end) in a gzip.
    yield "csv_endless.csv.gz", gzip.compress((HEADER + "0," + "9" * (50 << 20)).encode(), 9)
    # CSV: header only, then NUL bytes.
    yield "csv_nuls.csv", HEADER.encode() + b"\0" * (1 << 20)
    # CSV: control characters in the action.
    yield "csv_escape.csv", (HEADER + "0,0,\x1b]0;owned\x07,0x1000,512,0\n").encode()
    # gzip: many empty members, then a real one.
    yield "gz_members.csv.gz", gzip.compress(b"") * 200_000 + gzip.compress(
        (HEADER + "0,0,allocate,0x1000,512,0\n").encode())
    # gzip with trailing zeros (accepted), and with trailing garbage (refused).
    good = gzip.compress((HEADER + "0,0,allocate,0x1000,512,0\n").encode())
    yield "gz_padded.csv.gz", good + b"\0" * 4096
    yield "gz_garbage.csv.gz", good + b"PK\x03\x04"
    # Other compressions under a .gz name.
    yield "zlib.csv.gz", zlib.compress(HEADER.encode())
    yield "bz2.csv.gz", bz2.compress(HEADER.encode())
    yield "xz.csv.gz", lzma.compress(HEADER.encode())
    yield "zstd.csv.gz", b"\x28\xb5\x2f\xfd" + b"\0" * 32
    # Pickles of old protocols.
    yield "proto0.pickle", pickle.dumps({"segments": []}, protocol=0)
    yield "proto1.pickle", pickle.dumps({"segments": []}, protocol=1)
    # Pickle bombs in a gzip: DUP storms, nested empty tuples, big memo indices.
    yield "pk_dup.pickle.gz", gzip.compress(proto(b"N" + b"2" * (200 << 20)), 9)
    yield "pk_tuples.pickle.gz", gzip.compress(proto(b")" + b"\x85" * (100 << 20)), 9)
    yield "pk_sparse_memo.pickle", proto(b"N" + b"".join(
        b"r" + struct.pack("<I", 0xFFFF_0000 - i) for i in range(500_000)))
    yield "pk_setitems.pickle.gz", gzip.compress(proto(
        b"}(" + short_str("k") + b"N" + (b"2" * 2) * (40 << 20) + b"u"), 9)
    # Pickle (Python's own, which shares by memo): one list of entries
    # standing for 30,000 devices.
    entries = [{"action": "alloc", "addr": 0x1000 + i * 512, "size": 512} for i in range(200)]
    yield "pk_shared_devices.pickle", snapshot([], [entries] * 30_000)
    # Pickle: one block dict shared by a segment 100,000 times.
    blk = {"address": 0x1000, "size": 512, "requested_size": 512, "state": "inactive"}
    shared = [blk] * 100_000
    yield "pk_shared_blocks.pickle", snapshot(
        [{"address": 0x1000, "total_size": 512 * 100_000, "blocks": shared}], [])
    # Pickle: a frames list of 100,000 frames shared by 20,000 live blocks.
    frames = [{"filename": f"/x/{i}.so", "line": i, "name": "f"} for i in range(100_000)]
    live_blocks = [{"address": 0x1000 + i * 512, "size": 512, "requested_size": 512,
                    "state": "active_allocated", "frames": frames} for i in range(20_000)]
    yield "pk_shared_frames.pickle", snapshot(
        [{"address": 0x1000, "total_size": 512 * 20_000, "blocks": live_blocks}], [])
    # Pickle: free blocks whose sizes sum past 2^64 inside one segment.
    wrap = [{"size": (1 << 63), "state": "inactive"}, {"size": (1 << 63), "state": "inactive"}]
    yield "pk_wrap_blocks.pickle", snapshot([{"address": 0, "total_size": 0, "blocks": wrap}], [])
    # Pickle: segments summing past 2^64 across segments.
    segs = [{"address": i << 62, "total_size": 1 << 63,
             "blocks": [{"size": 1 << 63, "state": "inactive"}]} for i in range(2)]
    yield "pk_wrap_segments.pickle", snapshot(segs, [])
    # Pickle: control characters in every string a report shows.
    esc = "\x1b[2J\x1b]0;owned\x07"
    yield "pk_escape.pickle", snapshot([{
        "address": 0x1000, "total_size": 512, "segment_type": esc,
        "blocks": [{"address": 0x1000, "size": 512, "requested_size": 512,
                    "state": "active_allocated",
                    "frames": [{"filename": esc + ".py", "line": 1, "name": esc}]}]}], [])
    # Pickle: integers of every width in fields.
    yield "pk_bigints.pickle", snapshot([], [[{"action": "alloc", "addr": 1 << 200, "size": 512}]])
    yield "pk_negative.pickle", snapshot([], [[{"action": "alloc", "addr": 0x1000, "size": -1}]])
    # Pickle: a dict whose keys are all "action", 1 million times.
    body = b"}\x94(" + short_str("segments") + b"]" + short_str("device_traces") + b"]](}("
    body += (short_str("action") + short_str("snapshot")) * 1_000_000
    yield "pk_repeated_keys.pickle", proto(body + b"uaau")
    # CSV: 3,000 live requests of 40 GiB (huge: a handle each), then freed.
    huge = [f"0,0,allocate,0x{0x1000 + i * (1 << 44):x},{40 << 30},0\n" for i in range(3_000)]
    yield "csv_live_huge.csv", (HEADER + "".join(huge) + "".join(
        row.replace("allocate", "free") for row in huge)).encode()
    # CSV: the largest request that is not huge (16,384 pages), 4,096 live: the
    # page table's worst case within the model's steps.
    yield "csv_live_just_under_huge.csv", (HEADER + "".join(
        f"0,0,allocate,0x{0x1000 + i * (1 << 40):x},{(32 << 30) - 512},0\n"
        for i in range(4_096))).encode()
    # CSV: a small block between every two huge ones, so small blocks sit far
    # apart in the arena.
    yield "csv_interleaved_huge.csv", (HEADER + "".join(
        f"0,0,allocate,0x{(i + 1) << 44:x},{40 << 30},0\n"
        f"0,0,allocate,0x{((i + 1) << 44) + (1 << 43):x},512,0\n" for i in range(2_000))).encode()
    # CSV: random sizes up to 4 MiB, a little more allocated than freed: every
    # request plans a compaction over thousands of live blocks.
    state, live, rows = 0x2545F4914F6CDD1D, [], []
    for i in range(100_000):
        state ^= (state << 13) & (2**64 - 1)
        state ^= state >> 7
        state ^= (state << 17) & (2**64 - 1)
        if live and state % 100 < 45:
            pointer, size = live.pop(state % len(live))
            rows.append(f"0,0,free,0x{pointer:x},{size},0\n")
        else:
            block = (0x1000 + i * 0x10_0000_0000, 1 + (state >> 8) % (4 << 20))
            live.append(block)
            rows.append(f"0,0,allocate,0x{block[0]:x},{block[1]},0\n")
    yield "csv_planning_storm.csv.gz", gzip.compress((HEADER + "".join(rows)).encode(), 9)
    # A small trace for the argument cases run.sh adds.
    yield "small.csv", (HEADER + "0,0,allocate,0x1000,4096,0\n0,0,allocate,0x2000,8192,0\n"
                        "0,0,free,0x1000,4096,0\n0,0,free,0x2000,8192,0\n").encode()
    # Pickle: many devices, each its own small list (not shared): 5,000 traces.
    yield "pk_many_devices.pickle", snapshot([], [[
        {"action": "alloc", "addr": 0x1000, "size": 512},
        {"action": "free_requested", "addr": 0x1000, "size": 512}] for _ in range(5_000)])
    # Pickle: 65,537 frees of never-allocated 2^48-byte blocks.
    yield "pk_unknown_frees.pickle", snapshot([], [[
        {"action": "free_requested", "addr": 0x1000 + i * 4096, "size": 1 << 48}
        for i in range(65_537)]])
    # Pickle: a 2^48 request beside ordinary ones, as PyTorch would record it.
    yield "pk_huge_request.pickle", snapshot([], [[
        {"action": "alloc", "addr": 0x1000, "size": 1 << 48},
        {"action": "alloc", "addr": 1 << 50, "size": 512},
        {"action": "free_requested", "addr": 0x1000, "size": 1 << 48}]])
    # Pickle: deep nesting of lists with marks.
    yield "pk_deep_marks.pickle", proto(b"(" * 2_000 + b"N")
    yield "pk_deep_lists.pickle", proto(b"]" * 5_000_000)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, data in cases():
        with open(os.path.join(out, name), "wb") as file:
            file.write(data)


if __name__ == "__main__":
    main()
