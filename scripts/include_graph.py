#!/usr/bin/env python3
"""The include graph of the rooms (docs/design.md, "The house"): for every folder of src/ and
tools/, the rooms its files include, with the headers through which, one line per edge;
-v also names the files. A public header (include/datahelix/X.h) counts as the room that
implements it (PUBLIC below); a header not listed there stops the script, so the map is
kept whole. Run from the repository root: python3 scripts/include_graph.py [-v]"""
import collections
import os
import re
import sys

PUBLIC = {
    "core": "alloc clock error export fault log rng stats tensor",
    "model": "cost mix profile",
    "sched": "deadline place plan rebalance sampler",
    "media": "calibrate manifest pipeline probe",
    "wire": "wire", "shm": "shm", "runtime": "client cluster metrics runtime", "synth": "synth",
}
OWNER = {h: room for room, hs in PUBLIC.items() for h in hs.split()}
OWNER["datahelix"] = "every room"


def room_of(path):
    parts = path.split("/")
    if parts[0] == "tools":
        return "tools"
    return parts[1] if len(parts) > 2 else "src"


def main():
    edges = collections.defaultdict(lambda: (set(), set()))
    for base in ("src", "tools"):
        for d, _, files in sorted(os.walk(base)):
            for f in sorted(files):
                path = os.path.join(d, f)
                room = room_of(path)
                with open(path, errors="replace") as fh:
                    for line in fh:
                        m = re.match(r'\s*#\s*include\s*"([^"]+)"', line)
                        if not m:
                            continue
                        inc = m.group(1)
                        if inc.startswith("datahelix/"):
                            name = inc[len("datahelix/"):-2]
                            if name not in OWNER:
                                sys.exit(f"{path}: {inc} is in no room of PUBLIC; add it")
                            to = OWNER[name]
                        elif "/" in inc:
                            to = inc.split("/")[0]
                        else:
                            to = room  # its own folder's header, or dh_config.h (generated)
                        if to != room:
                            edges[(room, to)][0].add(path)
                            edges[(room, to)][1].add(inc)
    for (a, b), (files, incs) in sorted(edges.items()):
        print(f"{a:8} -> {b:8} {len(files):3} files, via {' '.join(sorted(incs))}")
        if "-v" in sys.argv:
            print("            " + " ".join(sorted(files)))


if __name__ == "__main__":
    main()
