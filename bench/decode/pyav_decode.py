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


def load_plan(path):
    """The plan decode-bench wrote: one dict per clip (path, indices, keyframes,
    scaled_width/height: the size the frame is scaled to, crop_x/y, width/height: the
    rectangle kept of the scaled frame)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def crop_box(item):
    """(x, y, w, h): the rectangle kept of the frame scaled to scaled_width x scaled_height."""
    return item["crop_x"], item["crop_y"], item["width"], item["height"]


def run_rounds(plan, decode, rounds, dump, extra=None):
    """Times `decode(item, dump) -> frames produced` over the plan, best of `rounds` (one
    round when dumping), checks the frame count and prints the JSON report (with `extra`
    keys). Returns the exit status."""
    best = None
    frames = 0
    for _ in range(1 if dump else rounds):
        start = time.perf_counter()
        frames = sum(decode(item, dump) for item in plan)
        seconds = time.perf_counter() - start
        best = seconds if best is None else min(best, seconds)
    expected = sum(len(item["indices"]) for item in plan)
    if frames != expected:
        print(f"produced {frames} frames, the plan asks for {expected}")
        return 1
    report = {"clips": len(plan), "frames": frames, "seconds": best,
              "clips_per_s": len(plan) / best}
    report.update(extra or {})
    print(json.dumps(report))
    return 0


def decode_clip(item, skip_nonref, dump):
    """Returns the number of frames produced for one clip of the plan."""
    targets = item["indices"]
    wanted = set(targets)
    scaled_w, scaled_h = item["scaled_width"], item["scaled_height"]
    x, y, w, h = crop_box(item)
    produced = 0
    import av  # here, so the peers (peer_decode.py) can import this file's helpers without it
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
    plan = load_plan(args.plan)
    dump = open(args.dump, "wb") if args.dump else None
    try:
        return run_rounds(plan, lambda item, out: decode_clip(item, args.skip_nonref, out),
                          args.rounds, dump, {"skip_nonref": args.skip_nonref})
    finally:
        if dump:
            dump.close()

if __name__ == "__main__":
    sys.exit(main())
