#!/usr/bin/env python3
"""Check every open-gpu-kernel-modules release tag against the layout families
of openimex-rmabi, and (re)generate the files derived from that check.

For every tag that has NV_IMEX_SESSION (class/cl00f1.h), up to --last:

1. export the SDK headers of the tag (git archive) into a temporary directory;
2. for every family, compile tools/probe.c with -DRMABI_FAMILY=<n> and run it;
   the tag matches the family if it compiles and prints exactly the `size`,
   `field` and `const` lines of tools/expected/<family>.txt (sizes, alignments,
   every member's offset and size, and the constants the crate defines);
3. for the same tag, preprocess the headers (gcc -E -P) and compare the text of
   every struct the probe names with the family's reference tag
   (tools/expected/<family>.structs.txt); this catches members added into
   padding or renamed, which offsets alone would not;
4. check that every `opt` constant (present only in some tags) has the same
   value wherever it is defined.

A tag is put in a family only if it matches exactly one family on both checks.
Tags that match none are reported and left out.

Usage:
    tools/check_tags.py                     # check, print the table
    tools/check_tags.py --write-expected    # regenerate tools/expected/* from the reference tags
    tools/check_tags.py --write-rust        # also rewrite src/version/supported.rs
    tools/check_tags.py --tags 595.45.04    # check only some tags
"""

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CRATE = os.path.dirname(HERE)
DEFAULT_REPO = "/work/.mirror/NVIDIA+open-gpu-kernel-modules/repo"

# family name -> (RMABI_FAMILY value, reference tag the expected files come from)
FAMILIES = {
    "V550": (550, "550.40.07"),
    "V580": (580, "580.65.06"),
    "V590": (590, "590.44.01"),
    "V595": (595, "595.44.02"),
}

HEADER_DIRS = [
    "src/common/sdk/nvidia/inc",
    "src/nvidia/arch/nvalloc/unix/include",
    "kernel-open/common/inc",
]


def vkey(tag):
    return tuple(int(x) for x in tag.split("."))


def git(repo, *args, **kw):
    return subprocess.run(["git", "--git-dir", repo, *args], check=True,
                          capture_output=True, **kw)


def imex_tags(repo, last):
    tags = git(repo, "tag", text=True).stdout.split()
    out = []
    for t in sorted(tags, key=vkey):
        if vkey(t) > vkey(last):
            continue
        r = subprocess.run(["git", "--git-dir", repo, "cat-file", "-e",
                            f"{t}:src/common/sdk/nvidia/inc/class/cl00f1.h"],
                           capture_output=True)
        if r.returncode == 0:
            out.append(t)
    return out


def include_flags(root):
    return [
        "-I" + os.path.join(root, "src/common/sdk/nvidia/inc"),
        "-I" + os.path.join(root, "src/common/sdk/nvidia/inc/ctrl"),
        "-I" + os.path.join(root, "kernel-open/common/inc"),
        "-I" + os.path.join(root, "src/nvidia/arch/nvalloc/unix/include"),
    ]


def export_headers(repo, tag, dest):
    archive = subprocess.run(["git", "--git-dir", repo, "archive", tag, *HEADER_DIRS],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)


def run_probe(root, family_num, workdir):
    exe = os.path.join(workdir, f"probe{family_num}")
    cc = subprocess.run(["gcc", "-std=gnu11", "-O0", f"-DRMABI_FAMILY={family_num}",
                         *include_flags(root), "-o", exe, os.path.join(HERE, "probe.c")],
                        capture_output=True, text=True)
    if cc.returncode != 0:
        first = next((l for l in cc.stderr.splitlines() if "error" in l), cc.stderr[:200])
        return None, first.strip()
    out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    return out.splitlines(), None


def struct_names(probe_lines):
    return [l.split()[1] for l in probe_lines if l.startswith("size ")]


def struct_texts(root, names, workdir):
    """Preprocessed, whitespace-normalised text of each named typedef."""
    pp = subprocess.run(["gcc", "-std=gnu11", "-E", "-P", "-DRMABI_FAMILY=595",
                         *include_flags(root), os.path.join(HERE, "probe.c")],
                        capture_output=True, text=True)
    if pp.returncode != 0:
        return None
    text = re.sub(r"\s+", " ", pp.stdout)
    out = {}
    for name in names:
        m = re.search(r"\}\s*" + re.escape(name) + r"\s*;", text)
        if not m:
            out[name] = "<missing>"
            continue
        end = m.end()
        depth = 0
        i = m.start()
        while i >= 0:
            if text[i] == "}":
                depth += 1
            elif text[i] == "{":
                depth -= 1
                if depth == 0:
                    break
            i -= 1
        start = text.rfind("typedef", 0, i)
        out[name] = text[start:end].strip()
    return out


def split_probe(lines):
    strict = [l for l in lines if not l.startswith("opt ")]
    opts = {}
    for l in lines:
        if l.startswith("opt "):
            _, name, value = l.split()
            opts[name] = value
    return strict, opts


def read_expected(family):
    with open(os.path.join(HERE, "expected", f"{family}.txt")) as f:
        lines = [l.rstrip("\n") for l in f
                 if l.strip() and not l.startswith("#") and not l.startswith("opt ")]
    with open(os.path.join(HERE, "expected", f"{family}.structs.txt")) as f:
        structs = {}
        for l in f:
            if l.strip() and not l.startswith("#"):
                name, text = l.rstrip("\n").split("\t", 1)
                structs[name] = text
    return lines, structs


def check_tag(repo, tag, expected):
    """Returns (tag, {family: (ok, reason)}, opts)."""
    workdir = tempfile.mkdtemp(prefix=f"rmabi-{tag}-")
    try:
        export_headers(repo, tag, workdir)
        results = {}
        opts_seen = {}
        texts = None
        for fam, (num, _ref) in FAMILIES.items():
            lines, err = run_probe(workdir, num, workdir)
            if lines is None:
                results[fam] = (False, f"probe does not compile: {err}")
                continue
            strict, opts = split_probe(lines)
            opts_seen.update(opts)
            exp_lines, exp_structs = expected[fam]
            if strict != exp_lines:
                diff = [l for l in strict if l not in exp_lines][:3]
                results[fam] = (False, "numbers differ: " + "; ".join(diff))
                continue
            if texts is None:
                texts = struct_texts(workdir, list(exp_structs), workdir)
            bad = [n for n, t in exp_structs.items() if texts is None or texts.get(n) != t]
            if bad:
                results[fam] = (False, "struct text differs: " + ", ".join(bad[:3]))
                continue
            results[fam] = (True, "")
        return tag, results, opts_seen
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def write_expected(repo):
    for fam, (num, ref) in FAMILIES.items():
        workdir = tempfile.mkdtemp(prefix=f"rmabi-ref-{ref}-")
        try:
            export_headers(repo, ref, workdir)
            lines, err = run_probe(workdir, num, workdir)
            if lines is None:
                sys.exit(f"{fam}: probe does not compile on reference tag {ref}: {err}")
            strict, opts = split_probe(lines)
            texts = struct_texts(workdir, struct_names(strict), workdir)
            path = os.path.join(HERE, "expected", f"{fam}.txt")
            with open(path, "w") as f:
                f.write(f"# gcc probe output (tools/probe.c, RMABI_FAMILY={num}) on tag {ref}, x86_64 LP64\n")
                f.write("\n".join(strict) + "\n")
                f.write("# constants this tag defines but other tags of the family may not"
                        " (checked for value only)\n")
                f.write("".join(f"opt {k} {v}\n" for k, v in opts.items()))
            with open(os.path.join(HERE, "expected", f"{fam}.structs.txt"), "w") as f:
                f.write(f"# preprocessed struct definitions on tag {ref}\n")
                for name in struct_names(strict):
                    f.write(f"{name}\t{texts[name]}\n")
            print(f"wrote {path} from {ref}")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


def write_rust(assigned, left_out):
    path = os.path.join(CRATE, "src", "version", "supported.rs")
    with open(path, "w") as f:
        f.write("//! The release table. GENERATED by `tools/check_tags.py --write-rust`; do not edit.\n")
        f.write("//!\n")
        f.write("//! Every tag below was checked by that script: the gcc layout probe\n")
        f.write("//! (`tools/probe.c`) and the preprocessed struct text of the tag match its\n")
        f.write("//! family's reference tag for every struct this crate defines.\n")
        if left_out:
            f.write("//!\n//! Left out (matched no family): " + ", ".join(left_out) + ".\n")
        f.write("\nuse super::Layout;\n\n")
        f.write("/// Every supported driver release (an open-gpu-kernel-modules tag), in version\n")
        f.write("/// order, with its layout family.\n")
        f.write("pub const SUPPORTED: &[(&str, Layout)] = &[\n")
        for tag, fam in assigned:
            f.write(f"    (\"{tag}\", Layout::{fam}),\n")
        f.write("];\n")
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", default=DEFAULT_REPO, help="git dir of NVIDIA/open-gpu-kernel-modules")
    ap.add_argument("--last", default="595.45.04", help="newest tag to consider")
    ap.add_argument("--tags", nargs="*", help="check only these tags")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--write-expected", action="store_true")
    ap.add_argument("--write-rust", action="store_true")
    args = ap.parse_args()

    if args.write_expected:
        write_expected(args.repo)

    expected = {fam: read_expected(fam) for fam in FAMILIES}
    tags = args.tags or imex_tags(args.repo, args.last)
    print(f"checking {len(tags)} tags with {args.jobs} jobs", flush=True)

    results = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futs = [pool.submit(check_tag, args.repo, t, expected) for t in tags]
        for fut in concurrent.futures.as_completed(futs):
            tag, res, opts = fut.result()
            results[tag] = (res, opts)

    assigned, left_out, failed = [], [], False
    opt_values = {}
    for tag in sorted(results, key=vkey):
        res, opts = results[tag]
        fams = [f for f, (ok, _) in res.items() if ok]
        for name, value in opts.items():
            opt_values.setdefault(name, {}).setdefault(value, []).append(tag)
        if len(fams) == 1:
            assigned.append((tag, fams[0]))
            print(f"{tag:12} {fams[0]}")
        else:
            left_out.append(tag)
            why = "; ".join(f"{f}: {r}" for f, (ok, r) in res.items() if not ok)
            print(f"{tag:12} NO FAMILY ({fams or 'none'}) -- {why}")

    for name, values in sorted(opt_values.items()):
        if len(values) > 1:
            failed = True
            print(f"CONFLICT: {name} has values {sorted(values)}")

    # The reference tag of each family must be its first release.
    for fam, (_num, ref) in FAMILIES.items():
        members = [t for t, f in assigned if f == fam]
        if not args.tags and (not members or members[0] != ref):
            failed = True
            print(f"ERROR: {fam}: reference tag {ref} is not the first member ({members[:1]})")

    print("\nfamilies:")
    for fam in FAMILIES:
        members = [t for t, f in assigned if f == fam]
        if members:
            print(f"  {fam}: {len(members):3} tags, {members[0]} ... {members[-1]}")
    if left_out:
        print("left out:", ", ".join(left_out))

    if args.write_rust and not args.tags:
        write_rust(assigned, left_out)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
