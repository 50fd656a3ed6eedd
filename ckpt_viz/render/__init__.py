"""Renderers: draw what `ckpt_viz.analysis` derives from a trace, as text, graphviz graphs or altair charts.

Each renderer takes the trace (or its events) and the cursor, reads every fact from `ckpt_viz.analysis`,
and computes nothing of its own; colours are `palette`'s, words `ckpt_viz.analysis.words`'. No torch, no UI.

    text       render_text: one line per event (terminals, lessons, golden tests)
    eventlog   filter events, table rows, plain text and CSV of them
    graph      the autograd graph at the cursor (checkpoint regions) and torchviz's view, as graphviz.Digraph
    routing    the DX/DW routing of the backward pass at the cursor, as graphviz.Digraph
    svg        DOT drawn by `dot` as inert SVG
    memory     bytes by category over the run, runs compared, peaks, each rank of a merged run (altair)
    swimlane   handle lifecycles as lanes (altair)
    timeline   the pipeline schedule, bytes per stage on its x, busy and idle time per rank and stage (altair)
    perfetto   the Chrome trace-event format
    palette    the colours
"""
__all__: list[str] = []  # import the submodules: `from ckpt_viz.render.memory import render_memory`
