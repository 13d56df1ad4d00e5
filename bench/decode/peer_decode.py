#!/usr/bin/env python3
"""The other peers of `datahelix decode-bench`: decord, SPDL and torchcodec produce the same
sampled frames as pyav_decode.py (the plan's frame indices, scaled to scaled_width x
scaled_height, RGB24, the same crop), one decoder thread, timed the same way (the plan is
shared: load_plan, crop_box and run_rounds come from pyav_decode.py).

- decord: decord.VideoReader(path, width=SW, height=SH, num_threads=1).get_batch(indices),
  then the crop. decord scales with its own filter graph (its scaler flags, not bilinear).
- spdl: spdl.io.demux_video(path), then spdl.io.sample_decode_video(packets, indices) with
  a filter "scale=SW:SH:flags=bilinear,format=rgb24,crop=W:H:X:Y" (SPDL decodes on one
  thread by default; threads=1 is passed anyway).
- torchcodec: torchcodec.decoders.VideoDecoder(path, num_ffmpeg_threads=1,
  transforms=[Resize((SH, SW))]).get_frames_at(indices), HWC, then the crop.

A peer that cannot be imported prints {"reason": "..."} (not installed: the pip command;
otherwise the import error's first line) and exits 3; decode-bench shows the reason in its
column. Otherwise prints what pyav_decode.py prints, with "peer".

usage: peer_decode.py PLAN.jsonl --peer decord|spdl|torchcodec [--rounds R] [--dump FILE]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pyav_decode import crop_box, load_plan, run_rounds  # noqa: E402

PEERS = {"decord": "decord", "spdl": "spdl.io", "torchcodec": "torchcodec.decoders"}
INSTALL = "pip install -r bench/decode/requirements.txt"


def import_peer(peer):
    """The peer's module, or (None, reason)."""
    import importlib
    try:
        return importlib.import_module(PEERS[peer]), None
    except ModuleNotFoundError as e:
        if e.name and PEERS[peer].startswith(e.name.split(".")[0]):
            return None, f"not installed: {INSTALL}"
        first = (str(e).splitlines() or [""])[0]
        return None, f"import {PEERS[peer]}: {type(e).__name__}: {first}"
    except Exception as e:  # noqa: BLE001 - any import failure is the column's reason
        first = (str(e).splitlines() or [""])[0]
        return None, f"import {PEERS[peer]}: {type(e).__name__}: {first}"


def write(array, item, dump):
    """Crops each frame of `array` (N, SH, SW, 3) and dumps it; returns N."""
    x, y, w, h = crop_box(item)
    if dump is not None:
        for frame in array:
            dump.write(frame[y:y + h, x:x + w].copy().tobytes())
    else:
        array[:, y:y + h, x:x + w].copy()
    return len(array)


def decoder(peer, mod):
    """decode(item, dump) -> frames produced, for this peer."""
    if peer == "decord":
        ctx = mod.cpu(0)

        def decode(item, dump):
            vr = mod.VideoReader(item["path"], ctx=ctx, width=item["scaled_width"],
                                 height=item["scaled_height"], num_threads=1)
            return write(vr.get_batch(item["indices"]).asnumpy(), item, dump)
        return decode
    if peer == "spdl":
        import numpy as np
        config = mod.decode_config(decoder_options={"threads": "1"})

        def decode(item, dump):
            x, y, w, h = crop_box(item)
            desc = (f"scale={item['scaled_width']}:{item['scaled_height']}:flags=bilinear,"
                    f"format=rgb24,crop={w}:{h}:{x}:{y}")
            packets = mod.demux_video(item["path"])
            frames = mod.sample_decode_video(packets, list(item["indices"]),
                                             decode_config=config, filter_desc=desc)
            array = np.stack([mod.to_numpy(mod.convert_frames(f)) for f in frames])
            array = array.reshape(len(frames), h, w, 3)
            if dump is not None:
                dump.write(array.tobytes())
            return len(array)
        return decode
    from torchcodec.transforms import Resize  # torchcodec loaded: its transforms too

    def decode(item, dump):
        dec = mod.VideoDecoder(item["path"], num_ffmpeg_threads=1, dimension_order="NHWC",
                               transforms=[Resize((item["scaled_height"], item["scaled_width"]))])
        return write(dec.get_frames_at(item["indices"]).data.numpy(), item, dump)
    return decode


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("plan")
    parser.add_argument("--peer", required=True, choices=sorted(PEERS))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--dump", help="write the produced frames (RGB24) to this file")
    args = parser.parse_args()
    mod, reason = import_peer(args.peer)
    if mod is None:
        print(json.dumps({"peer": args.peer, "reason": reason}))
        return 3
    plan = load_plan(args.plan)
    dump = open(args.dump, "wb") if args.dump else None
    try:
        return run_rounds(plan, decoder(args.peer, mod), args.rounds, dump, {"peer": args.peer})
    except Exception as e:  # noqa: BLE001 - a failing peer is a column with its reason
        first = (str(e).splitlines() or [""])[0]
        print(json.dumps({"peer": args.peer, "reason": f"{type(e).__name__}: {first}"}))
        return 3
    finally:
        if dump:
            dump.close()


if __name__ == "__main__":
    sys.exit(main())
