import jax.numpy as jnp
import numpy as np
from flax import nnx

from remat_lab.model.models import MLP, SeqMixer, build_model
from remat_lab.model.stacks import LoopStack, ScanStack, blocks_of


def test_mlp_layers_come_from_one_rngs_stream_in_order():
    model = MLP(16, rngs=nnx.Rngs(7))
    rngs = nnx.Rngs(7)
    first = nnx.Linear(16, 16, rngs=rngs)
    second = nnx.Linear(16, 16, rngs=rngs)
    np.testing.assert_array_equal(model.l1.kernel[...], first.kernel[...])
    np.testing.assert_array_equal(model.l2.kernel[...], second.kernel[...])


def test_mlp_has_separate_parameters_and_zero_biases():
    model = MLP(16, rngs=nnx.Rngs(0))
    assert model.l1.kernel[...].shape == (16, 16) == model.l2.kernel[...].shape
    assert not np.allclose(model.l1.kernel[...], model.l2.kernel[...])
    np.testing.assert_array_equal(model.l1.bias[...], np.zeros(16))
    np.testing.assert_array_equal(model.l2.bias[...], np.zeros(16))
    assert model.l1.kernel is not model.l2.kernel


def test_mlp_matches_the_seed_formula():
    model = MLP(8, rngs=nnx.Rngs(1))
    x = jnp.linspace(-1, 1, 3 * 8).reshape(3, 8)
    h = np.maximum(x @ model.l1.kernel[...] + model.l1.bias[...], 0)
    want = np.maximum(h @ model.l2.kernel[...] + model.l2.bias[...], 0)
    np.testing.assert_allclose(model(x), want, rtol=1e-5, atol=1e-6)
    assert model(x[0]).shape == (8,)  # the seed's single vector


def test_seq_mixer_shapes_and_mixing():
    model = SeqMixer(8, rngs=nnx.Rngs(0))
    x = jnp.ones((2, 5, 8)).at[:, 0].set(3.0)
    y = model(x)
    assert y.shape == (2, 5, 8)
    assert bool(jnp.all(y >= 0))


def test_depth_stack_has_distinct_blocks():
    model = build_model("mlp", 8, 3, seed=0, dtype=jnp.float32, stack="loop")
    assert isinstance(model, LoopStack)
    blocks = blocks_of(model)
    assert len(blocks) == 3
    assert not np.allclose(blocks[0].l1.kernel[...], blocks[1].l1.kernel[...])
    assert blocks_of(build_model("mlp", 8, 1, seed=0, dtype=jnp.float32))[0].__class__ is MLP


def test_bfloat16_params():
    model = build_model("mlp", 8, 1, seed=0, dtype=jnp.bfloat16)
    assert model.l1.kernel[...].dtype == jnp.bfloat16


def test_scan_stack_has_distinct_stacked_layers():
    model = build_model("mlp", 8, 3, seed=0, dtype=jnp.float32, stack="scan")
    assert isinstance(model, ScanStack)
    (stacked,) = blocks_of(model)
    kernel = stacked.l1.kernel[...]
    assert kernel.shape == (3, 8, 8)
    assert not np.allclose(kernel[0], kernel[1])
