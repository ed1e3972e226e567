#!/usr/bin/env python3
"""Runs the commands of a markdown page (docs/tutorial.md) in a fresh directory.

Fenced blocks, by their info string:
  cpp file=NAME / python file=NAME   written to NAME
  sh                                 run with bash -e; must exit 0
  sh fails                           run; must exit non-zero
  sh gpu                             run only with --gpu (else reported as skipped)
  text                               the output of the sh block before it: every line's first
                                     60 characters (lines starting "  at " excepted: paths
                                     differ) must appear in that block's output
Anything else is prose. Exit status 0 when every block ran as it says.

usage: run_doc.py PAGE.md --build BUILD_DIR [--gpu] [--keep]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile


def blocks(text):
    out = []
    for m in re.finditer(r"^```([^\n]*)\n(.*?)^```\s*$", text, re.M | re.S):
        info = m.group(1).split()
        lang = info[0] if info else ""
        opts = dict(o.split("=", 1) if "=" in o else (o, True) for o in info[1:])
        line = text.count("\n", 0, m.start()) + 1
        out.append((lang, opts, m.group(2), line))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("page")
    ap.add_argument("--build", required=True)
    ap.add_argument("--gpu", action="store_true", help="also run the blocks marked gpu")
    ap.add_argument("--keep", action="store_true", help="keep the working directory")
    a = ap.parse_args()
    page = os.path.abspath(a.page)
    build = os.path.abspath(a.build)
    work = tempfile.mkdtemp(prefix="mk-doc-")
    env = dict(os.environ)
    env["PATH"] = build + os.pathsep + env.get("PATH", "")
    env.setdefault("MK_CACHE_DIR", os.path.join(work, ".cache"))
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    failures, ran, skipped = [], 0, 0
    last_output = None
    for lang, opts, body, line in blocks(open(page).read()):
        where = "%s:%d" % (os.path.basename(page), line)
        if "file" in opts:
            with open(os.path.join(work, opts["file"]), "w") as f:
                f.write(body)
            continue
        if lang == "text":
            if last_output is None:
                continue
            for want in body.splitlines():
                if not want.strip() or want.startswith("  at "):
                    continue
                if want[:60] not in last_output:
                    failures.append("%s: the output lacks %r" % (where, want[:60]))
            continue
        if lang != "sh":
            continue
        if opts.get("gpu") and not a.gpu:
            print("SKIP (needs a GPU; run with --gpu on a GPU machine) %s: %s" % (where, body.strip()))
            skipped += 1
            last_output = None
            continue
        print("$ " + body.strip(), flush=True)
        p = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", body], cwd=work, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
        sys.stdout.write(p.stdout)
        last_output = p.stdout
        ran += 1
        expect_fail = bool(opts.get("fails"))
        if (p.returncode != 0) != expect_fail:
            failures.append("%s: exit status %d, expected %s" % (where, p.returncode,
                                                                 "non-zero" if expect_fail else "0"))
    print("run_doc: %s: %d command block(s) ran, %d skipped, %d failure(s)" % (a.page, ran, skipped, len(failures)))
    for f in failures:
        print("FAIL " + f)
    if a.keep:
        print("kept " + work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
