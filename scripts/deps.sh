#!/usr/bin/env bash
# Installs what DataHelix needs to build and test, and nothing that is already there:
# Debian packages through apt, Python packages into the project's virtual environment
# (.venv, never the system interpreter's site-packages, so Debian's own python3 under
# PEP 668 works too). Idempotent: a second run checks, prints one line, and installs nothing.
# Used by `make deps`, which `make test` and `make demo` run first; `make` / `make build`
# never run it.
#
#   scripts/deps.sh           install what is missing
#   scripts/deps.sh --check   only say what is missing (exit status 1 if anything is)
#
# Root (or sudo) is needed only when a Debian package is missing. DH_VENV overrides where
# the virtual environment goes (default: .venv at the repository root).
#
# Why each package is here (README.md "Dependencies" says the same):
#   build-essential, pkg-config, cmake  the C toolchain and the build system
#   libjansson-dev                      JSON parsing/writing (profiles JSONL, mix files)
#   libcmocka-dev                       the unit-test framework (one CTest test per case)
#   libcsv-dev                          CSV/TSV parsing for `datahelix manifest --from-csv`
#                                       (quoted fields with commas, quotes and newlines)
#   libarchive-dev                      tar member lists and offsets for `datahelix manifest
#                                       --from-tar` (WebDataset shards: ustar, pax, GNU)
#   libavformat/avcodec/swscale/avutil-dev  FFmpeg: encode synthetic clips, probe, decode, resize
#   ffmpeg                              the ffmpeg CLI, the baseline of `datahelix decode-bench`
#   libzmq3-dev                         ZeroMQ: every message between processes (src/wire)
#   libcurl4-openssl-dev                HTTP(S) range reads of remote clips and shards (src/remote)
#   libssl-dev                          libcrypto: S3 SigV4 signing (SHA-256, HMAC)
#   libexpat1-dev                       expat: the XML of S3's replies (listings, error documents)
#   nginx-light, openssl                the HTTP(S) server and test CA of tests/remote
#   libmicrohttpd-dev                   the HTTP server of --metrics-listen (GET /metrics for
#                                       Prometheus), so no HTTP parsing is ours
#   libdlpack-dev                       dlpack.h: the tensor exchange ABI of the Python binding
#                                       (torch.from_dlpack of arena slabs, no copy)
#   python3-dev                         Python.h: the CPython extension datahelix._C
#   python3-venv                        `python3 -m venv` on Debian's python3 (ensurepip);
#                                       only when the interpreter lacks it
#   iproute2                            `ip netns` and `tc`: the multi-node tests' network
#                                       namespaces, veth links and shaping (tests/netns)
#   clang-format                        `make format` / `make format-check` with the checked-in
#                                       .clang-format (optional here; CI needs it)
#   clang, libclang-rt-14-dev           the fuzz build (`make fuzz`, `make test-fuzz`): clang
#                                       and its runtimes, libFuzzer with ASan and UBSan
#                                       (tests/fuzz)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
VENV=${DH_VENV:-$root/.venv}
PY_REQUIREMENTS=$root/requirements.txt
check_only=0
case "${1:-}" in
    --check) check_only=1 ;;
    "") ;;
    *) echo "usage: scripts/deps.sh [--check]" >&2; exit 2 ;;
esac

DEB_PACKAGES=(build-essential pkg-config libjansson-dev libcmocka-dev libcsv-dev libarchive-dev
              libavformat-dev libavcodec-dev libswscale-dev libavutil-dev ffmpeg
              libzmq3-dev libmicrohttpd-dev libdlpack-dev iproute2 clang libclang-rt-14-dev
              libcurl4-openssl-dev libssl-dev libexpat1-dev nginx-light openssl)
# Optional tools: installed when missing, but a failure to get them is not fatal.
DEB_OPTIONAL=(clang-format)

deb_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
venv_ok() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sys' 2>/dev/null; }

missing=()
for pkg in "${DEB_PACKAGES[@]}" "${DEB_OPTIONAL[@]}"; do
    deb_installed "$pkg" || missing+=("$pkg")
done
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
# The interpreter the venv is made from needs its headers (python3-dev brings python3 too)
# and, while there is no venv yet, ensurepip (python3-venv on Debian).
if ! python3 -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
        2>/dev/null; then
    missing+=(python3-dev)
fi
if ! venv_ok && ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    missing+=(python3-venv)
fi

requirements_done() { [ -f "$VENV/.dh-requirements" ] && cmp -s "$PY_REQUIREMENTS" "$VENV/.dh-requirements"; }

if [ "$check_only" = 1 ]; then
    rc=0
    if [ "${#missing[@]}" -gt 0 ]; then echo "deps: missing Debian packages: ${missing[*]}"; rc=1; fi
    if ! venv_ok; then echo "deps: missing the virtual environment $VENV"; rc=1
    elif ! requirements_done; then echo "deps: $VENV does not have requirements.txt installed"; rc=1; fi
    [ "$rc" = 0 ] && echo "deps: all system and Python packages present"
    exit "$rc"
fi

# apt-get, as root or through sudo; asked for only when something is missing.
SUDO=""
need_root() {
    [ "$(id -u)" = 0 ] && return 0
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; return 0; fi
    echo "deps: not root and no sudo; install by hand (apt-get install): $*" >&2
    exit 1
}
apt_updated=0
apt_install() { # PACKAGE...: installs them, quietly
    export DEBIAN_FRONTEND=noninteractive
    if [ "$apt_updated" = 0 ]; then $SUDO apt-get update -qq; apt_updated=1; fi
    $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if [ "${#missing[@]}" -gt 0 ]; then
    need_root "${missing[@]}"
    echo "deps: installing Debian packages: ${missing[*]}"
    # Required ones must install; optional ones are tried one by one.
    req=()
    for pkg in "${missing[@]}"; do
        case " ${DEB_OPTIONAL[*]} " in
            *" $pkg "*) ;;
            *) req+=("$pkg") ;;
        esac
    done
    if [ "${#req[@]}" -gt 0 ]; then apt_install "${req[@]}"; fi
    for pkg in "${DEB_OPTIONAL[@]}"; do
        case " ${missing[*]} " in
            *" $pkg "*) apt_install "$pkg" ||
                echo "deps: optional package $pkg could not be installed (make format and make format-check need it)" ;;
        esac
    done
fi

# The virtual environment, made from python3 (on Debian, ensurepip comes with python3-venv:
# installed above when missing, and once more here if making the venv still fails).
if ! venv_ok; then
    echo "deps: creating the virtual environment $VENV"
    if ! python3 -m venv --clear "$VENV" >/dev/null 2>&1; then
        need_root python3-venv
        apt_install python3-venv
        python3 -m venv --clear "$VENV"
    fi
fi

# Python packages, pinned by exact version in requirements.txt, into the venv; skipped when
# the venv already has this requirements.txt (a copy is kept as $VENV/.dh-requirements).
if ! requirements_done; then
    echo "deps: installing requirements.txt into $VENV (torch and ray: a few minutes)"
    log=$VENV/pip-install.log
    if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$PY_REQUIREMENTS" \
            >"$log" 2>&1; then
        echo "deps: pip install -r requirements.txt into $VENV failed; see $log" >&2
        exit 1
    fi
    cp "$PY_REQUIREMENTS" "$VENV/.dh-requirements"
fi
echo "deps: all system and Python packages present (Python: $VENV)"
