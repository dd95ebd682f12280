"""The differentiated step: model + policy -> a pure jittable function of (parameter leaves, x).

Following the Flax examples, the model, the loss and the step are three small separate things:
``build_model`` (models.py), ``loss_fn`` (here) and ``make_step`` (here). The module is split once
(``nnx.split``); the step takes the flat list of parameter arrays so that calling the compiled
executable costs as little as possible. The llm's loss is its next-token cross-entropy (``llm.py``),
the other models' the sum of their output. ``microbatches`` > 1 accumulates the gradient over equal
slices of the batch in a ``lax.scan`` (float32 accumulators). ``step="train"``: ``jit_program`` is
value_and_grad plus an ``optax.adamw`` update, parameters and optimizer state donated
(``program_args`` gives fresh buffers each call); ``jit_step`` stays the gradient step.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from remat_lab.config import LOCAL, RunConfig, llm_parameters, mesh_devices, mesh_slices
from remat_lab.model.attention import for_config as attention_for
from remat_lab.model.llm import chunked_next_token_loss, next_token_loss
from remat_lab.model.models import build_model
from remat_lab.model.policies import build_policy, get_policy
from remat_lab.model.stacks import Partial, run_stack
from remat_lab.program import mesh as sharding
from remat_lab.program import targets
from remat_lab.program.model_cache import (  # noqa: F401 - DTYPES and the release re-exported
    DTYPES,
    _input,
    _llm_key,
    _llm_kwargs,
    _parameters,
    _path_name,
    release_other_models,
)
from remat_lab.program.optimizer import (  # noqa: F401 - re-exported: the step's optimizer
    LEARNING_RATE,
    optimizer,
    precision,
)


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
    opt_state: object = None  # step "train": adamw's state over the leaves (abstract if they are)

    @property
    def args(self) -> tuple[list[jax.Array], jax.Array]:
        return self.leaves, self.x


def _block_fn(config: RunConfig, gather: Callable | None = None, constrain: Callable | None = None
              ) -> Callable[[nnx.Module, jax.Array], jax.Array]:
    """How one block is called: directly (no_remat) or through ``nnx.remat(policy=...)``.
    ``gather``: on a mesh with fsdp, lays the block's parameters out for use inside the remat;
    ``constrain``: the llm's activations on a mesh, batch over data x fsdp (``mesh.activations``).
    ``config.remat_layers`` below the depth: only that many blocks remat'd (``stacks.Partial``)."""
    policy = get_policy(config.policy)

    def call(block: nnx.Module, x: jax.Array) -> jax.Array:
        if constrain is not None:
            return constrain((block if gather is None else gather(block))(constrain(x)))
        return (block if gather is None else gather(block))(x)

    if not policy.remat:
        return call
    remat = nnx.remat(call, policy=build_policy(config))
    if 0 < config.remat_layers < config.depth:  # the rest of the stack saved whole
        return Partial(remat, call, config.remat_layers)
    return remat


def input_dtype(config: RunConfig):
    """The input's dtype: int32 tokens for the llm, else the compute dtype."""
    return jnp.int32 if config.model == "llm" else DTYPES[config.dtype]


@functools.lru_cache(maxsize=8)
def _abstract_parameters(model_name: str, width: int, depth: int, dtype_name: str, stack: str,
                         heads: int = 4, llm: tuple = ()):
    """Shapes and dtypes of ``_parameters``' leaves, traced with ``jax.eval_shape``: no array made."""
    found = {}

    def init():
        graphdef, state = nnx.split(build_model(model_name, width, depth, seed=0,
                                                dtype=DTYPES[dtype_name], stack=stack, heads=heads,
                                                **_llm_kwargs(llm)))
        found["graphdef"] = graphdef
        return state

    state = jax.eval_shape(init)
    flat, treedef = jax.tree_util.tree_flatten_with_path(state)
    return (found["graphdef"], treedef, tuple(leaf for _, leaf in flat),
            tuple(_path_name(p) for p, _ in flat))


def _loss_fn(config: RunConfig, graphdef, treedef, gather: Callable | None = None,
             mesh: jax.sharding.Mesh | None = None) -> Callable:
    """The loss over flat leaves; on a ``mesh`` the llm's activations and logits constrained."""
    on_mesh = mesh is not None and config.model == "llm"
    block_fn = _block_fn(config, gather, sharding.activations(config, mesh) if on_mesh else None)
    if config.model == "llm":
        logits_layout = (sharding.activations(config, mesh) if on_mesh
                         else (lambda logits: logits))
        attention = attention_for(config, mesh, sharding.input_spec(config)[0] if on_mesh else None)
        experts = sharding.expert_layout(config, mesh) if on_mesh else None

        def lm_loss(leaves: list[jax.Array], tokens: jax.Array) -> jax.Array:
            """Mean next-token cross-entropy, in float32 (``llm.next_token_loss``, or chunked)."""
            model = nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, leaves))
            if config.loss_chunks > 1:  # the logits a slice of the sequence at a time
                return chunked_next_token_loss(lambda h: logits_layout(model.head(h)), model.hidden(
                    tokens, block_fn, attention, experts), tokens, config.loss_chunks)
            return next_token_loss(logits_layout(model(tokens, block_fn, attention, experts)), tokens)

        return lm_loss

    def loss(leaves: list[jax.Array], x: jax.Array) -> jax.Array:
        """Sum of the model output, accumulated in float32."""
        model = nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, leaves))
        return jnp.sum(run_stack(model, block_fn, x), dtype=jnp.float32)

    return loss


def build_problem(config: RunConfig) -> Problem:
    """Build the model and input of ``config`` and the scalar loss over flat parameter leaves."""
    if config.compile_only:
        return abstract_problem(config)
    graphdef, treedef, leaves, paths = _parameters(config.model, config.width, config.depth,
                                                   config.seed, config.dtype, config.stack,
                                                   config.heads, _llm_key(config))
    leaves, paths = list(leaves), list(paths)
    x = _input(config.input_shape, config.seed, config.dtype,
               config.vocab if config.model == "llm" else 0)
    mesh = specs = gather = None
    if config.mesh:  # the sharded path (sharding.py): the same values, laid out on the mesh
        mesh = sharding.build_mesh(config.mesh)
        specs = tuple(sharding.param_specs(jax.tree_util.tree_unflatten(treedef, leaves), config))
        leaves = sharding.place(leaves, list(specs), mesh)
        x = sharding.place([x], [sharding.input_spec(config)], mesh)[0]
        gather = sharding.gathered(config, mesh) if "fsdp" in config.mesh else None
    loss = _loss_fn(config, graphdef, treedef, gather, mesh)
    opt_state = None
    if config.step == "train":
        init, out = optimizer(config).init, {}
        if mesh is not None:  # the moments laid out like their parameters (sharding.state_specs)
            out["out_shardings"] = jax.tree_util.tree_map(
                lambda s: jax.sharding.NamedSharding(mesh, s),
                sharding.state_specs(jax.eval_shape(init, leaves), leaves, specs),
                is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))
        opt_state = jax.jit(init, **out)(leaves)
    return Problem(config, graphdef, treedef, leaves, paths, x, loss, mesh, specs, opt_state)


def abstract_problem(config: RunConfig, config_file: str | None = None) -> Problem:
    """``build_problem`` with ``jax.ShapeDtypeStruct`` leaves, optimizer state and input: for
    compile-only programs (lower and compile, never run), so nothing of the configuration's size is
    allocated. Locally on one device, or over the mesh of local devices; on a named target placed
    on its compile-only devices, over the mesh when there is one (``config_file``: the user's own
    GPU target description). On a mesh everything carries its ``NamedSharding`` (the rules of
    ``mesh.py``; the optimizer state like its parameters)."""
    graphdef, treedef, leaves, paths = _abstract_parameters(config.model, config.width, config.depth,
                                                            config.dtype, config.stack, config.heads,
                                                            _llm_key(config))
    leaves, paths = list(leaves), list(paths)
    x = jax.ShapeDtypeStruct(config.input_shape, input_dtype(config))
    state = jax.eval_shape(optimizer(config).init, leaves) if config.step == "train" else None
    if not config.mesh:
        if config.target != LOCAL:
            one = jax.sharding.SingleDeviceSharding(
                targets.target_devices(config.target, config.target_devices, config_file)[0])
            place = lambda a, s=one: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
            leaves, x = jax.tree_util.tree_map(place, (leaves, x))
            state = jax.tree_util.tree_map(lambda a: place(a, _state_memory(config, one)), state)
        return Problem(config, graphdef, treedef, leaves, paths, x,
                       _loss_fn(config, graphdef, treedef), opt_state=state)
    devices = (None if config.target == LOCAL else
               targets.target_devices(config.target, config.target_devices, config_file,
                                      mesh_slices(config.mesh)))
    mesh = sharding.build_mesh(config.mesh, devices)
    specs = tuple(sharding.param_specs(jax.tree_util.tree_unflatten(treedef, leaves), config))
    put = lambda a, spec: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                               sharding=jax.sharding.NamedSharding(mesh, spec))
    if state is not None:
        state = jax.tree_util.tree_map(
            lambda a, spec: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=_state_memory(
                config, jax.sharding.NamedSharding(mesh, spec))),
            state, sharding.state_specs(state, leaves, specs))
    leaves = [put(a, spec) for a, spec in zip(leaves, specs)]
    gather = sharding.gathered(config, mesh) if "fsdp" in config.mesh else None
    return Problem(config, graphdef, treedef, leaves, paths, put(x, sharding.input_spec(config)),
                   _loss_fn(config, graphdef, treedef, gather, mesh), mesh, specs, state)


def _state_memory(config: RunConfig, s):
    """The optimizer state's sharding ``s``, in pinned host memory with ``optimizer_offload``."""
    return s.with_memory_kind("pinned_host") if config.optimizer_offload else s


def problem_for(config: RunConfig) -> Problem:
    """The problem a configuration compiles: real arrays locally, abstract ones on a named target
    or when ``compile_only``."""
    local = config.target == LOCAL and not config.compile_only
    return build_problem(config) if local else abstract_problem(config)


def _value_and_grad(problem: Problem) -> Callable:
    """(leaves, x) -> (loss, grads), over ``microbatches`` slices of the batch when more than one:
    a ``lax.scan`` adding each slice's loss and gradients in float32 (the llm's mean loss and its
    gradients are then divided by the count, the summed losses' are not)."""
    vg = jax.value_and_grad(problem.loss)
    k = problem.config.microbatches
    if k == 1:
        return vg
    mean = problem.config.model == "llm"

    def accumulated(leaves: list[jax.Array], x: jax.Array):
        # Microbatch j takes examples j, j + k, ...: on a mesh each device's share of the batch
        # stays on it (a contiguous split would put whole microbatches on some devices).
        xs = jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)

        def body(carry, xb):
            total, acc = carry
            loss, grads = vg(leaves, xb)
            return (total + loss, [a + g.astype(jnp.float32) for a, g in zip(acc, grads)]), None

        init = (jnp.zeros((), jnp.float32), [jnp.zeros(leaf.shape, jnp.float32) for leaf in leaves])
        with jax.named_scope("microbatches"):
            (total, acc), _ = jax.lax.scan(body, init, xs)
        scale = 1.0 / k if mean else 1.0
        return total * scale, [(a * scale).astype(leaf.dtype) for a, leaf in zip(acc, leaves)]

    return accumulated


def make_step(problem: Problem) -> Callable:
    """The un-jitted gradient step: (leaves, x) -> (loss, grads) or grads, per the objective."""
    if problem.config.objective == "grad":
        if problem.config.microbatches == 1:
            return jax.grad(problem.loss)
        vg = _value_and_grad(problem)
        return lambda leaves, x: vg(leaves, x)[1]
    return _value_and_grad(problem)


def make_train_step(problem: Problem) -> Callable:
    """The un-jitted training step: (leaves, opt_state, x) -> (loss, new leaves, new opt_state)."""
    vg, tx = _value_and_grad(problem), optimizer(problem.config)

    def train(leaves: list[jax.Array], opt_state, x: jax.Array):
        loss, grads = vg(leaves, x)
        with jax.named_scope("optimizer"):
            updates, opt_state = tx.update(grads, opt_state, leaves)
            return loss, optax.apply_updates(leaves, updates), opt_state

    return train


def jit_program(problem: Problem) -> Callable:
    """The jitted program ``config.step`` asks for: the gradient step (``jit_step``), or the
    training step with the parameters and optimizer state donated (arguments 0 and 1)."""
    if problem.config.step != "train":
        return jit_step(problem)
    if problem.mesh is not None:
        return sharding.jit_train(problem, make_train_step(problem))
    step = make_train_step(problem)
    if problem.config.optimizer_offload:  # one device: the state's own sharding, on the device
        device = jax.tree.map(lambda a: a.sharding.with_memory_kind("device"), problem.opt_state)
        step = sharding.offloaded_state(step, device)
    return jax.jit(step, donate_argnums=(0, 1))


def program_args(problem: Problem) -> tuple:
    """``jit_program``'s arguments: ``problem.args``, or for step train ``(leaves, opt_state, x)``
    as fresh buffers (copies: donation consumes them, the cached parameters stay)."""
    if problem.config.step != "train":
        return problem.args
    leaves, state = problem.leaves, problem.opt_state
    if not isinstance(problem.x, jax.ShapeDtypeStruct):
        leaves, state = jax.tree_util.tree_map(jnp.copy, (leaves, state))
    return leaves, state, problem.x


def jit_step(problem: Problem) -> Callable:
    """The jitted step: plain ``jax.jit`` on one device, explicit shardings on a mesh."""
    if problem.mesh is None:
        return jax.jit(make_step(problem))
    return sharding.jit_step(problem, make_step(problem))


def _nbytes(tree, per_device: bool = False) -> int:
    """Bytes of ``tree``'s arrays (real or abstract); ``per_device``: of one device's shard."""
    def shape(a) -> tuple:
        where = getattr(a, "sharding", None) if per_device else None
        return tuple(where.shard_shape(a.shape)) if where is not None else tuple(a.shape)

    return sum(math.prod(shape(a)) * jnp.dtype(a.dtype).itemsize
               for a in jax.tree_util.tree_leaves(tree))


def model_report(problem: Problem, per_device: bool = False) -> dict:
    """The run document's ``model``: the parameter count of the built model (its leaves: real or
    abstract), their bytes, their gradients' (one per parameter, in its dtype), the optimizer
    state's (0 for the gradient step), each at its own dtype (``precision``); the llm's
    ``attention_used`` (``attention.Attention.describe``); a mixture of experts' ``active_parameters``."""
    state, params = problem.opt_state, _nbytes(problem.leaves, per_device)
    report = {"parameters": sum(math.prod(a.shape) for a in problem.leaves),
              "parameter_bytes": params, "gradient_bytes": params,
              "optimizer_state_bytes": _nbytes(state, per_device) if state is not None else 0,
              "precision": precision(problem.config)}
    if problem.config.model == "llm":  # the kernel that ran, and why flash fell back
        report["attention_used"] = attention_for(problem.config).describe()
    if problem.config.experts:  # a mixture of experts: the parameters one token uses, from its shape
        report["active_parameters"] = llm_parameters(problem.config, active=True)
    return report


def device_model_report(problem: Problem) -> dict:
    """``model_report``'s bytes for one device: each leaf's shard (the whole leaf off a mesh)."""
    return model_report(problem, per_device=True)


def logits_bytes(config: RunConfig, *, per_device: bool = False) -> int:
    """The llm's logits of one microbatch, ``batch x seq x vocab`` in the compute dtype (0 for the
    other models), with ``loss_chunks`` > 1 one chunk's (``ceil(seq / loss_chunks)`` tokens);
    ``per_device``: one device's share (batch over data x fsdp, vocab over tensor)."""
    if config.model != "llm":
        return 0
    split = mesh_devices(config.mesh) if per_device else 1
    tokens = -(-config.seq // config.loss_chunks)
    return (config.batch // config.microbatches * tokens * config.vocab
            * jnp.dtype(DTYPES[config.dtype]).itemsize // split)
