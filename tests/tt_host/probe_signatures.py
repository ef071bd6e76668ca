"""Run by the ttnn venv (Python 3.12, numpy only): check calls against the real signatures.

stdin: JSON {"calls": [[path, positional, [keywords], where]...], "attrs": [path...]};
stdout: a line "TTNN_PROBE_RESULT " + JSON {"checked": n, "problems": [...]}.
"""

import inspect
import json
import re
import sys

import ttnn


def resolve(path):
    obj = ttnn
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def overloads(obj):
    """[(positional names, keyword names, has **kwargs)] for every overload."""
    target = obj.__init__ if isinstance(obj, type) else getattr(obj, "function", obj)
    call = type(target).__dict__.get("__call__")  # FastOperation: signature on the nb type
    nb = getattr(call, "__nb_signature__", None)
    nb = nb or getattr(target, "__nb_signature__", None)
    out = []
    if nb:
        for entry in nb:
            text = entry[0]
            m = re.search(r"\((.*)\)\s*(->|$)", text, re.S)
            params = [p.strip() for p in _split(m.group(1))] if m else []
            names, pos, kwonly, star = [], [], False, False
            for p in params:
                if p in ("self", "\\*", "*"):
                    kwonly = kwonly or p != "self"
                    continue
                if p.startswith("**"):
                    star = True
                    continue
                name = p.split(":")[0].split("=")[0].strip()
                names.append(name)
                if not kwonly:
                    pos.append(name)
            out.append((pos, names, star))
        return out
    s = inspect.signature(target)
    pos = [
        p.name
        for p in s.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
    ]
    names = [p.name for p in s.parameters.values() if p.name != "self"]
    star = any(p.kind is p.VAR_KEYWORD for p in s.parameters.values())
    return [(pos, names, star)]


def _split(text):
    depth, cur, out = 0, "", []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return out


def main():
    req = json.load(sys.stdin)
    problems, checked = [], 0
    for path in req["attrs"]:
        try:
            resolve(path)
            checked += 1
        except AttributeError as exc:
            problems.append(f"ttnn.{path}: missing attribute ({exc})")
    for path, npos, kws, where in req["calls"]:
        try:
            obj = resolve(path)
        except AttributeError:
            problems.append(f"{where} ttnn.{path}: no such function")
            continue
        fits = False
        for pos, names, star in overloads(obj):
            if (
                npos <= len(pos)
                and all(k in names or star for k in kws)
                and not set(kws) & set(pos[:npos])
            ):
                fits = True
        checked += 1
        if not fits:
            problems.append(
                f"{where} ttnn.{path}({npos} positional, {kws}): no overload accepts it"
            )
    print("TTNN_PROBE_RESULT " + json.dumps({"checked": checked, "problems": problems}))


main()
