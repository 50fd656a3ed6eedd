"""Schema 1 documents for the tests: the layout of traces written before schema 2 (no packed columns).

`as_schema1(doc)` rewrites a schema 2 document the way a schema 1 writer laid it out: every event
column a plain list, and `data` one object per event. The tests run the old reader's checks on it.
"""
from __future__ import annotations

import copy
from typing import Any

from ckpt_viz.trace.packed import DataColumn, data_shape, unpack_runs
from ckpt_viz.trace.schema import RUN_COLUMNS


def as_schema1(doc: dict[str, Any]) -> dict[str, Any]:
    old = copy.deepcopy(doc)
    old["schema_version"] = 1
    columns = old["events"]["columns"]
    data = columns["data"]
    if type(data) is dict:
        columns["data"] = list(DataColumn(data["keys"], data_shape(data, columns["context"]), data["values"]))
    for key in RUN_COLUMNS:
        columns[key] = unpack_runs(columns[key])
    return old
