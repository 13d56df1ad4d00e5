#!/usr/bin/env bash
# Installs what DataHelix needs to build and test, and nothing that is already there.
# Idempotent: a second run checks, prints one line, and installs nothing.
# Used by `make deps`, which `make`, `make test` and `make demo` call first.
#
# Why each package is here (README.md "Dependencies" says the same):
#   build-essential, pkg-config, cmake  the C toolchain and the build system
#   libjansson-dev                      JSON parsing/writing (profiles JSONL, mix files)
#   libcmocka-dev                       the unit-test framework (one CTest test per case)
#   libavformat/avcodec/swscale/avutil-dev  FFmpeg: encode synthetic clips, probe, decode, resize
#   ffmpeg                              the ffmpeg CLI, the baseline of `datahelix decode-bench`
#   libzmq3-dev                         ZeroMQ: every message between processes (src/wire)
#   libdlpack-dev                       dlpack.h: the tensor exchange ABI of the Python binding
#                                       (torch.from_dlpack of arena slabs, no copy)
#   clang-format                        `make format` with the checked-in .clang-format
set -euo pipefail

DEB_PACKAGES=(build-essential pkg-config libjansson-dev libcmocka-dev
              libavformat-dev libavcodec-dev libswscale-dev libavutil-dev ffmpeg
              libzmq3-dev libdlpack-dev)
# Optional tools: installed when missing, but a failure to get them is not fatal.
DEB_OPTIONAL=(clang-format)
PY_REQUIREMENTS="$(dirname "$0")/../requirements.txt"

SUDO=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "deps: not root and no sudo; install by hand: ${DEB_PACKAGES[*]}" >&2
        exit 1
    fi
fi

missing=()
for pkg in "${DEB_PACKAGES[@]}" "${DEB_OPTIONAL[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if ! command -v cmake >/dev/null 2>&1; then missing+=(cmake); fi

if [ "${#missing[@]}" -gt 0 ]; then
    echo "deps: installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    # Required ones must install; optional ones are tried one by one.
    req=()
    for pkg in "${missing[@]}"; do
        case " ${DEB_OPTIONAL[*]} " in
            *" $pkg "*) ;;
            *) req+=("$pkg") ;;
        esac
    done
    if [ "${#req[@]}" -gt 0 ]; then
        $SUDO apt-get install -y -qq --no-install-recommends "${req[@]}" >/dev/null
    fi
    for pkg in "${DEB_OPTIONAL[@]}"; do
        case " ${missing[*]} " in
            *" $pkg "*) $SUDO apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null ||
                echo "deps: optional package $pkg could not be installed (only 'make format' needs it)" ;;
        esac
    done
fi

# Python packages, pinned by exact version in requirements.txt (empty lines and comments skipped).
if [ -f "$PY_REQUIREMENTS" ] && grep -qvE '^\s*(#|$)' "$PY_REQUIREMENTS"; then
    if ! python3 -m pip install -q --disable-pip-version-check -r "$PY_REQUIREMENTS" >/tmp/dh-pip.log 2>&1; then
        echo "deps: pip install -r requirements.txt failed; see /tmp/dh-pip.log" >&2
        exit 1
    fi
fi
echo "deps: all system and Python packages present"
