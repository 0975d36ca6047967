#!/usr/bin/env python3
"""Fails when two files of src/ include each other, directly or through a loop (DESIGN rule 7),
or when a folder of src/ includes a folder above it in the stack of stages (LAYERS).

The folders, top to bottom: a file may include its own folder's headers and those of any
folder below it, never one above. Such an order has no loop between folders either, so two
folders never include each other, directly or through others.

A module is a file name without its extension: src/upstream/pool.c and src/upstream/pool.h are
module "upstream/pool". Module A depends on B when a.c or a.h includes "b.h" (as "folder/b.h"). Any cycle in that graph is printed
(one line per loop, e.g. "worker -> session -> worker") and the exit status is 1.
"""
import os
import re
import sys

SRC = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "src")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)\.h"', re.M)

# The data flow, top to bottom (src/README.md says what each holds).
LAYERS = [
    "app",          # the wiring: main, workers, admin port, the --health client
    "client",       # client codecs (HTTP/1, HTTP/2) and their defences
    "proxy",        # one request's exchange: admission, routing, body, retries, reply
    "upstream",     # one attempt and the two transports under it, the pool
    "state",        # shared state: runtime, upstream registry, endpoints, resolve, probes
    "obs",          # stats, access log, reconciliation queue and its publisher
    "idempotency",  # the idempotency facade and its stores
    "net",          # sockets: stream, TLS, listeners, tunnels, the Redis link
    "policy",       # pure decisions: retry, budget, balance, outlier, faults
    "config",       # the configuration: schema, loading, reports
    "http",         # HTTP/1 parser and writer, deadline, forward, respond, gRPC
    "base",         # util, loop, log, clock, cpus, procstat, the nghttp2 allocator
]


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


def upward(src):
    """Every include of a folder above the includer's (or of one LAYERS does not name), as
    "file:line: ..." lines."""
    out = []
    rank = {name: i for i, name in enumerate(LAYERS)}
    for folder in sorted(os.listdir(src)):
        path = os.path.join(src, folder)
        if not os.path.isdir(path):
            continue
        if folder not in rank:
            out.append("%s/: a folder the layer order does not name (add it to LAYERS)" % path)
            continue
        for name in sorted(os.listdir(path)):
            if os.path.splitext(name)[1] not in (".c", ".h"):
                continue
            with open(os.path.join(path, name), encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = m.group(1).split("/")[0] if "/" in m.group(1) else folder
                    if target not in rank:
                        out.append("%s:%d: includes \"%s.h\" from no known folder"
                                   % (os.path.join(path, name), lineno, m.group(1)))
                    elif rank[target] < rank[folder]:
                        out.append("%s:%d: %s/ includes %s/, which is above it"
                                   % (os.path.join(path, name), lineno, folder, target))
    return out


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
    up = upward(SRC)
    for line in up:
        print(line)
    if loops or up:
        print("check-includes: folders must include only downwards: " + " > ".join(LAYERS))
        return 1
    print("check-includes: %d modules, no include loop; folders include only downwards: %s"
          % (len(deps), " > ".join(LAYERS)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
