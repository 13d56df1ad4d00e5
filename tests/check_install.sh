#!/bin/sh
# `cmake --install` into a temporary prefix, then examples/plan_and_place.c compiled against
# what was installed, two ways: with `pkg-config --cflags --libs datahelix`, and as a tiny
# CMake project (tests/install/CMakeLists.txt) that does find_package(datahelix). Each
# build runs on the profile set the examples.plan_and_place test uses and must print its
# plan. Only the prefix is used: no path into the source or build tree reaches the compiler.
#   usage: check_install.sh BUILD_DIR WORK_DIR CLI CC CMAKE GENERATOR
set -eu
build=$1 work=$2 cli=$3 cc=$4 cmake=$5 generator=$6
src=$(cd "$(dirname "$0")/.." && pwd)
prefix=$work/prefix

rm -rf "$work"
mkdir -p "$work"
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log"
"$cli" gen-profiles --mix kinetics-mixed --count 64 --seed 3 -o "$work/profiles.jsonl"

pcdir=$(dirname "$(find "$prefix" -name datahelix.pc | head -n 1)")
libdir=$(cd "$pcdir/.." && pwd)
expect() { # the example's output must end with its four ranks
    grep -q "rank 0: 2 samples" "$1" && grep -q "rank 3: 2 samples" "$1" ||
        { echo "check_install: $2: unexpected output:"; cat "$1"; exit 1; }
}

# 1. pkg-config
PKG_CONFIG_PATH=$pcdir
export PKG_CONFIG_PATH
flags=$(pkg-config --cflags --libs datahelix)
echo "pkg-config --cflags --libs datahelix: $flags"
"$cc" -std=c11 -Wall -Werror -o "$work/plan_and_place_pc" "$src/examples/plan_and_place.c" $flags
LD_LIBRARY_PATH=$libdir "$work/plan_and_place_pc" "$work/profiles.jsonl" >"$work/pc.out"
expect "$work/pc.out" pkg-config

# 2. find_package(datahelix)
"$cmake" -S "$src/tests/install" -B "$work/consumer" -G "$generator" \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$prefix" \
    -DEXAMPLE="$src/examples/plan_and_place.c" >"$work/consumer-configure.log"
"$cmake" --build "$work/consumer" >"$work/consumer-build.log"
"$work/consumer/plan_and_place" "$work/profiles.jsonl" >"$work/cmake.out"
expect "$work/cmake.out" find_package
echo "check_install: the example built and ran against $prefix with pkg-config and find_package"
