"""Readers of compiled HLO text: product count and sizes, host memory, bf16 upcasts, fingerprints."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from remat_lab.analysis import hlo


def _compiled(fn, *args) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


def test_products_are_counted_without_metadata():
    text = "\n".join([
        "%fused (param_0.1: f32[8,64], param_1.2: f32[64,32]) -> f32[8,32] {",
        "  %param_0.1 = f32[8,64]{1,0} parameter(0)",
        "  %param_1.2 = f32[64,32]{1,0} parameter(1)",
        "  ROOT %d = f32[8,32]{1,0} dot(%param_0.1, %param_1.2), lhs_contracting_dims={1}, "
        "rhs_contracting_dims={0}",
        "}",
    ])
    (row,) = hlo.matmuls(text)
    assert (row["shape"], row["contracted"], row["batch"], row["op_name"]) == ([8, 32], 64, 1, "")
    assert row["flops"] == 2 * 8 * 32 * 64
    assert hlo.product_keys(text) == [hlo.product_key(8 * 32, 64, 1)]


def test_products_match_a_real_compile_and_its_flop_count():
    a, b = jnp.ones((4, 8, 16)), jnp.ones((4, 16, 32))
    text = _compiled(lambda a, b: jnp.einsum("bnd,bdf->bnf", a, b), a, b)
    (row,) = hlo.matmuls(text)
    assert (row["contracted"], row["batch"]) == (16, 4)
    assert row["flops"] == 2 * 4 * 8 * 32 * 16


def test_gpu_library_calls_are_products():
    """On GPU, XLA hands products to cuBLAS as custom-calls with a tuple result."""
    text = "\n".join([
        '%cc = (f32[64,256]{1,0}, s8[4194304]{0}) custom-call(f32[64,256]{1,0} %a, f32[256,256]{1,0} %b),'
        ' custom_call_target="__cublas$gemm", metadata={op_name="jit(loss)/jvp(block0)/l2/dot_general"}',
        '%r = (f32[64,256]{1,0}, u8[0]{0}) custom-call(%p), custom_call_target="__cudnn$conv"',
        '%s = f32[64,256]{1,0} add(%x, %y)',
    ])
    (row,) = hlo.matmuls(text)
    assert (row["dtype"], row["shape"], row["opcode"]) == ("f32", [64, 256], "custom-call")


def test_host_memory_is_seen_only_when_the_program_has_it():
    assert hlo.uses_host_memory("%p = f32[8,64]{1,0:S(5)} parameter(0)")
    assert hlo.uses_host_memory('%c = f32[8] custom-call(%x), custom_call_target="MoveToHost"')
    assert not hlo.uses_host_memory(_compiled(lambda x: x @ x, jnp.ones((8, 8))))


def test_bf16_upcast_is_detected_on_cpu():
    x = jnp.ones((8, 8), jnp.bfloat16)
    text = _compiled(lambda x: x @ x, x)
    rows = hlo.matmuls(text)
    if jax.default_backend() == "cpu":
        assert hlo.upcasts_bf16_matmuls(text) == all(r["dtype"] == "f32" for r in rows)
    assert not hlo.upcasts_bf16_matmuls(_compiled(lambda x: x @ x, jnp.ones((8, 8))))


def test_fingerprint_ignores_names_and_metadata_but_not_the_program():
    x = jnp.ones((8, 8))

    def f(x):
        return jnp.tanh(x @ x).sum()

    def g(y):  # the same program under other names, from another source line
        with jax.named_scope("elsewhere"):
            return jnp.tanh(y @ y).sum()

    a, b = _compiled(f, x), _compiled(g, x)
    assert a != b
    assert hlo.fingerprint(a) == hlo.fingerprint(b)
    assert hlo.fingerprint(_compiled(lambda x: jnp.sin(x @ x).sum(), x)) != hlo.fingerprint(a)
    assert hlo.fingerprint(_compiled(lambda x: jnp.tanh(x @ x @ x).sum(), x)) != hlo.fingerprint(a)


def test_the_bf16_upcast_note_is_xla_cpus_alone():
    """A TPU runs float32 products as they are: the app's "bf16 products run in float32 on CPU"
    read on a v5e (2026-12-08) was the CPU's note on another backend."""
    from remat_lab.analysis.dissect import dissect
    from remat_lab.config import RunConfig
    from remat_lab.program.step import build_problem

    problem = build_problem(RunConfig(model="mlp", width=16, batch=2, dtype="bfloat16"))
    text = ("HloModule m\n%p = bf16[2,16] parameter(0)\n%d = f32[2,16]{1,0} dot(f32[2,16] %a, "
            "f32[16,16] %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}")
    assert hlo.upcasts_bf16_matmuls(text)  # a bf16 program whose products are all float32
    assert dissect(problem, text, backend="cpu").compiled["bf16_upcast"]
    assert not dissect(problem, text, backend="tpu").compiled["bf16_upcast"]
