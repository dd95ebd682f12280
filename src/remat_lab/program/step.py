"""The differentiated step: model + policy -> a pure jittable function of (parameter leaves, x).

Following the Flax examples, the model, the loss and the step are three small separate things:
``build_model`` (models.py), ``loss_fn`` (here) and ``make_step`` (here). The module is split once
(``nnx.split``); the step takes the flat list of parameter arrays so that calling the compiled
executable costs as little as possible.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from remat_lab.config import LOCAL, ConfigError, RunConfig
from remat_lab.model.models import build_model
from remat_lab.model.policies import build_policy, get_policy
from remat_lab.model.stacks import run_stack
from remat_lab.program import mesh as sharding
from remat_lab.program import targets

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclass(frozen=True)
class Problem:
    """A built model, split into a graph definition and flat parameter leaves, and its input."""

    config: RunConfig
    graphdef: nnx.GraphDef
    treedef: jax.tree_util.PyTreeDef
    leaves: list[jax.Array]
    paths: list[str]
    x: jax.Array
    loss: Callable[[list[jax.Array], jax.Array], jax.Array]
    mesh: jax.sharding.Mesh | None = None  # config.mesh built (sharding.py); None on one device
    specs: tuple | None = None  # each leaf's PartitionSpec on the mesh

    @property
    def args(self) -> tuple[list[jax.Array], jax.Array]:
        return self.leaves, self.x


def _block_fn(config: RunConfig, gather: Callable | None = None
              ) -> Callable[[nnx.Module, jax.Array], jax.Array]:
    """How one block is called: directly (no_remat) or through ``nnx.remat(policy=...)``.
    ``gather``: on a mesh with fsdp, lays the block's parameters out for use inside the remat."""
    policy = get_policy(config.policy)

    def call(block: nnx.Module, x: jax.Array) -> jax.Array:
        return (block if gather is None else gather(block))(x)

    if not policy.remat:
        return call
    return nnx.remat(call, policy=build_policy(config))


def _path_name(path) -> str:
    """``(DictKey('l1'), DictKey('kernel'), GetAttrKey('value'))`` -> ``'l1.kernel'``."""
    parts = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
    return ".".join(p for p in parts if p not in ("value", ""))


# Parameters and inputs depend on neither the policy nor the objective: a sweep over policies
# (or the app re-running a configuration) reuses them. They are initialised by one jitted program
# (bitwise the same values as eager initialisation) rather than op by op: eagerly, every op at a
# new shape is a separate compile (or persistent-cache lookup), which cost more than compiling the
# step itself. Arrays are immutable, so sharing them is safe.
@functools.lru_cache(maxsize=4)
def _parameters(model_name: str, width: int, depth: int, seed: int, dtype_name: str, stack: str,
                heads: int = 4):
    found = {}

    def init():
        graphdef, state = nnx.split(build_model(model_name, width, depth, seed=seed,
                                                dtype=DTYPES[dtype_name], stack=stack,
                                                heads=heads))
        found["graphdef"] = graphdef  # static structure, no arrays
        return state

    state = jax.jit(init)()
    flat, treedef = jax.tree_util.tree_flatten_with_path(state)
    return (found["graphdef"], treedef, tuple(leaf for _, leaf in flat),
            tuple(_path_name(p) for p, _ in flat))


@functools.lru_cache(maxsize=4)
def _input(shape: tuple[int, ...], seed: int, dtype_name: str) -> jax.Array:
    dtype = DTYPES[dtype_name]
    return jax.jit(lambda: jax.random.normal(jax.random.key(seed + 1), shape, dtype=dtype))()


@functools.lru_cache(maxsize=8)
def _abstract_parameters(model_name: str, width: int, depth: int, dtype_name: str, stack: str,
                         heads: int = 4):
    """Shapes and dtypes of ``_parameters``' leaves, traced with ``jax.eval_shape``: no array made."""
    found = {}

    def init():
        graphdef, state = nnx.split(build_model(model_name, width, depth, seed=0,
                                                dtype=DTYPES[dtype_name], stack=stack, heads=heads))
        found["graphdef"] = graphdef
        return state

    state = jax.eval_shape(init)
    flat, treedef = jax.tree_util.tree_flatten_with_path(state)
    return (found["graphdef"], treedef, tuple(leaf for _, leaf in flat),
            tuple(_path_name(p) for p, _ in flat))


def _loss_fn(config: RunConfig, graphdef, treedef, gather: Callable | None = None) -> Callable:
    block_fn = _block_fn(config, gather)

    def loss(leaves: list[jax.Array], x: jax.Array) -> jax.Array:
        """Sum of the model output, accumulated in float32."""
        model = nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, leaves))
        return jnp.sum(run_stack(model, block_fn, x), dtype=jnp.float32)

    return loss


def build_problem(config: RunConfig) -> Problem:
    """Build the model and input of ``config`` and the scalar loss over flat parameter leaves."""
    graphdef, treedef, leaves, paths = _parameters(config.model, config.width, config.depth,
                                                   config.seed, config.dtype, config.stack,
                                                   config.heads)
    leaves, paths = list(leaves), list(paths)
    x = _input(config.input_shape, config.seed, config.dtype)
    mesh = specs = gather = None
    if config.mesh:  # the sharded path (sharding.py): the same values, laid out on the mesh
        mesh = sharding.build_mesh(config.mesh)
        specs = tuple(sharding.param_specs(jax.tree_util.tree_unflatten(treedef, leaves), config))
        leaves = sharding.place(leaves, list(specs), mesh)
        x = sharding.place([x], [sharding.input_spec(config)], mesh)[0]
        gather = sharding.gathered(config, mesh) if "fsdp" in config.mesh else None
    loss = _loss_fn(config, graphdef, treedef, gather)
    return Problem(config, graphdef, treedef, leaves, paths, x, loss, mesh, specs)


def abstract_problem(config: RunConfig, config_file: str | None = None) -> Problem:
    """``build_problem`` with ``jax.ShapeDtypeStruct`` leaves and input: for compile-only programs
    (lower and compile, never run), so nothing of the configuration's size is allocated. Locally on
    one device (the advisor's probes); on a named target placed on its compile-only devices, over
    the mesh when there is one (``config_file``: the user's own GPU target description)."""
    graphdef, treedef, leaves, paths = _abstract_parameters(config.model, config.width, config.depth,
                                                            config.dtype, config.stack, config.heads)
    x = jax.ShapeDtypeStruct(config.input_shape, DTYPES[config.dtype])
    if config.target == LOCAL:
        if config.mesh:
            raise ConfigError("compile-only probes run on one device; leave the mesh out (mesh "
                              f"{config.mesh!r} given).")
        return Problem(config, graphdef, treedef, list(leaves), list(paths), x,
                       _loss_fn(config, graphdef, treedef))
    devices = targets.target_devices(config.target, config.target_devices, config_file)
    if not config.mesh:
        one = jax.sharding.SingleDeviceSharding(devices[0])
        place = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one)
        return Problem(config, graphdef, treedef, [place(a) for a in leaves], list(paths), place(x),
                       _loss_fn(config, graphdef, treedef))
    mesh = sharding.build_mesh(config.mesh, devices)
    specs = tuple(sharding.param_specs(jax.tree_util.tree_unflatten(treedef, list(leaves)), config))
    put = lambda a, spec: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                               sharding=jax.sharding.NamedSharding(mesh, spec))
    leaves = [put(a, spec) for a, spec in zip(leaves, specs)]
    gather = sharding.gathered(config, mesh) if "fsdp" in config.mesh else None
    return Problem(config, graphdef, treedef, leaves, list(paths), put(x, sharding.input_spec(config)),
                   _loss_fn(config, graphdef, treedef, gather), mesh, specs)


def problem_for(config: RunConfig) -> Problem:
    """The problem a configuration compiles: real arrays locally, abstract ones on a named target."""
    return build_problem(config) if config.target == LOCAL else abstract_problem(config)


def make_step(problem: Problem) -> Callable:
    """The un-jitted step: (leaves, x) -> (loss, grads) or grads, per the objective."""
    if problem.config.objective == "grad":
        return jax.grad(problem.loss)
    return jax.value_and_grad(problem.loss)


def jit_step(problem: Problem) -> Callable:
    """The jitted step: plain ``jax.jit`` on one device, explicit shardings on a mesh."""
    if problem.mesh is None:
        return jax.jit(make_step(problem))
    return sharding.jit_step(problem, make_step(problem))
