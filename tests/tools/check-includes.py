#!/usr/bin/env python3
"""Fails when two files of src/ include each other, directly or through a loop (DESIGN rule 7).

A module is a file name without its extension: src/upstream/pool.c and src/upstream/pool.h are
module "upstream/pool". Module A depends on B when a.c or a.h includes "b.h" (as "folder/b.h"). Any cycle in that graph is printed
(one line per loop, e.g. "worker -> session -> worker") and the exit status is 1.
"""
import os
import re
import sys

SRC = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "src")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)\.h"', re.M)


def graph(src):
    deps = {}
    for folder in sorted(os.listdir(src)):
        if not os.path.isdir(os.path.join(src, folder)):
            continue
        for name in sorted(os.listdir(os.path.join(src, folder))):
            base, ext = os.path.splitext(name)
            if ext not in (".c", ".h"):
                continue
            mod = folder + "/" + base
            with open(os.path.join(src, folder, name), encoding="utf-8", errors="replace") as f:
                for dep in INCLUDE.findall(f.read()):
                    if dep != mod:
                        deps.setdefault(mod, set()).add(dep)
            deps.setdefault(mod, set())
    return deps


def cycles(deps):
    """Strongly connected components of more than one module (Tarjan), each as a loop path."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(deps.get(v, ())):
            if w not in deps:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(deps):
        if v not in index:
            visit(v)
    return out


def path_in(comp, deps):
    """One loop through the component, starting at its first module."""
    members = set(comp)
    start = comp[0]
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(deps[v] & members):
            if w == start:
                p = [v]
                while prev[p[-1]] is not None:
                    p.append(prev[p[-1]])
                return list(reversed(p)) + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def main():
    deps = graph(SRC)
    loops = cycles(deps)
    for comp in loops:
        print("include loop: " + " -> ".join(path_in(comp, deps)) +
              ("   (component: " + ", ".join(comp) + ")" if len(comp) > 2 else ""))
    if loops:
        return 1
    print("check-includes: %d modules, no include loop" % len(deps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
