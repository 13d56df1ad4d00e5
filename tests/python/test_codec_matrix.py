"""The codec/container matrix (docs/pipeline.md, "Codecs and containers").

Every entry is a short moving clip (a synth clip transcoded by Debian's ffmpeg CLI) in one
codec, pixel format and container (constant or variable frame rate, even and odd sizes, 8
and 10 bits). An entry this machine's ffmpeg cannot encode is skipped with the reason. The
entries the pipeline cannot decode faithfully (a mirroring display matrix, AVI with
B-frames) must be rejected by `datahelix probe` with the reason on stderr; every other one
(quarter turns in the display matrix included: the frames come turned as a player shows
them) must decode through the DataLoader to the frames PyAV (its own FFmpeg build)
decodes at the same indices: the planned index k of T is floor((2k + 1) N / 2T) of the N
frames PyAV decodes, each output frame must be nearest to that PyAV frame of all N (a frame
off by one index is found: neighbouring frames of this moving content differ by several
levels), and the mean absolute difference must be <= 3 of 255 (the two builds' colour
conversion and chroma interpolation differ in the last bits).
"""
import json
import os
import subprocess

import numpy as np
import pytest

from conftest import CLI

av = pytest.importorskip("av")

H, W, T, N_FRAMES = 120, 160, 4, 30

X264 = ["-c:v", "libx264", "-preset", "veryfast"]
X265 = ["-c:v", "libx265", "-preset", "ultrafast", "-x265-params", "log-level=error"]
VP9 = ["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8", "-b:v", "1M"]
AV1 = ["-c:v", "libaom-av1", "-cpu-used", "8", "-b:v", "1M", "-row-mt", "1"]
MPEG4 = ["-c:v", "mpeg4", "-q:v", "2"]
MJPEG = ["-c:v", "mjpeg", "-q:v", "2"]

# every fourth frame dropped, the others keeping their timestamps: variable frame rate
VFR = "select='not(eq(mod(n\\,4)\\,1))'"

# name: (encoder arguments, pixel format, container extension, size (h, w)[, options]);
# options: "select" (a frame filter), "rotate" (degrees clockwise, or "mirror", written into
# the MP4 track's display matrix), "rejected" (probe must refuse it, with this in the reason), "image" (a still
# image: one frame)
ENTRIES = {
    "h264-mp4": (X264, "yuv420p", "mp4", (H, W)),
    "h264-mkv": (X264, "yuv420p", "mkv", (H, W)),
    "h264-ts": (X264, "yuv420p", "ts", (H, W)),
    "h264-avi-no-b": (X264 + ["-bf", "0"], "yuv420p", "avi", (H, W)),
    "h264-10bit-mp4": (X264, "yuv420p10le", "mp4", (H, W)),
    "h264-10bit-mkv": (X264, "yuv420p10le", "mkv", (H, W)),
    "h264-444-odd-size-mp4": (X264, "yuv444p", "mp4", (H + 1, W + 3)),
    "hevc-mp4": (X265 + ["-tag:v", "hvc1"], "yuv420p", "mp4", (H, W)),
    "hevc-mkv": (X265, "yuv420p", "mkv", (H, W)),
    "hevc-ts": (X265, "yuv420p", "ts", (H, W)),
    "hevc-10bit-mp4": (X265 + ["-tag:v", "hvc1"], "yuv420p10le", "mp4", (H, W)),
    "vp9-webm": (VP9, "yuv420p", "webm", (H, W)),
    "vp9-mkv": (VP9, "yuv420p", "mkv", (H, W)),
    "vp9-mp4": (VP9, "yuv420p", "mp4", (H, W)),
    "av1-webm": (AV1, "yuv420p", "webm", (H, W)),
    "av1-mkv": (AV1, "yuv420p", "mkv", (H, W)),
    "av1-mp4": (AV1, "yuv420p", "mp4", (H, W)),
    "mpeg4-mp4": (MPEG4, "yuv420p", "mp4", (H, W)),
    "mpeg4-avi": (MPEG4, "yuv420p", "avi", (H, W)),
    "mpeg4-mkv": (MPEG4, "yuv420p", "mkv", (H, W)),
    "mjpeg-avi": (MJPEG, "yuvj420p", "avi", (H, W)),
    "mjpeg-mkv": (MJPEG, "yuvj420p", "mkv", (H, W)),
    "mjpeg-odd-size-avi": (MJPEG, "yuvj444p", "avi", (H + 1, W + 3)),
    "h264-vfr-mp4": (X264, "yuv420p", "mp4", (H, W), {"select": VFR}),
    "h264-vfr-mkv": (X264, "yuv420p", "mkv", (H, W), {"select": VFR}),
    "vp9-vfr-webm": (VP9, "yuv420p", "webm", (H, W), {"select": VFR}),
    "h264-avi-b-frames": (X264, "yuv420p", "avi", (H, W),
                          {"rejected": "AVI with reordered (B-)frames"}),
    "h264-rotated-90-mp4": (X264, "yuv420p", "mp4", (H, W), {"rotate": 90}),
    "h264-rotated-180-mp4": (X264, "yuv420p", "mp4", (H, W), {"rotate": 180}),
    "h264-rotated-270-mp4": (X264, "yuv420p", "mp4", (H, W), {"rotate": 270}),
    "h264-mirrored-mp4": (X264, "yuv420p", "mp4", (H, W),
                          {"rotate": "mirror", "rejected": "mirrors the picture"}),
    "jpeg-image": (MJPEG, "yuvj420p", "jpg", (H, W), {"image": True}),
    "png-image": (["-c:v", "png"], "rgb24", "png", (H, W), {"image": True}),
    "png-image-odd-size": (["-c:v", "png"], "rgb24", "png", (H + 1, W + 3), {"image": True}),
    "webp-image": (["-c:v", "libwebp", "-quality", "90"], "yuv420p", "webp", (H, W),
                   {"image": True}),
    "jpeg-exif-rotated-90": (MJPEG, "yuvj420p", "jpg", (H, W), {"image": True, "exif": 6}),
    "jpeg-exif-rotated-180": (MJPEG, "yuvj420p", "jpg", (H, W), {"image": True, "exif": 3}),
    "jpeg-exif-rotated-270": (MJPEG, "yuvj420p", "jpg", (H, W), {"image": True, "exif": 8}),
    "jpeg-exif-mirrored": (MJPEG, "yuvj420p", "jpg", (H, W),
                           {"image": True, "exif": 2, "rejected": "mirrors the picture"}),
}

# EXIF Orientation -> degrees clockwise a viewer turns the picture
EXIF_TURN = {1: 0, 3: 180, 6: 90, 8: 270}


def set_exif_orientation(path, value):
    """Puts an EXIF block holding only an Orientation tag right after a JPEG's start marker
    (what cameras write): a little-endian TIFF header, one IFD entry (0x0112, SHORT)."""
    import struct
    data = open(path, "rb").read()
    tiff = b"II*\x00" + struct.pack("<IH", 8, 1) + struct.pack("<HHIHH", 0x0112, 3, 1, value, 0) \
        + struct.pack("<I", 0)
    app1 = b"Exif\x00\x00" + tiff
    open(path, "wb").write(data[:2] + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1
                           + data[2:])


def set_rotation(path, degrees):
    """Writes a rotation into the first track header's display matrix (what phones write),
    as the ffmpeg CLI here cannot: 'tkhd' holds 9 big-endian 32-bit numbers (16.16, and 2.30
    for the last column) after its times, ids and volume."""
    import struct
    data = bytearray(open(path, "rb").read())
    at = data.index(b"tkhd")
    version = data[at + 4]
    matrix = at + 8 + (32 if version == 1 else 20) + 16
    one = 1 << 16
    if degrees == "mirror":  # a horizontal flip
        a, b, c, d = -one, 0, 0, one
    else:  # clockwise on display
        cos, sin = {90: (0, 1), 180: (-1, 0), 270: (0, -1)}[degrees]
        a, b, c, d = cos * one, sin * one, -sin * one, cos * one
    data[matrix:matrix + 36] = struct.pack(">9i", a, b, 0, c, d, 0, 0, 0, 1 << 30)
    open(path, "wb").write(bytes(data))


@pytest.fixture(scope="module")
def source(dataset):
    """A moving synth clip (kinetics-s) to transcode."""
    src, _ = dataset
    with open(os.path.join(src, "manifest.jsonl")) as f:
        first = json.loads(f.readline())
    return os.path.join(src, first["path"])


def encode(source, out, args, pix_fmt, size, select=None, rotate=None, image=False, exif=None):
    h, w = size
    vf = f"scale={w}:{h}:flags=bicubic" + (f",{select}" if select else "")
    cmd = ["ffmpeg", "-nostdin", "-loglevel", "error", "-y", "-i", source,
           "-frames:v", "1" if image else str(N_FRAMES), "-an", "-vf", vf,
           *(["-fps_mode", "vfr"] if select else []), "-pix_fmt", pix_fmt, *args, out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not os.path.getsize(out):
        pytest.skip(f"this machine's ffmpeg cannot encode it: {r.stderr.strip()[-300:]}")
    if rotate:
        set_rotation(out, rotate)
    if exif:
        set_exif_orientation(out, exif)


@pytest.mark.parametrize("name", list(ENTRIES))
def test_codec_container_decodes_like_pyav_or_is_rejected(datahelix, source, tmp_path, name):
    args, pix_fmt, ext, (h, w), *more = ENTRIES[name]
    options = more[0] if more else {}
    clip = str(tmp_path / f"clip.{ext}")
    encode(source, clip, args, pix_fmt, (h, w), options.get("select"), options.get("rotate"),
           options.get("image", False), options.get("exif"))
    t = 1 if options.get("image") else T
    turn = options.get("rotate") if isinstance(options.get("rotate"), int) else 0
    turn = EXIF_TURN.get(options.get("exif"), turn)
    if turn in (90, 270):  # the displayed size
        h, w = w, h
    (tmp_path / "manifest.jsonl").write_text(json.dumps({"id": name, "path": f"clip.{ext}"}) + "\n")
    spec = {"frames": t, "sampling": "uniform", "resize": "fixed", "height": h, "width": w,
            "layout": "THWC", "dtype": "uint8"}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ, DH_CALIBRATION_CACHE=str(tmp_path.parent / "calib.json"))
    r = subprocess.run([CLI, "probe", str(tmp_path / "manifest.jsonl"), "-o",
                        str(tmp_path / "profiles.jsonl"), "-p", str(tmp_path / "spec.json")],
                       capture_output=True, text=True, env=env)
    if "rejected" in options:
        # refused, the reason naming the file and what is wrong with it; no clip kept: probe
        # fails and writes no profile set
        assert r.returncode == 1, f"{name}: probe took it: {r.stderr}"
        assert not (tmp_path / "profiles.jsonl").exists()
        assert f"clip.{ext}" in r.stderr and options["rejected"] in r.stderr, r.stderr
        print(f"{name}: rejected by probe: {r.stderr.strip().splitlines()[-1]}")
        return
    assert r.returncode == 0, r.stderr
    rows = (tmp_path / "profiles.jsonl").read_text().strip()
    assert rows, f"{name}: probe refused it: {r.stderr}"
    with datahelix.DataLoader(str(tmp_path), pipeline=spec, batch_size=1, shuffle=False,
                              workers=1, arena_bytes=64 << 20, timeout=60) as dl:
        b = next(iter(dl))
        got = b["frames"][0].numpy().astype(np.int16)
    with av.open(clip) as c:
        frames = [f.to_ndarray(format="rgb24").astype(np.int16) for f in c.decode(video=0)]
    # PyAV gives the coded picture: turn it as a player (or an image viewer) does, clockwise
    frames = [np.ascontiguousarray(np.rot90(f, k=-(turn // 90))) for f in frames]
    n = len(frames)
    assert got.shape == (t, h, w, 3), got.shape
    want = [(2 * k + 1) * n // (2 * t) for k in range(t)]
    for k, i in enumerate(want):
        mads = [float(np.abs(got[k] - f).mean()) for f in frames]
        nearest = int(np.argmin(mads))
        assert nearest == i or mads[nearest] == mads[i], \
            f"{name}: output frame {k} is PyAV's frame {nearest} (MAD {mads[nearest]:.2f}), " \
            f"planned {i} of {n} (MAD {mads[i]:.2f})"
        assert mads[i] <= 3.0, f"{name}: frame {k} (index {i} of {n}): MAD {mads[i]:.2f}"
    print(f"{name}: {n} frames, MAD {np.mean([np.abs(got[k] - frames[i]).mean() for k, i in enumerate(want)]):.2f}")
