#!/usr/bin/env python3
"""Checks that scripts/host-packages.txt (what scripts/test-all.sh installs) covers every
external command the tests run on the host.

The commands are found statically in:
  * the shell scripts the test command runs on the host (scripts/*.sh, tests/xen-lab/*.sh) and
    the dist/ scripts the tests run: every word in command position (first word of a command,
    after `|`, `;`, `&&`, `||`, `$(`, `then`, `do`, ..., `timeout N`, `nice -n N`, `sudo`,
    `command -v`), outside comments, quoted text, awk programs and here-documents;
  * the Rust sources: `Command::new("literal")`.
Not scanned: tests/xen-lab/guest/* and tests/xen-lab/scenarios/*, which run inside the VMs.

Fails if a command is neither a shell builtin/keyword/function, nor provided by rustup
(cargo, rustup, cargo-fuzz), nor claimed by a package in the list. With --installed (as
test-all.sh runs it, after installing the list) it also asks dpkg: every listed package must be
installed, and every command must be shipped by a listed package or one of its dependencies
(so a wrong mapping in the list fails too).

    scripts/check-host-deps.py [--installed] [-v]
"""

import glob
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

HOST_SCRIPTS = ["scripts/*.sh", "tests/xen-lab/*.sh", "dist/xl-vrdma-*"]
RUST_SOURCES = ["**/*.rs"]

BUILTINS = set(
    """
    . : [ [[ ]] alias bg bind break builtin caller case cd command compgen complete continue
    declare dirs disown do done echo elif else enable esac eval exec exit export false fc fg fi
    for function getopts hash help history if in jobs kill let local logout mapfile popd printf
    pushd pwd read readarray readonly return select set shift shopt source suspend test then
    time times trap true type typeset ulimit umask unalias unset until wait while { } !
    """.split()
)
# `kill` is a builtin in bash, but Rust tests run /bin/kill.
BUILTINS.discard("kill")
# Installed by rustup (README: install Rust with rustup), not by apt; cargo-fuzz by cargo.
RUSTUP = {"cargo", "rustup", "cargo-fuzz", "rustc"}
# Words that prefix a command: skip them (and their option arguments) to find the command.
PREFIXES = {"timeout", "nice", "sudo", "env", "exec", "command", "nohup", "xargs"}
KEYWORDS_BEFORE_COMMAND = {"then", "do", "else", "elif", "if", "while", "until", "!", "time"}
# Variables that hold a command prefix (`$SUDO apt-get`, `"${nice_cmd[@]}" cargo`): the word
# after them is the command. Any other command in a variable (`"$XL" create`) is the caller's.
PREFIX_VARS = re.compile(r'^"?\$\{?(SUDO|nice_cmd)\b')
# Words the static scan finds that are not commands.
NOT_COMMANDS = {
    "round",  # python3 -c "print(round(...))" inside a quoted $(...) in run-lab.sh
}


def load_packages():
    """package -> commands it claims, from scripts/host-packages.txt."""
    pkgs = {}
    with open(os.path.join(ROOT, "scripts/host-packages.txt")) as f:
        for line in f:
            line = line.split("#", 1)[0].split()
            if line:
                pkgs[line[0]] = set(line[1:])
    return pkgs


def strip_shell(text):
    """The script with comments, quoted text (except command substitutions inside double
    quotes), single-quoted programs and here-document bodies removed; one logical line per
    physical line, command substitutions also as lines of their own."""
    out = []
    extra = []
    i, n = 0, len(text)
    heredocs = []
    line = []
    while i < n:
        c = text[i]
        if c == "\n":
            out.append("".join(line))
            line = []
            i += 1
            # Skip here-document bodies that start after this line.
            for tag in heredocs:
                while i < n:
                    j = text.find("\n", i)
                    j = n if j < 0 else j
                    body_line = text[i:j]
                    i = j + 1
                    if body_line.strip() == tag:
                        break
            heredocs = []
            continue
        if c == "\\":
            if i + 1 < n and text[i + 1] == "\n":
                line.append(" ")
            i += 2
            continue
        if c == "#" and (not line or line[-1] in " \t;|&("):
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c == "'":
            j = text.find("'", i + 1)
            j = n if j < 0 else j
            line.append("''")
            i = j + 1
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            inner = text[i + 1 : j]
            for m in re.finditer(r"\$\(([^()]*)\)?", inner):
                extra.append(m.group(1))
            line.append('""')
            i = j + 1
            continue
        if text.startswith("<<", i):
            m = re.match(r"<<-?\s*['\"]?([A-Za-z_]+)['\"]?", text[i:])
            if m:
                heredocs.append(m.group(1))
                line.append(" ")
                i += m.end()
                continue
        line.append(c)
        i += 1
    out.append("".join(line))
    return out + extra


WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_.+-]*$")


def commands_in_line(line, functions):
    found = []
    # Separators after which a new command starts.
    for seg in re.split(r"\|\||&&|[;|&(){}`]|\$\(", line):
        words = seg.split()
        k = 0
        while k < len(words):
            w = words[k]
            if w in KEYWORDS_BEFORE_COMMAND:
                k += 1
                continue
            if re.match(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?=", w):  # VAR=value prefix
                k += 1
                continue
            if PREFIX_VARS.match(w):
                k += 1
                continue
            break
        if k >= len(words):
            continue
        w = words[k]
        if w in ("for", "case", "select", "function", "declare", "local", "export", "readonly"):
            continue
        if w in PREFIXES:
            found.append(w)
            rest = words[k + 1 :]
            # Skip the prefix's options and their arguments, then the command follows.
            while rest and (rest[0].startswith("-") or re.match(r"^[0-9.]+[smhd]?$", rest[0])):
                rest = rest[1:]
            if w == "env":
                while rest and "=" in rest[0]:
                    rest = rest[1:]
            if rest:
                found.extend(commands_in_line(" ".join(rest), functions))
            continue
        if not WORD.match(w) or w in BUILTINS or w in functions or w in NOT_COMMANDS:
            continue
        found.append(w)
    return found


def shell_commands():
    cmds = {}
    paths = [p for pattern in HOST_SCRIPTS for p in sorted(glob.glob(os.path.join(ROOT, pattern)))]
    texts = {p: open(p).read() for p in paths}
    # Functions of any script (extra-tests.sh is sourced by test-all.sh and uses its `skip`).
    functions = set()
    for text in texts.values():
        functions |= set(re.findall(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(\)", text, re.M))
    for path, text in texts.items():
        # Array assignments (`PKGS=(a b` newline `c)`) hold words, not commands.
        stripped = re.sub(r"\b[A-Za-z_][A-Za-z0-9_]*\+?=\([^)]*\)", " ", "\n".join(strip_shell(text)))
        for line in stripped.split("\n"):
                for c in commands_in_line(line, functions):
                    cmds.setdefault(c, set()).add(os.path.relpath(path, ROOT))
    return cmds


def rust_commands():
    cmds = {}
    for pattern in RUST_SOURCES:
        for path in glob.glob(os.path.join(ROOT, pattern), recursive=True):
            rel = os.path.relpath(path, ROOT)
            if "/target/" in "/" + rel or rel.startswith("target/"):
                continue
            with open(path, errors="replace") as f:
                text = f.read()
            for m in re.finditer(r'Command::new\(\s*"([^"]+)"', text):
                cmds.setdefault(m.group(1), set()).add(rel)
            # Literal argv[0] in a list handed to a runner: ["sh", "-c", ...].
            for m in re.finditer(r'"--",\s*"([a-z][a-z0-9-]*)"', text):
                cmds.setdefault(m.group(1), set()).add(rel)
    return cmds


def dpkg_owner(cmd):
    """The package shipping /usr/bin/CMD (or /bin, /usr/sbin, /sbin; alternatives resolved)."""
    candidates = []
    for d in ("/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        p = os.path.join(d, cmd)
        if os.path.exists(p):
            candidates += [p, os.path.realpath(p)]
    for p in candidates:
        for alt in (p, re.sub(r"^/usr", "", p)):
            r = subprocess.run(["dpkg", "-S", alt], capture_output=True, text=True)
            for line in r.stdout.splitlines():
                if line.startswith("diversion"):
                    continue
                pkg, _, path = line.partition(": ")
                if path.strip() == alt:
                    return pkg.split(":")[0].split(",")[0].strip()
    return None


def installed(pkg):
    r = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True
    )
    return r.returncode == 0 and "ok installed" in r.stdout


def dependency_closure(pkgs):
    seen = set()
    todo = list(pkgs)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        r = subprocess.run(
            ["dpkg-query", "-W", "-f=${Depends}, ${Pre-Depends}, ${Provides}", p],
            capture_output=True,
            text=True,
        )
        for alt in r.stdout.split(","):
            for name in alt.split("|"):
                name = name.strip().split(" ")[0].split(":")[0]
                if name and installed(name):
                    todo.append(name)
    return seen


def main():
    check_installed = "--installed" in sys.argv
    verbose = "-v" in sys.argv
    pkgs = load_packages()
    claimed = {c: p for p, cs in pkgs.items() for c in cs}
    used = shell_commands()
    for c, where in rust_commands().items():
        used.setdefault(c, set()).update(where)

    errors = []
    for cmd in sorted(used):
        if cmd in BUILTINS or cmd in RUSTUP:
            continue
        where = ", ".join(sorted(used[cmd]))
        if cmd not in claimed:
            owner = dpkg_owner(cmd) if shutil.which("dpkg") else None
            hint = f" (on this machine it comes from Debian package {owner})" if owner else ""
            errors.append(
                f"{cmd}: used by {where}, but no package in scripts/host-packages.txt "
                f"provides it{hint}"
            )
        elif verbose:
            print(f"ok  {cmd:<22} {claimed[cmd]:<16} {where}")

    if check_installed:
        closure = dependency_closure([p for p in pkgs if installed(p)])
        for p in pkgs:
            if not installed(p):
                errors.append(f"package {p} is in scripts/host-packages.txt but not installed")
        for cmd, pkg in sorted(claimed.items()):
            owner = dpkg_owner(cmd)
            if owner is None:
                errors.append(f"{cmd}: claimed by {pkg} but not installed in /usr/bin, /bin, /usr/sbin or /sbin")
            elif owner not in closure:
                errors.append(
                    f"{cmd}: claimed by {pkg}, but it comes from {owner}, which is not in the "
                    f"list nor a dependency of a listed package"
                )

    if errors:
        for e in errors:
            print(f"check-host-deps: {e}", file=sys.stderr)
        return 1
    n = len([c for c in used if c not in BUILTINS and c not in RUSTUP])
    print(
        f"check-host-deps: {n} host commands, all provided by the {len(pkgs)} packages of "
        f"scripts/host-packages.txt" + (" (installed, checked with dpkg)" if check_installed else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
