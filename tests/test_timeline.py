"""The memory timeline: live bytes over XLA's schedule and the buffers live at the peak."""

from __future__ import annotations

import glob
from contextlib import contextmanager

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache

from remat_lab.analysis.hlo import fingerprint, product_keys
from remat_lab.analysis.timeline import MAX_POINTS, PHASES, compile_dumped, memory_timeline, uncached
from remat_lab.config import RunConfig
from remat_lab.model.models import names_of
from remat_lab.model.policies import POLICIES
from remat_lab.program.backend import enable_compilation_cache
from remat_lab.program.step import build_problem, make_step

JAX_POLICIES = [p for p, pol in POLICIES.items() if pol.group == "jax"]
KEYS = {"source", "instructions", "points", "by_phase", "peak_index", "peak_live_bytes", "at_peak", "note",
        "phases_from"}


def lowered_of(config: RunConfig):
    problem = build_problem(config)
    return jax.jit(make_step(problem)).trace(*problem.args).lower(), problem


def witness_of(config: RunConfig) -> str:
    """The no_remat compile's text of ``config`` (the witness the experiment passes)."""
    lowered, _ = lowered_of(config.replace(policy="no_remat"))
    return lowered.compile().as_text()


def timeline_of(config: RunConfig) -> dict:
    lowered, problem = lowered_of(config)
    return memory_timeline(lowered, depth=config.depth, names=names_of(config.model), paths=problem.paths,
                           witness=witness_of(config))


def check_invariants(doc: dict, problem=None) -> None:
    assert set(doc) == KEYS and doc["source"]
    points = doc["points"]
    assert 0 < len(points) <= MAX_POINTS
    assert doc["peak_live_bytes"] == max(v for _, v in points)
    assert [doc["peak_index"], doc["peak_live_bytes"]] in points
    assert sum(b["bytes"] for b in doc["at_peak"]) == doc["peak_live_bytes"]
    assert [b["bytes"] for b in doc["at_peak"]] == sorted((b["bytes"] for b in doc["at_peak"]), reverse=True)
    assert set(doc["by_phase"]) == set(PHASES)
    for i, (index, live) in enumerate(points):  # the phases stack up to the total
        assert sum(doc["by_phase"][p][i][1] for p in PHASES) == live
        assert all(doc["by_phase"][p][i][0] == index for p in PHASES)
    assert {b["phase"] for b in doc["at_peak"]} <= set(PHASES)
    assert all(set(b) == {"bytes", "shape", "dtype", "kind", "phase", "layer", "name", "instruction",
                          "op_name", "source", "source_op_name"} for b in doc["at_peak"])
    assert doc["note"] and "memory.peak_bytes" in doc["note"]
    if problem is not None:  # every parameter and the input are live at the peak, at their true sizes
        params = sorted(b["bytes"] for b in doc["at_peak"] if b["kind"] == "parameter")
        true = sorted([leaf.nbytes for leaf in problem.leaves] + [problem.x.nbytes])
        assert params == true
        shapes = sorted(tuple(b["shape"]) for b in doc["at_peak"] if b["kind"] == "parameter")
        assert shapes == sorted([tuple(leaf.shape) for leaf in problem.leaves] + [tuple(problem.x.shape)])


@pytest.mark.parametrize("policy", JAX_POLICIES)
def test_invariants_for_every_jax_policy(policy):
    config = RunConfig(width=128, batch=32, depth=2, policy=policy)
    lowered, problem = lowered_of(config)
    check_invariants(memory_timeline(lowered, depth=2, names=names_of("mlp"), paths=problem.paths), problem)


@pytest.mark.parametrize("config", [
    RunConfig(width=256, batch=64, depth=4, stack="scan", policy="nothing_saveable"),
    RunConfig(width=64, batch=8, depth=3, stack="loop", policy="dots_saveable", objective="grad"),
    RunConfig(model="transformer", width=64, batch=4, seq=16, heads=4, depth=2, policy="minimal"),
], ids=["scan", "loop-grad", "transformer"])
def test_invariants_on_several_configurations(config):
    lowered, problem = lowered_of(config)
    doc = memory_timeline(lowered, depth=config.depth, names=names_of(config.model), paths=problem.paths)
    check_invariants(doc, problem)
    if config.objective == "grad":  # the step returns the gradients: outputs of the parameters' sizes
        outputs = sorted(b["bytes"] for b in doc["at_peak"] if b["phase"] == "output")
        assert outputs == sorted(leaf.nbytes for leaf in problem.leaves)


def test_two_chained_matmuls_name_their_buffers():
    m, k, n, p = 512, 256, 1024, 128

    def f(a, b, c):
        with jax.named_scope("first"):
            h = a @ b
        with jax.named_scope("second"):
            return jnp.tanh(h) @ c

    args = [jnp.ones(s, jnp.float32) for s in ((m, k), (k, n), (n, p))]
    doc = memory_timeline(jax.jit(f).lower(*args), names=("first", "second"))
    assert set(doc) == KEYS
    at = doc["at_peak"]
    assert sum(b["bytes"] for b in at) == doc["peak_live_bytes"] == max(v for _, v in doc["points"])
    # The peak is the second product: its operand tanh(a @ b) (2 MiB) and its output live with the inputs.
    assert at[0]["bytes"] == m * n * 4 and at[0]["shape"] == [m, n] and at[0]["dtype"] == "f32"
    assert at[0]["kind"] == "temp" and at[0]["phase"] == "forward"
    assert at[0]["op_name"].endswith("second/tanh") and at[0]["name"] == "second"
    params = sorted(b["bytes"] for b in at if b["kind"] == "parameter")
    assert params == sorted(a.nbytes for a in args)
    out = [b for b in at if b["phase"] == "output"]
    assert len(out) == 1 and out[0]["shape"] == [m, p] and out[0]["bytes"] == m * p * 4
    assert out[0]["op_name"].endswith("second/dot_general")
    assert doc["peak_live_bytes"] == 4 * (m * k + k * n + n * p + m * n + m * p)


def test_scan_nothing_saveable_holds_fewer_forward_bytes_and_recomputes():
    docs = {p: timeline_of(RunConfig(width=256, batch=64, depth=4, stack="scan", policy=p))
            for p in ("no_remat", "nothing_saveable")}
    forward = {p: sum(b["bytes"] for b in d["at_peak"] if b["phase"] == "forward") for p, d in docs.items()}
    assert forward["nothing_saveable"] < forward["no_remat"]
    assert any(b["phase"] == "recomputed" for b in docs["nothing_saveable"]["at_peak"])
    assert not any(v for _, v in docs["no_remat"]["by_phase"]["recomputed"])
    assert docs["nothing_saveable"]["peak_live_bytes"] < docs["no_remat"]["peak_live_bytes"]


@pytest.mark.parametrize("depth", [1, 3])
def test_an_identical_program_has_no_recomputed_phase(depth):
    """Issue 24's case: a witness that compiles to the same program (the same fingerprint) leaves no
    recomputed bytes, although JAX's op_names put nothing_saveable's backward under
    ``rematted_computation``. Under XLA 0.10 nothing_saveable at objective grad, 256x64, compiled to
    no_remat's very program; XLA 0.12 keeps its recomputation (the fingerprints differ), so the
    identical witness here is the program's own compile."""
    base = RunConfig(width=256, batch=64, depth=depth, stack="loop", objective="grad",
                     policy="nothing_saveable")
    lowered, problem = lowered_of(base)
    compiled, dump = compile_dumped(lowered)
    text = compiled.as_text()
    assert fingerprint(text) != fingerprint(witness_of(base))  # XLA 0.12: not no_remat's program
    doc = memory_timeline(lowered, compiled=compiled, dump=dump, depth=depth, names=names_of("mlp"),
                          paths=problem.paths, witness=text)
    assert doc["phases_from"] == "no_remat witness"
    assert max(v for _, v in doc["by_phase"]["recomputed"]) == 0
    assert not any(b["phase"] == "recomputed" for b in doc["at_peak"])
    # By op_name alone (no witness) the same program shows recomputed bytes: what the witness fixes.
    by_name = memory_timeline(lowered, depth=depth, names=names_of("mlp"), paths=problem.paths)
    assert by_name["phases_from"] == "op_name"
    assert max(v for _, v in by_name["by_phase"]["recomputed"]) > 0


def test_recomputed_bytes_follow_what_the_program_does_more_than_no_remat():
    """Under scan, nothing_saveable compiles more products than no_remat (the witness counts them)
    and holds recomputed bytes; dots_saveable compiles no extra product (it recomputes only the
    elementwise values after its saved products): fewer recomputed bytes; no_remat none."""
    base = RunConfig(width=64, batch=8, depth=2, stack="scan")
    witness = witness_of(base)
    extra, recomputed = {}, {}
    for policy in ("no_remat", "dots_saveable", "nothing_saveable"):
        lowered, problem = lowered_of(base.replace(policy=policy))
        compiled = lowered.compile()
        extra[policy] = len(product_keys(compiled.as_text())) - len(product_keys(witness))
        doc = memory_timeline(lowered, compiled=compiled, depth=2, names=names_of("mlp"),
                              paths=problem.paths, witness=witness)
        recomputed[policy] = max(v for _, v in doc["by_phase"]["recomputed"])
    assert extra == {"no_remat": 0, "dots_saveable": 0, "nothing_saveable": extra["nothing_saveable"]}
    assert extra["nothing_saveable"] > 0
    assert recomputed["no_remat"] == 0 < recomputed["nothing_saveable"]
    assert recomputed["dots_saveable"] < recomputed["nothing_saveable"]


def test_downsampling_keeps_the_peak():
    from remat_lab.analysis.timeline import _downsample

    live = np.arange(10_000) % 977
    live[4321] = 10**6
    picks = _downsample(live, 100)
    assert len(picks) <= 101 and 4321 in picks


@contextmanager
def persistent_cache(folder):
    """JAX's persistent compilation cache on, in ``folder``; the process's settings restored after."""
    keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes", "jax_enable_compilation_cache")
    saved = {k: getattr(jax.config, k) for k in keys}
    try:
        enable_compilation_cache(str(folder))
        jax.config.update("jax_enable_compilation_cache", True)
        compilation_cache.reset_cache()
        yield
    finally:
        for k, v in saved.items():
            jax.config.update(k, v)
        compilation_cache.reset_cache()


def test_a_warm_persistent_cache_does_not_lose_the_timeline(tmp_path):
    with persistent_cache(tmp_path / "cache"):
        lowered, problem = lowered_of(RunConfig(width=96, batch=24, depth=2, policy="nothing_saveable"))
        lowered.compile()  # warm the cache
        assert any((tmp_path / "cache").iterdir())
        dump = tmp_path / "dump"
        lowered.compile(compiler_options={"xla_dump_to": str(dump)})  # a cache hit: XLA dumps nothing
        assert not glob.glob(str(dump / "*live-range.txt"))
        again, _ = lowered_of(RunConfig(width=96, batch=24, depth=2, policy="nothing_saveable"))
        compiled, dumped = compile_dumped(again)  # as run_experiment compiles: a hit, no dump
        assert dumped is None
        doc = memory_timeline(again, compiled=compiled, dump=dumped, depth=2, names=names_of("mlp"),
                              paths=problem.paths)
        check_invariants(doc, problem)
        assert jax.config.jax_enable_compilation_cache  # the timeline turned the cache back on


def test_a_cache_hit_reuses_the_dump_kept_beside_the_cache(tmp_path, monkeypatch):
    """A new session (empty process caches) hitting the persistent cache compiles no copy: the
    first compile's dump was kept beside the cache, keyed by the program text."""
    from remat_lab.analysis import timeline

    with persistent_cache(tmp_path / "cache"):
        config = RunConfig(width=80, batch=24, depth=2, policy="nothing_saveable")
        label = {"depth": 2, "names": names_of("mlp")}
        lowered, problem = lowered_of(config)
        compiled, dump = compile_dumped(lowered)  # cold: dumps, and the timeline keeps the dump
        assert dump is not None
        first = memory_timeline(lowered, compiled=compiled, dump=dump, paths=problem.paths, **label)
        assert list((tmp_path / "cache" / "timeline_dumps").glob("*.json.gz"))
        monkeypatch.setattr(timeline, "_DUMPS", {})  # a new process
        monkeypatch.setattr(timeline, "uncached", None)  # calling it would fail the test
        again, _ = lowered_of(config)
        compiled, dumped = compile_dumped(again)  # a persistent-cache hit: no dump
        assert dumped is None
        second = memory_timeline(again, compiled=compiled, dump=dumped, paths=problem.paths, **label)
        assert second == first


def test_the_steps_own_dump_gives_the_same_timeline_as_a_copy():
    config = RunConfig(width=128, batch=16, depth=2, stack="scan", policy="dots_saveable")
    lowered, problem = lowered_of(config)
    label = {"depth": 2, "names": names_of("mlp"), "paths": problem.paths}
    with uncached():
        compiled, dump = compile_dumped(lowered)
    assert dump is not None
    own = memory_timeline(lowered, compiled=compiled, dump=dump, **label)
    copy = memory_timeline(lowered_of(config)[0], **label)
    assert own == copy  # the note too: a result reads the same whichever compile dumped it


def test_run_experiment_reports_the_timeline(run):
    result = run(RunConfig(width=64, batch=8))
    doc = result["memory_timeline"]
    check_invariants(doc)
    assert result["compile"]["timeline_s"] > 0
    assert doc["peak_live_bytes"] <= result["memory"]["peak_bytes"] + 4096
