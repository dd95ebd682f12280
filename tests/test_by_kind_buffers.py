"""The training step's memory by kind, read from its own buffers at the peak (analysis/by_kind_buffers.py).

Parameters and optimizer state are checked against the hand count (parameter count x dtype bytes;
AdamW's two moments in the optimizer dtype and its int32 step count) and, with the input, against
XLA's own ``argument_size_in_bytes``; the kinds read at the peak against the live bytes the dump
gives there and XLA's temporary and output allocations.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from remat_lab.analysis import by_kind_buffers
from remat_lab.analysis.by_kind import memory_by_kind, source
from remat_lab.analysis.by_kind_buffers import compile_with_dump, kinds_from_buffers, read_kinds
from remat_lab.analysis.costs import memory_report
from remat_lab.config import RunConfig
from remat_lab.model.models import block_names
from remat_lab.program.step import abstract_problem, jit_program, model_report, program_args
from remat_lab.studies.experiment import run_experiment

# batch 8 != width 64: no activation has a weight's shape
MLP = dict(model="mlp", width=64, batch=8, depth=2, stack="scan", policy="nothing_saveable", step="train")
W, D, B = 64, 2, 8
P = D * (2 * W * W + 2 * W)  # two kernels and two biases per block
KINDS = ("parameters", "optimizer_state", "gradients", "activations", "logits", "other")


def _kinds(doc: dict) -> dict:
    return {k: v for k, v in doc["memory"]["by_kind"].items() if k != "method"}


def _detail(cfg: RunConfig) -> tuple[dict, dict]:
    problem = abstract_problem(cfg)
    compiled, dump = compile_with_dump(jit_program(problem).trace(*program_args(problem)).lower())
    memory = memory_report(compiled)
    return kinds_from_buffers(dump, memory, depth=cfg.depth, names=block_names(cfg)), memory


def test_train_step_kinds_are_read_from_its_buffers_and_match_the_hand_count():
    doc = run_experiment(RunConfig(**MLP, compile_only=True))  # this machine's CPU, nothing run
    mem, kinds = doc["memory"], _kinds(doc)
    assert mem["by_kind_source"] == "buffers" and mem["by_kind"]["method"] == by_kind_buffers.METHOD
    assert kinds["parameters"] == P * 4  # float32
    assert kinds["optimizer_state"] == 2 * P * 4 + 4  # mu and nu in float32, the int32 count
    # with the input, exactly the arguments XLA allocates (its memory analysis, not the dump)
    assert kinds["parameters"] + kinds["optimizer_state"] + B * W * 4 == mem["argument_bytes"]
    assert sum(kinds.values()) == mem["peak_bytes"]
    # the peak is in the scanned backward: the stacked accumulators hold every layer's gradient
    assert kinds["gradients"] == P * 4
    assert kinds["activations"] > 0 and kinds["logits"] == 0
    # what the peak's buffers hold fits the temporaries and outputs XLA allocates beside the arguments
    found, memory = _detail(RunConfig(**MLP))
    read = found["gradients"] + found["activations"] + found["logits"]
    assert read <= found["detail"]["live_bytes"] <= (memory["temp_bytes"] + memory["output_bytes"]
                                                      - memory["alias_bytes"])
    assert found["other"] >= found["detail"]["input_bytes"] == B * W * 4
    assert {k: found[k] for k in KINDS} == kinds  # the run document's, the same program


def test_other_is_named_part_by_part_and_the_parts_sum_to_it():
    """Issue 67: other (5 to 25 % of a small run's peak) named as XLA's buffer assignment can: the
    input batch, the layer's weights the scan's backward slices out of the stack (one layer's two
    kernels and biases, float32), the values with no source by producer, what is free at the peak."""
    from remat_lab.cli.run import format_run
    from remat_lab.present.tables import other_parts_frame

    doc = run_experiment(RunConfig(**MLP, compile_only=True))
    parts, other = doc["memory"]["by_kind_other"], _kinds(doc)["other"]
    assert sum(parts.values()) == other > 0
    assert parts["input: x"] == B * W * 4
    assert parts[by_kind_buffers.LAYER_WEIGHTS] == (2 * W * W + 2 * W) * 4
    assert by_kind_buffers.GAPS in parts and all(v > 0 for v in parts.values())
    assert all(k.startswith(("input: ", "temporary: ", "temporaries under", "a layer's", "generated",
                             "not live")) for k in parts)
    frame = other_parts_frame(doc)  # the Explore page's table
    assert list(frame["part"]) == list(parts) and frame["share"].sum() == pytest.approx(1, rel=1e-12)
    assert "other holds: a layer's parameters sliced out of the scan's stack 32.5 KiB" in format_run(doc)


def test_on_an_h100_with_mixed_precision_each_kind_is_in_its_own_dtype():
    """A small llm compiled for an H100: float32 master weights, bfloat16 compute and moments. Its
    training program alone (one compile for the H100, not a run's three), read as the run document
    reads its kinds (the first test holds the two the same)."""
    cfg = RunConfig(model="llm", vocab=256, width=64, depth=2, heads=4, kv_heads=2, seq=16, batch=2,
                    policy="nothing_saveable", step="train", target="h100", dtype="bfloat16",
                    param_dtype="float32", optimizer_dtype="bfloat16")
    found, mem = _detail(cfg)
    assert found is not None  # read from the H100 program's buffers (a run's by_kind_source "buffers")
    kinds, n = {k: found[k] for k in KINDS}, model_report(abstract_problem(cfg))["parameters"]
    assert kinds["parameters"] == 4 * n and kinds["optimizer_state"] == 2 * 2 * n + 4
    assert kinds["parameters"] + kinds["optimizer_state"] + 2 * 16 * 4 == mem["argument_bytes"]  # + int32 x
    assert sum(kinds.values()) == mem["peak_bytes"]
    assert 0 < kinds["gradients"] <= 4 * n  # float32 gradients; some already consumed by the update


def test_microbatches_hold_the_accumulated_and_the_current_gradients():
    found, memory = _detail(RunConfig(**{**MLP, "batch": 16}, microbatches=2, compile_only=True))
    assert found["parameters"] == P * 4 and found["optimizer_state"] == 2 * P * 4 + 4
    assert found["gradients"] == 2 * P * 4  # the sum so far and this microbatch's, both float32
    assert sum(found[k] for k in KINDS) == memory["peak_bytes"]


def test_the_size_split_is_the_labelled_fallback():
    memory = {"peak_bytes": 1000, "temp_bytes": 600}
    model = {"parameter_bytes": 100, "optimizer_state_bytes": 200}
    assert read_kinds(None, memory) is None  # no dump: nothing read
    kinds = memory_by_kind(memory, model, train=True)
    assert source(kinds) == "size split (fallback)" and "buffers" not in kinds["method"]
    assert source(memory_by_kind(memory, model, train=True, buffers={
        "parameters": 100, "optimizer_state": 200, "gradients": 100, "activations": 50, "logits": 0,
        "other": 550})) == "buffers"


def test_a_training_advice_row_reads_its_kinds_from_the_buffers():
    from remat_lab.studies.advisor import advise

    doc = advise(RunConfig(**{**MLP, "batch": 1}), "600K", policies=["nothing_saveable"], timing=False,
                 max_batch=64)
    row = doc["rows"][0]
    assert row["max_batch"] > 0 and row["by_kind_source"] == "buffers"
    assert row["by_kind"]["parameters"] == P * 4 and row["by_kind"]["optimizer_state"] == 2 * P * 4 + 4
    assert sum(row["by_kind"].values()) == row["peak_bytes"]


MESH_SCRIPT = textwrap.dedent("""
    import json
    from remat_lab.config import RunConfig
    from remat_lab.studies.experiment import run_experiment
    cfg = RunConfig(model="mlp", width=64, batch=8, depth=2, policy="nothing_saveable", step="train",
                    mesh="fsdp=2", repeats=1, warmup=0)
    doc = json.loads(json.dumps(run_experiment(cfg, timing=False)))
    print(json.dumps({k: doc[k] for k in ("memory", "memory_gradient_step", "sharding")}))
""")


def test_on_a_mesh_per_device_memory_is_the_training_steps_as_memory():
    """Two emulated CPU devices, fsdp=2, step train: sharding.per_device is the training step's
    memory (with its kinds), not the gradient step's."""
    done = subprocess.run([sys.executable, "-c", MESH_SCRIPT], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=2"})
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    per, mem = doc["sharding"]["per_device"], doc["memory"]
    assert per == mem and per["peak_bytes"] != doc["memory_gradient_step"]["peak_bytes"]
    kinds = {k: v for k, v in per["by_kind"].items() if k != "method"}
    assert per["by_kind_source"] == "buffers" and sum(kinds.values()) == per["peak_bytes"]
    assert kinds["parameters"] == P * 4 // 2  # one device's shards
    assert kinds["optimizer_state"] == 2 * P * 4 // 2 + 4


def test_a_gradient_step_dump_is_read_too():
    """The reader knows the gradient step (no optimizer): its gradients are its outputs."""
    found, memory = _detail(RunConfig(**{**MLP, "step": "grad"}, compile_only=True))
    assert found["parameters"] == P * 4 and found["optimizer_state"] == 0
    assert 0 < found["gradients"] <= P * 4
    assert sum(found[k] for k in KINDS) == memory["peak_bytes"]


def test_tuple_elements_printed_as_operands_are_read_as_get_tuple_element():
    """XLA 0.12 prints no get-tuple-element: an operand ``%while.3#1`` is element 1 of the loop's
    tuple (``#2#0`` one level deeper); the gradient reader keys it as the buffer assignment does."""
    from remat_lab.analysis.gradient_values import Program

    program = Program(textwrap.dedent("""\
        ENTRY %main (p: f32[4]) -> f32[4] {
          %p = f32[4]{0} parameter(0)
          %while.3 = (s32[], f32[4]{0}, /*index=2*/(f32[2]{0}, u32[])) while(%p), body=%b, condition=%c
          ROOT %add.1 = f32[4]{0} add(%while.3#1, %while.3#2#0)
        }
        """))
    assert program.get("add.1").operands == ["while.3#1", "while.3#2#0"]
    assert program.get("while.3#1").shape == ("f32", (4,))
    assert program.get("while.3#2").shape is None and program.get("while.3#2#0").shape == ("f32", (2,))
    assert [program.key(o) for o in program.get("add.1").operands] == ["while.3{1}", "while.3{2,0}"]
