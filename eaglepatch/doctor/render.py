"""``doctor``'s text for people: per server, the findings by severity, each with its evidence and next step,
then what was read."""

from __future__ import annotations

from typing import Any

from eaglepatch.redact import shown, shown_argv

_SEV = {"high": "HIGH", "medium": "MEDIUM", "low": "LOW", "info": "INFO"}


def render(doc: Any) -> str:
    """The text of a ``doctor --json`` document (or a list of them, one per server)."""
    if isinstance(doc, list):
        return "\n\n".join(render(d) for d in doc)
    srv = doc.get("server")
    head = f"{doc['target']}: sglang {shown(doc.get('sglang_version') or '?')}"
    if srv:
        head += f", server pid {srv['pid']}" + (f" on :{srv['port']}" if srv.get("port") else "")
    n = len(doc["findings"])
    out = [f"{head}: {n} finding{'s' if n != 1 else ''}"]
    if srv:
        out.append("  " + shown_argv(srv["argv"]))
    for f in doc["findings"]:
        out.append("")
        out.append(f"{_SEV.get(f['severity'], f['severity'].upper()):<7}{f['id']}: {shown(f['title'])}")
        for e in f["evidence"]:
            where = f" [{shown(e['path'])}]" if e.get("path") else ""
            out.append(f"         {e['source']}: {shown(e['text'])}{where}")
            if e.get("line"):
                out.append(f"           | {shown(e['line'])}")
        out.append(f"       next: {f['next']}")
    src = doc.get("sources") or {}
    if src:
        out.append("")
        out.append("read:")
        for k, v in src.items():
            if isinstance(v, dict):
                v = ", ".join(f"{a} {b}" for a, b in v.items())
            out.append(f"  {k}: {shown(v)}")
    return "\n".join(out)
