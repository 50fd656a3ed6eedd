"""The crafted traces of issue 25's findings, written next to this file (schema 3).

    .venv/bin/python tests/data/hostile/make_traces.py

Each file is a real recorded run with attacker-chosen text put where a trace carries text: labels, tags,
sites, function names, error messages, descriptions, torchviz labels, source lines. Script in any of them
must not run, markdown must not render, nothing may be fetched from another host (tests/app and tests/cli
open each). The traces that must be refused at load (reverse order, duplicate seqs, totals past 2**63,
wrong types) are made by `refused_documents()` as JSON text, since `Trace.save` refuses to write them.
"""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

HERE = Path(__file__).resolve().parent
MARKER = "CKPT_VIZ_PWNED"  # what an injected script would set: window.CKPT_VIZ_PWNED / document.title
HOST = "127.0.0.2:9"  # an address other than the app's: a request to it is a leak (nothing listens there)
SCRIPT = f"<script>window.{MARKER}=1;document.title='{MARKER}'</script>"
IMG = f"<img src=x onerror=\"window.{MARKER}=1\">"
MARKDOWN_IMAGE = f"![x](http://{HOST}/leak.png)"
LINK = f"[click](javascript:window.{MARKER}=1)"
FONT = f"<FONT FACE=\"x\"><A HREF=\"javascript:window.{MARKER}=1\">a</A></FONT>"
CSV = "=HYPERLINK(\"http://127.0.0.2:9/x\",\"click\")"
EVIL = f"{MARKDOWN_IMAGE} {SCRIPT} {IMG} `code` {LINK} {FONT} :red[red] {CSV}"


def base_trace() -> Any:
    """A real recorded run: the built-in mlp, split-reentrant, with memory and graph snapshots."""
    from ckpt_viz.run.scenarios import run_scenario
    from ckpt_viz.run.zoo import build_builtin

    return run_scenario(build_builtin("mlp"), "split-reentrant", memory=True, graphs=True)


def evil_text_trace() -> Any:
    """Every text field of a real trace replaced or prefixed by EVIL (finding 1 and 3 of issue 25)."""
    from ckpt_viz.events import Error, HandleCreated
    from ckpt_viz.trace import GraphNode, GraphSnapshot, TorchvizGraph, TorchvizNode, Trace

    trace = base_trace()
    events = []
    for e in trace.events:
        changes: dict[str, Any] = {"tags": {"stage": EVIL, "microbatch": 0, "note": EVIL},
                                   "site": f"{EVIL}.py:12`); alert(1); (`"}
        if isinstance(e, HandleCreated):
            changes.update(function=EVIL, label=EVIL)
        events.append(msgspec.structs.replace(e, **changes))
    last = events[-1]
    events.append(Error(seq=last.seq + 1, t_ns=last.t_ns + 1, where=EVIL, type=EVIL, message=EVIL, site=EVIL))
    graphs = []
    for g in trace.graphs:
        nodes = tuple(msgspec.structs.replace(n, name=EVIL if n.kind == "leaf" else n.name) for n in g.nodes)
        viz = TorchvizGraph(nodes=tuple(TorchvizNode(id=n.id, label=f"{EVIL}\n{n.label}", fill=n.fill)
                                        for n in g.torchviz.nodes), edges=g.torchviz.edges) if g.torchviz else None
        graphs.append(GraphSnapshot(seq=g.seq, label=EVIL, nodes=nodes, edges=g.edges, torchviz=viz))
    meta = dict(trace.meta)
    meta.update(model=EVIL, description=EVIL, look_at=EVIL, sources={f"{EVIL}.py:12`); alert(1); (`": EVIL})
    return Trace(events=events, memory=trace.memory, graphs=graphs, meta=meta)


def big_graph_trace(nodes: int = 20_000) -> Any:
    """A trace whose one snapshot has `nodes` nodes in a chain (finding 5: `dot` with no limit)."""
    from ckpt_viz.trace import GraphNode, GraphSnapshot

    trace = base_trace()
    chain = tuple(GraphNode(id=i, name="AddBackward0") for i in range(nodes))
    edges = tuple((i, i + 1) for i in range(nodes - 1))
    trace.graphs[:] = [GraphSnapshot(seq=trace.events[-1].seq, label="a very big graph", nodes=chain, edges=edges)]
    return trace


def refused_documents() -> dict[str, str]:
    """name -> JSON text of a trace file that `Trace.load` must refuse with a message (finding 8)."""
    doc = json.loads(base_trace().to_json())
    out = {}

    def variant(name: str, change: Any) -> None:
        copy = json.loads(json.dumps(doc))
        change(copy)
        out[name] = json.dumps(copy)

    variant("reverse_order", lambda d: d["events"].reverse())
    variant("duplicate_seq", lambda d: d["events"].__setitem__(1, dict(d["events"][1], seq=d["events"][0]["seq"])))
    variant("total_past_2_63", lambda d: d["memory"][0]["bytes_by_category"].__setitem__("parameters", 2**63 + 5))
    variant("int_past_64_bits", lambda d: d["events"][0].__setitem__("session_id", 10**30))
    variant("wrong_type_field", lambda d: d["events"][0].__setitem__("split", "yes"))
    variant("wrong_type_reason", lambda d: next(e for e in d["events"] if e["kind"] == "released")
            .__setitem__("reason", ["dw_complete"]))
    variant("unknown_kind", lambda d: d["events"][0].__setitem__("kind", "<script>"))
    variant("handle_id_negative", lambda d: d["events"][0].__setitem__("handle_id", -1))
    variant("sample_past_end", lambda d: d["memory"][-1].__setitem__("seq", 10**9))
    variant("schema_2", lambda d: d.__setitem__("schema_version", 2))
    variant("meta_sources_wrong", lambda d: d["meta"].__setitem__("sources", [EVIL]))
    variant("tags_nested", lambda d: d["events"][0].__setitem__("tags", {"stage": {"deep": [1, 2]}}))
    return out


def main() -> None:
    evil_text_trace().save(HERE / "evil_text.json.gz")
    for name, text in refused_documents().items():
        (HERE / "refused").mkdir(exist_ok=True)
        (HERE / "refused" / f"{name}.json.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
    print(f"wrote {HERE / 'evil_text.json.gz'} and {len(refused_documents())} refused documents", file=sys.stderr)


if __name__ == "__main__":
    main()
