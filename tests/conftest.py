"""Shared fixtures: a fixed seed, fresh runtime state, a private temp folder, a recorder, a tiny model, gpu skip."""
from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import ckpt_viz
from ckpt_viz.runtime.reset import reset_state

# `tests/models.py` is imported as `models` by the test files.
sys.path.insert(0, os.path.dirname(__file__))

from models import Stack


@pytest.fixture(autouse=True)
def seed() -> int:
    """Every test starts from the same global RNG state."""
    torch.manual_seed(0)
    return 0


@pytest.fixture(autouse=True)
def fresh_runtime_state() -> None:
    """Every test starts without the sessions, memory hook or handle numbering an earlier test left."""
    reset_state()


@pytest.fixture(autouse=True)
def private_tempdir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`tempfile` (and child processes, through TMPDIR) use a folder of this test's own, not /tmp.

    So a test that looks for what it left in the temp folder (the sandbox's `ckpt_viz_sandbox_*`)
    never sees another process's folders. Separate from `tmp_path`, whose contents tests assert.
    """
    folder = tmp_path_factory.mktemp("tempdir")
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


@pytest.fixture(autouse=True)
def torch_operator_log() -> Iterator[None]:
    """Every test ends with torch's operator logger ("LoggingTensor") as a fresh one: propagating, no level, no filters.

    torch's debug-mode checkpoint (`debug=True`) leaves it at INFO, not propagating, with its traceback filters on.
    pytest then hangs its log-capture handlers on it in every later test (it attaches them to each logger that does
    not propagate), and the next debug-mode checkpoint's operator log, whose arguments are not %-format arguments,
    raises in pytest's formatting: tests/recording/test_torch_observer.py passed or failed by whether a test such as
    tests/runtime/test_dropin.py's debug tests had run before it in the same process.
    """
    yield
    logger = logging.Logger.manager.loggerDict.get("LoggingTensor")
    if isinstance(logger, logging.Logger):
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
        for found in list(logger.filters):
            logger.removeFilter(found)


@pytest.fixture
def recorder() -> Iterator[ckpt_viz.Recording]:
    """A `ckpt_viz.record()` block open for the whole test; read `recorder.trace`."""
    with ckpt_viz.record() as rec:
        yield rec


@pytest.fixture
def mlp2() -> Stack:
    """Two checkpointed tanh blocks, 4 -> 5 -> 3, parameters captured by closure."""
    return Stack.mlp([4, 5, 3], seed=0)


# Tests that take more than about 5 s (`pytest --durations=0`, on the 2-core development machine), by file:
# the inner loop `pytest -m "not slow and not browser"` skips them. Kept here, in one list, so that the files
# themselves stay about what they test. A name stands for every parametrization of that test.
SLOW: dict[str, set[str]] = {
    "app/test_app.py": {
        "test_a_broken_model_file_shows_its_error_and_the_app_recovers",
        "test_a_model_file_that_runs_too_long_is_stopped_by_the_time_limit",
        "test_an_uploaded_model_file_runs_in_the_sandbox",
        "test_bench_app_runs_on_a_small_trace",
        "test_chart_and_table_agree_after_more_than_16_sources",
        "test_every_page_renders_for_a_model_file_run_in_the_sandbox",
        "test_first_screen_shows_a_recorded_run_of_the_default_model",
    },
    "app/test_figures_agree.py": {"test_every_built_in_model_in_every_mode", "test_every_broken_run"},
    "app/test_browser_hostile.py": {"test_a_crafted_trace_shows_as_text_on_every_page"},
    "bench/test_benchmarks_smoke.py": {"test_bench_runtime_quick"},
    "cli/test_cli.py": {"test_record_info_export_round_trip"},
    "cli/test_cli_record.py": {"test_a_run_stopped_at_its_time_limit_keeps_its_trace_marked_partial"},
    "usermodel/test_example_train_hf.py": {"test_the_example_records_each_step_of_the_loop"},
    "usermodel/test_observe_hf.py": {"test_the_loop_as_it_comes_is_recorded_layer_by_layer_and_bit_identical",
                                     "test_ckpt_viz_hf_enable_runs_ckpt_vizs_checkpoint_through_hfs_mechanism"},
    "recording/test_probe_graph.py": {"test_record_graphs_snapshots_every_top_level_backward_with_zero_extra_replays"},
    "run/test_determinism.py": {
        "test_a_run_records_the_same_trace_in_a_second_process",
        "test_eight_concurrent_runs_on_threads_give_the_solo_traces",
    },
    "run/test_pipeline.py": {
        "test_every_handle_replays_once_and_dw_releases_it",
        "test_executed_order_is_the_schedule",
        "test_gradients_equal_the_unpipelined_model",
        "test_graph_snapshots_one_per_backward_call",
        "test_meta_and_run_scenario_dispatch",
    },
    "runtime/test_compile_fallback.py": {"test_nonreentrant_checkpoint_delegates_to_torch_when_compiling"},
    "runtime/test_exclude.py": {"test_chain_elided_output_is_freed_nonreentrant"},
    "runtime/test_property.py": {"test_ordinary_backward_matches_reference", "test_split_backward_matches_reference"},
    "usermodel/test_sandbox.py": {
        "test_good_model_gives_the_same_trace_as_in_process",
        "test_memory_limit_gives_a_clear_error",
        "test_syntax_error_passes_through_verbatim",
        "test_timeout_kills_the_child_and_its_subprocesses",
        "test_a_memory_limit_too_small_to_start_says_so",
        "test_event_cap_applies_to_a_sandboxed_run",
    },
}
TESTS = Path(__file__).resolve().parent


def _slow(item: pytest.Item) -> bool:
    try:
        where = item.path.resolve().relative_to(TESTS).as_posix()
    except ValueError:  # a test outside tests/ (e.g. the checker's own planted files)
        return False
    return getattr(item, "originalname", item.name) in SLOW.get(where, ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = None if torch.cuda.is_available() else pytest.mark.skip(reason="CUDA is unavailable")
    for item in items:
        if _slow(item):
            item.add_marker(pytest.mark.slow)
        if skip_gpu is not None and "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# ---------------------------------------------------------------- browser tests (tests/app/test_browser*.py)
# One `streamlit run` server for the whole session, a fresh chromium per test; helpers in tests/browser.py.

@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The app served by a real Streamlit subprocess on 127.0.0.1, shared by every browser test."""
    from browser import CHROMIUM, streamlit_server

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    with streamlit_server(tmp_path_factory.mktemp("server") / "streamlit.log") as url:
        yield url


@pytest.fixture
def browser_page(server: str, tmp_path: Path):
    """A page of a fresh headless chromium (own profile, 1500x1000), opened on the app and settled.
    `browser_page.errors` collects uncaught page errors; `browser_page.requests` every requested URL."""
    from playwright.sync_api import sync_playwright

    from browser import CHROMIUM, CHROMIUM_ARGS, settle

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
            viewport={"width": 1500, "height": 1000})
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.errors, page.requests = [], []
            page.on("pageerror", lambda exc: page.errors.append(str(exc)))
            context.on("request", lambda request: page.requests.append(request.url))
            page.goto(server, timeout=60_000)
            settle(page, 120_000)  # the first run records the default model
            yield page
        finally:
            context.close()


@pytest.fixture(scope="session")
def matrix_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The matrices' saved trace (mlp, reentrant, recorded here) and merged 2-rank trace (tests/data/distributed by
    `ckpt-viz merge`'s code), as files the app opens by path: {"saved": path, "merged": path}."""
    from ckpt_viz.cli.merge import merge_run
    from ckpt_viz.run.obtain import RunRequest, obtain_trace

    folder = tmp_path_factory.mktemp("matrix")
    obtain_trace(RunRequest("builtin", "mlp", mode="reentrant")).save(folder / "saved.json")
    merged, _ = merge_run(str(Path(__file__).resolve().parent / "data" / "distributed"))
    assert {e.tags.get("rank") for e in merged} == {0, 1}
    merged.save(folder / "merged.json")
    return {"saved": str(folder / "saved.json"), "merged": str(folder / "merged.json")}
