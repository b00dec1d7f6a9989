#!/usr/bin/env python3
"""The shape of the code base, checked so that it stays one a newcomer can
live in (docs/design.md, "Folders"):

  (1) no folder of product code holds more than 30 files;
  (2) no product function is longer than 120 lines;
  (3) no call circle among product files: the graph "file A calls a function
      defined in file B", read from the built objects' symbol tables, has no
      cycle (a circle means neither file can be read without the other);
  (4) nothing in the repository points outside it (to a sibling checkout);
  (5) README.md is a front page: at most 250 lines, with the quick start and
      the test command in its first 100.

Product code is every .c/.h/.cu/.cuh file outside tests/ folders and not
named *_test.c.  (2) needs universal-ctags; (3) needs a build of //... (the
objects under bazel-bin/).  Run from the workspace root:

    python3 tools/build/check_house.py

Prints one ok/FAIL line per rule with the offenders; exits 1 on a
violation, 2 when a tool it needs is missing.
"""
import collections
import glob
import os
import shutil
import subprocess
import sys

MAX_FILES_PER_FOLDER = 30
MAX_FUNCTION_LINES = 120
README_MAX_LINES = 250
README_COMMANDS = ("bazel run //tools:moetune -- train configs/quickstart.yaml", "bazel test //...")
SOURCE_EXT = (".c", ".h", ".cu", ".cuh")


def tracked_files():
    out = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout
    return [p for p in out.splitlines() if p]


def is_product(path):
    parts = path.split("/")
    if parts[0] == "tests" or "tests" in parts[:-1] or parts[0] == "third_party":
        return False
    return path.endswith(SOURCE_EXT) and not path.endswith("_test.c")


def check_folder_sizes(files):
    per_folder = collections.Counter(os.path.dirname(p) for p in files if is_product(p))
    big = sorted((n, d) for d, n in per_folder.items() if n > MAX_FILES_PER_FOLDER)
    if big:
        return ["%s/ holds %d product files (at most %d)" % (d, n, MAX_FILES_PER_FOLDER) for n, d in big]
    return []


def function_spans(path):
    """(name, first line, length) of each function ctags finds in path."""
    out = subprocess.run(["ctags", "--kinds-C=f", "--kinds-C++=f", "--fields=+ne", "--language-force=C",
                          "-o", "-", path], capture_output=True, text=True).stdout
    for line in out.splitlines():
        fields = line.split("\t")
        attrs = dict(f.split(":", 1) for f in fields[3:] if ":" in f)
        if "line" in attrs and "end" in attrs:
            yield fields[0], int(attrs["line"]), int(attrs["end"]) - int(attrs["line"]) + 1


def check_function_lengths(files):
    long_ones = []
    for p in files:
        if is_product(p) and p.endswith((".c", ".cu")):
            for name, first, n in function_spans(p):
                if n > MAX_FUNCTION_LINES:
                    long_ones.append((n, "%s:%d %s is %d lines" % (p, first, name, n)))
    return [msg for _, msg in sorted(long_ones, reverse=True)]


def object_source(obj):
    """bazel-bin/PKG/_objs/LIB/NAME.pic.o -> PKG/NAME (the source's path
    without extension), or None for a test's or an external object."""
    rel = os.path.relpath(obj, "bazel-bin")
    if rel.startswith("external/") or "/_objs/" not in "/" + rel:
        return None
    pkg, rest = ("/" + rel).split("/_objs/", 1)
    lib, name = rest.split("/", 1)
    if lib.endswith("_test") or pkg.lstrip("/").split("/")[0] == "tests" or "/tests" in pkg:
        return None
    name = name.replace(".pic.o", "").replace(".o", "")
    return pkg.lstrip("/") + "/" + name


def symbol_graph(files):
    sources = {os.path.splitext(p)[0] for p in files if is_product(p) and p.endswith((".c", ".cu"))}
    defined, used = {}, collections.defaultdict(set)
    for obj in sorted(glob.glob("bazel-bin/**/_objs/**/*.o", recursive=True)):
        src = object_source(obj)
        # objects left behind by a source since moved or removed are skipped
        if src is None or src not in sources or (obj.endswith(".o") and not obj.endswith(".pic.o") and os.path.exists(obj[:-2] + ".pic.o")):
            continue
        nm = subprocess.run(["nm", obj], capture_output=True, text=True).stdout
        for line in nm.splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in "TDBR":
                defined.setdefault(f[2], src)
            elif len(f) == 2 and f[0] == "U":
                used[src].add(f[1])
    graph = collections.defaultdict(set)
    for src, symbols in used.items():
        for s in symbols:
            target = defined.get(s)
            if target and target != src:
                graph[src].add(target)
    return graph


def strongly_connected(graph):
    """Tarjan's algorithm, iterative; components of more than one node."""
    index, low, on_stack, stack, comps, counter = {}, {}, set(), [], [], [0]
    nodes = set(graph) | {t for ts in graph.values() for t in ts}
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]; counter[0] += 1
        stack.append(root); on_stack.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1
                    stack.append(w); on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on_stack.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comps.append(sorted(comp))
    return comps


def check_call_circles(files):
    circles = strongly_connected(symbol_graph(files))
    return ["call circle among %d files: %s" % (len(c), " ".join(c)) for c in circles]


# The sibling folder a developer's checkout may sit beside; spelled in parts
# so that this file does not name it as a path itself.
OUTSIDE = ("../" + "shared", "shared/" + "notes", "shared/" + "DESIGN")


def check_outside_paths(files):
    hits = []
    for p in files:
        if p.startswith("tests/bad_inputs/") or not os.path.isfile(p):
            continue
        try:
            with open(p, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if any(o in line for o in OUTSIDE):
                        hits.append("%s:%d points outside the repository" % (p, n))
        except (UnicodeDecodeError, OSError):
            continue
    return hits


def check_readme():
    with open("README.md", encoding="utf-8") as f:
        lines = f.read().splitlines()
    problems = []
    if len(lines) > README_MAX_LINES:
        problems.append("README.md has %d lines (at most %d)" % (len(lines), README_MAX_LINES))
    head = "\n".join(lines[:100])
    for command in README_COMMANDS:
        if command not in head:
            problems.append("README.md's first 100 lines do not show `%s`" % command)
    return problems


def main():
    if not shutil.which("ctags"):
        print("check_house: universal-ctags is needed (apt-get install universal-ctags)")
        return 2
    if not glob.glob("bazel-bin/**/_objs", recursive=True):
        print("check_house: no objects under bazel-bin/: run `bazel build //...` first")
        return 2
    files = tracked_files()
    rules = [
        ("(1) no product folder over %d files" % MAX_FILES_PER_FOLDER, lambda: check_folder_sizes(files)),
        ("(2) no product function over %d lines" % MAX_FUNCTION_LINES, lambda: check_function_lengths(files)),
        ("(3) no call circle among product files", lambda: check_call_circles(files)),
        ("(4) nothing points outside the repository", lambda: check_outside_paths(files)),
        ("(5) README.md is a front page", check_readme),
    ]
    failures = 0
    for title, check in rules:
        problems = check()
        if problems:
            failures += 1
            print("FAIL " + title)
            for p in problems:
                print("     " + p)
        else:
            print("ok   " + title)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
