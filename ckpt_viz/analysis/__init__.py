"""The analysis of a trace: every fact derived from its events, computed once, as typed results.

The pages, the CLI, the lessons and `diagnose` read these and compute nothing of their own, so they
cannot disagree. Each module owns one kind of fact; each result is cached on its trace.

    lifecycle   each handle's states and transitions (NOTE [ Handle states ])
    handles     each handle's creation event and name
    passes      the parts of a step (F / DX / DW / B) and the backward passes
    routing     the DX/DW routing of a backward pass at a cursor, and the flow of DX between regions
    actions     pipeline actions, plan against execution, step time and bubbles
    memory      bytes by category over the run, the peak, per rank and per stage, tables in words
    findings    `Finding` and the causes of refused replays and leaks
    diagnosis   `diagnose`, `explain`: every problem of a run
    summary     the run in figures (counts, states, peak, findings)
    compare     two runs side by side, by part of the step and by action, and their differences in sentences
    words       the words of every page: states, phases, reasons, categories, an event in a sentence

Standard library only: never torch, a chart library or a UI.
"""
__all__: list[str] = []  # import the submodules: `from ckpt_viz.analysis.lifecycle import lifecycle`
