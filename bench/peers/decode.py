"""PyAV decode and collate shared by the torch and Ray peers (bench/peers/README.md).

The same frames at the same size as the DataHelix video pipeline, the way a Python data
loader does it (the approach of bench/decode/pyav_decode.py, which `datahelix decode-bench`
uses for its PyAV column):

- sampling: the profile's `frames` frames spread uniformly over the clip, frame k being
  floor((2k + 1) * count / (2 * frames)) (src/media/sampling.c, "uniform");
- resize: short side first (bilinear, libswscale through PyAV's reformat) so that the clip
  covers height x width, then a centre crop (src/bench/decode_bench.c, write_pyav_plan);
- output: uint8 RGB, T x 3 x H x W;
- decode: one thread per clip; the keyframe positions come from one demux pass over the
  packets (no decoding); the decoder seeks to the keyframe before a sampled frame only when
  that keyframe lies ahead of where it is, and decodes forward;
- skipping (mode "skip", the default of run_peers.py's --pyav): before each packet is sent
  to the decoder, codec_context.skip_frame is "NONREF" when the packet's frame is not
  sampled and "DEFAULT" when it is, so non-reference frames nobody asked for are not
  decoded (reference frames always are: later frames are predicted from them), the
  non-reference skipping DataHelix's decoder does (bench/decode/pyav_decode.py
  --skip-nonref, the PyAV column of `datahelix decode-bench`). A skipped frame is one no
  other frame is predicted from, so the sampled frames are the same as in mode "plain",
  which decodes every frame (tests/python/test_bench_peers.py checks it).

collate() pads a batch to its largest T, H and W, with a B x T mask of the real frames;
each sample's tokens are common.sample_tokens: the decoded clip's visual tokens plus its
caption tokens (the token source every system's emulated compute uses).
"""
import math

import av
import numpy as np

import common

MODES = ("skip", "plain")  # --pyav: skip non-reference frames not sampled, or decode all


def _lround(x):
    """C's lround for x >= 0 (Python's round() rounds half to even)."""
    return int(math.floor(x + 0.5))


def uniform_indices(frames, count):
    """Frame k of `frames` spread over `count`: the middle of the k-th equal segment."""
    return [(2 * k + 1) * count // (2 * frames) for k in range(frames)]


def scaled_size(src_w, src_h, width, height):
    """(scaled_w, scaled_h, crop_x, crop_y) of short-side resize + centre crop."""
    scale = max(width / src_w, height / src_h)
    sw = max(_lround(src_w * scale), width)
    sh = max(_lround(src_h * scale), height)
    return sw, sh, (sw - width) // 2, (sh - height) // 2


def _keyframes(container, stream, rate, tb):
    keyframes = []
    for packet in container.demux(stream):
        if packet.pts is not None and packet.is_keyframe:
            keyframes.append(_lround(float(packet.pts * tb * rate)))
    return sorted(keyframes) or [0]


def _decoded(container, stream, wanted, rate, tb):
    """Frames from the current position: demux, and (wanted: the sampled frame indices, or
    None for plain decoding) skip non-reference frames that are not wanted."""
    ctx = stream.codec_context
    for packet in container.demux(stream):
        if wanted is not None:
            skip = (packet.pts is not None
                    and _lround(float(packet.pts * tb * rate)) not in wanted)
            ctx.skip_frame = "NONREF" if skip else "DEFAULT"
        yield from ctx.decode(packet)


def decode_sample(path, frames, height, width, mode="skip"):
    """Decodes one clip: a uint8 array frames x 3 x height x width (RGB). mode: "skip"
    (non-reference frames not sampled are not decoded) or "plain" (every frame is)."""
    if mode not in MODES:
        raise ValueError(f"decode mode {mode!r}: not one of {', '.join(MODES)}")
    out = np.empty((frames, 3, height, width), dtype=np.uint8)
    with av.open(path) as container:
        if not container.streams.video:
            raise ValueError(f"{path}: no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "SLICE"
        stream.thread_count = 1
        rate = stream.average_rate or stream.guessed_rate
        tb = stream.time_base
        if not rate or not tb:
            raise ValueError(f"{path}: the video stream has no frame rate or time base")
        count = stream.frames
        if count <= 0:
            duration = (float(stream.duration * tb) if stream.duration
                        else (container.duration or 0) / 1e6)
            count = _lround(duration * float(rate))
        if count <= 0:
            raise ValueError(f"{path}: the clip has no frames")
        if frames > count:
            raise ValueError(f"{path}: the clip has {count} frames, the plan asks for {frames}")
        targets = uniform_indices(frames, count)
        wanted = set(targets) if mode == "skip" else None
        sw, sh, x, y = scaled_size(stream.codec_context.width, stream.codec_context.height,
                                   width, height)
        keyframes = _keyframes(container, stream, rate, tb)
        position = -1  # index of the next frame the decoder will output; -1: must seek
        decoded = None
        produced = 0
        for target in targets:
            kf = max((k for k in keyframes if k <= target), default=0)
            if position < 0 or target < position or kf > position:
                container.seek(int(round(kf / rate / tb)), stream=stream, backward=True,
                               any_frame=False)
                decoded = _decoded(container, stream, wanted, rate, tb)
                position = -1
            for frame in decoded:
                index = _lround(float(frame.pts * tb * rate))
                position = index + 1
                if index >= target:
                    rgb = frame.reformat(width=sw, height=sh, format="rgb24",
                                         interpolation="BILINEAR").to_ndarray()
                    out[produced] = rgb[y:y + height, x:x + width].transpose(2, 0, 1)
                    produced += 1
                    break
        if produced != frames:
            raise ValueError(f"{path}: decoded {produced} of the {frames} sampled frames "
                             f"(the clip ended early)")
    return out


def decode_batch(items, mode="skip"):
    """Decodes and collates a batch: items are dataset samples (common.load_dataset)."""
    return collate([dict(item, frames_data=decode_sample(item["path"], item["frames"],
                                                         item["height"], item["width"],
                                                         mode))
                    for item in items])


def _numpy_alloc(shape, dtype):
    a = np.empty(shape, dtype=dtype)
    return a, a


def collate(samples, alloc=_numpy_alloc):
    """Pads to the batch max T/H/W: {"frames": B x T x 3 x H x W uint8, "mask": B x T bool,
    "tokens": int64 B (common.sample_tokens), "sample_ids", "captions"}. The arrays are
    numpy, or what `alloc(shape, dtype)` returns as (object, numpy view of it) (torch_peer:
    tensors in shared memory, as torch's default_collate allocates them in a worker)."""
    b = len(samples)
    t = max(s["frames_data"].shape[0] for s in samples)
    h = max(s["frames_data"].shape[2] for s in samples)
    w = max(s["frames_data"].shape[3] for s in samples)
    frames_obj, frames = alloc((b, t, 3, h, w), np.uint8)
    mask_obj, mask = alloc((b, t), np.bool_)
    tokens_obj, tokens = alloc((b,), np.int64)
    for i, s in enumerate(samples):
        data = s["frames_data"]
        ft, _, fh, fw = data.shape
        frames[i, :ft, :, :fh, :fw] = data
        if ft < t or fh < h or fw < w:
            frames[i, ft:] = 0
            frames[i, :ft, :, fh:] = 0
            frames[i, :ft, :, :fh, fw:] = 0
        mask[i, :ft] = True
        mask[i, ft:] = False
        tokens[i] = common.sample_tokens(common.visual_tokens(ft, fh, fw), s)
    return {"frames": frames_obj, "mask": mask_obj, "tokens": tokens_obj,
            "sample_ids": [s["id"] for s in samples],
            "captions": [s.get("caption", "") for s in samples]}
