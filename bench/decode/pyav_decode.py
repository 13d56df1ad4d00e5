#!/usr/bin/env python3
"""PyAV side of `datahelix decode-bench`: produce the same sampled frames at the same size.

Reads a plan (JSON lines written by decode-bench: path, frame indices, scaled size, crop),
decodes every clip on one thread with PyAV, the way a Python data loader does it: seek to
the keyframe before a sampled frame when one lies ahead, demux and decode forward, convert
the sampled frames to RGB24 at the scaled size with bilinear interpolation (libswscale, as
DataHelix and the ffmpeg CLI use), crop. Prints one JSON object:
{"clips": N, "frames": F, "seconds": S, "clips_per_s": N/S, "skip_nonref": bool}.

--skip-nonref gives PyAV the skipping DataHelix does: before each packet is sent to the
decoder, codec_context.skip_frame is set to "NONREF" when the packet's frame is not sampled
and to "DEFAULT" when it is, so non-reference frames nobody asked for are not decoded
(reference frames always are: later frames need them).

--dump FILE writes every produced frame (cropped, RGB24, plan order) to FILE, for
decode-bench's pixel check.

usage: pyav_decode.py PLAN.jsonl [--rounds R] [--skip-nonref] [--dump FILE]
"""
import argparse
import json
import sys
import time

import av


def decode_clip(item, skip_nonref, dump):
    """Returns the number of frames produced for one clip of the plan."""
    targets = item["indices"]
    wanted = set(targets)
    scaled_w, scaled_h = item["scaled_width"], item["scaled_height"]
    x, y, w, h = item["crop_x"], item["crop_y"], item["width"], item["height"]
    produced = 0
    with av.open(item["path"]) as container:
        stream = container.streams.video[0]
        stream.thread_type = "SLICE"
        stream.thread_count = 1
        ctx = stream.codec_context
        rate = stream.average_rate
        tb = stream.time_base
        keyframes = item.get("keyframes") or [0]
        position = -1  # index of the next frame the decoder will output
        frames = None

        def decoded():
            for packet in container.demux(stream):
                if skip_nonref:
                    skip = packet.pts is not None and \
                        int(round(packet.pts * tb * rate)) not in wanted
                    ctx.skip_frame = "NONREF" if skip else "DEFAULT"
                yield from ctx.decode(packet)

        for target in targets:
            kf = max(k for k in keyframes if k <= target) if keyframes[0] <= target else 0
            if position < 0 or target < position or kf > position:
                pts = int(round(kf / rate / tb))
                container.seek(pts, stream=stream, backward=True, any_frame=False)
                frames = decoded()
                position = -1
            for frame in frames:
                index = int(round(frame.pts * tb * rate)) if frame.pts is not None \
                    else position + 1
                position = index + 1
                if index == target:
                    rgb = frame.reformat(width=scaled_w, height=scaled_h, format="rgb24",
                                         interpolation="BILINEAR").to_ndarray()
                    out = rgb[y:y + h, x:x + w].copy()
                    if dump is not None:
                        dump.write(out.tobytes())
                    produced += 1
                    break
    return produced


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("plan")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--skip-nonref", action="store_true",
                        help="skip_frame=NONREF for packets of frames not sampled")
    parser.add_argument("--dump", help="write the produced frames (RGB24) to this file")
    args = parser.parse_args()
    with open(args.plan) as f:
        plan = [json.loads(line) for line in f if line.strip()]
    dump = open(args.dump, "wb") if args.dump else None
    best = None
    frames = 0
    for _ in range(1 if dump else args.rounds):
        start = time.perf_counter()
        frames = sum(decode_clip(item, args.skip_nonref, dump) for item in plan)
        seconds = time.perf_counter() - start
        best = seconds if best is None else min(best, seconds)
    if dump:
        dump.close()
    expected = sum(len(item["indices"]) for item in plan)
    if frames != expected:
        print(f"pyav_decode: produced {frames} frames, the plan asks for {expected}",
              file=sys.stderr)
        return 1
    print(json.dumps({"clips": len(plan), "frames": frames, "seconds": best,
                      "clips_per_s": len(plan) / best, "skip_nonref": args.skip_nonref}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
