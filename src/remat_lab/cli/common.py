"""What every subcommand shares: the parser, the flags and their types, device setup and error exits.

Errors end a subcommand in one place: ``reported`` (and ``engine_errors``) turns the errors it names
into a ``Failure``, and ``main`` prints ``remat_lab: error: <message>`` on stderr and exits with its
status (``STATUS``): 2 for bad input, 3 the device out of memory, 4 this machine out of memory, 5 an
XLA (or libtpu) error other than memory, 70 a bug in the lab, 1 any other failure while running
(the history file, a worker lost).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from remat_lab.cli.moe_args import add_moe_args
from remat_lab.config import (
    CHOICES,
    DTYPES,
    LIMITS,
    OBJECTIVES,
    PRESET_FIELDS,
    PRESETS,
    STEPS,
    TARGET_NAMES,
    ConfigError,
    RunConfig,
)
from remat_lab.config.catalog import RECIPE
from remat_lab.config.targets import COLLECTIVE_OVERLAPS, MAX_TARGET_DEVICES
from remat_lab.model.models import MODELS
from remat_lab.model.policies import DEFAULT_POLICY, POLICIES
from remat_lab.model.stacks import STACKS

BAD_INPUT = 2  # exit status: the user's input (flags, sizes, files) cannot be used
FAILED = 1  # exit status: a valid request failed while running (the history file, a lost worker)
# The exit status of each kind of failure (``program.failures``), by its class's name.
STATUS = {"DeviceOutOfMemory": 3, "HostOutOfMemory": 4, "CompilerError": 5, "LabBug": 70}

Errors = type[BaseException] | tuple[type[BaseException], ...]


class Failure(Exception):
    """A subcommand's end: ``main`` prints ``remat_lab: error: <message>`` and exits with ``status``."""

    def __init__(self, message: str, status: int = BAD_INPUT):
        super().__init__(message)
        self.status = status


@contextmanager
def reported(bad_input: Errors = (), failed: Errors = (),
             say: Callable[[BaseException], str] = str) -> Iterator[None]:
    """Turn ``bad_input`` errors into a ``Failure`` exiting 2 and ``failed`` ones into one exiting 1.

    ``say`` words the message (default: the error's own text).
    """
    try:
        yield
    except bad_input as err:
        raise Failure(say(err), BAD_INPUT) from None
    except failed as err:
        raise Failure(say(err), status_of(err)) from None


def status_of(err: BaseException) -> int:
    """The exit status of a failure while running: its kind's (``STATUS``), else 1."""
    return next((STATUS[t.__name__] for t in type(err).__mro__ if t.__name__ in STATUS), FAILED)


def engine_errors():
    """The engine's errors: ``ConfigError`` (bad input) exits 2, an ``ExecutionError`` its kind's
    status (``STATUS``)."""
    from remat_lab.program.backend import ExecutionError  # lazy: it loads JAX

    return reported(ConfigError, ExecutionError)


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one clear line and exit status 2, with no usage dump."""

    def error(self, message: str):
        # argparse quotes some user text verbatim ("unrecognized arguments: ..."): escape line
        # breaks and other control characters so the message stays one line.
        message = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in message)
        message = " ".join(w if len(w) <= 80 else w[:77] + "..." for w in message.split(" "))
        self.exit(BAD_INPUT, f"remat_lab: error: {message}\n")


# ---------------------------------------------------------------- flag types


def int_arg(name: str):
    lo, hi = LIMITS[name]

    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be a whole number from {lo} to {hi}, not {text[:40]!r}") from None
    return parse


def policies_arg(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in POLICIES]
    if bad or not names:
        what = f"unknown policy {bad[0][:40]!r}" if bad else "no policy given"
        raise argparse.ArgumentTypeError(f"{what}; choose from: {', '.join(POLICIES)}")
    return list(dict.fromkeys(names))


def names_arg(text: str) -> tuple[str, ...]:
    """Comma-separated checkpoint names; checked against the model by ``RunConfig``."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


def rounds_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"rounds must be a whole number from 1 to 1000, not {text[:40]!r}")
    return value


def count_arg(name: str, hi: int, lo: int = 1):
    def parse(text: str) -> int:
        value = int(text) if text.isascii() and text.isdigit() and len(text) < 7 else -1
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number from {lo} to {hi}, "
                                             f"not {text[:40]!r}")
        return value
    return parse


def list_arg(kind):
    """Comma-separated values, each parsed by ``kind``."""
    def parse(text: str) -> list:
        values = [kind(v.strip()) for v in text.split(",") if v.strip()]
        if not values:
            raise argparse.ArgumentTypeError("give at least one value")
        return list(dict.fromkeys(values))
    return parse


# ---------------------------------------------------------------- flag groups


class Given(argparse.Action):
    """Store the value and remember that the flag was given (``given``): a ``--preset`` fills only
    the fields no flag set."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        given(namespace).add(self.dest)


class GivenBool(argparse.BooleanOptionalAction):
    """``--x`` / ``--no-x``, remembered as given like ``Given``."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        given(namespace).add(self.dest)


def given(namespace: argparse.Namespace) -> set:
    """The destinations of the flags given on the command line (those stored by ``Given``)."""
    if not hasattr(namespace, "given_flags"):
        namespace.given_flags = set()
    return namespace.given_flags


def add_shape_args(p: argparse.ArgumentParser, batch: bool = True) -> None:
    """The model and its sizes (``batch``: with ``--batch``; the advisor searches the batch)."""
    d = RunConfig()
    p.add_argument("--model", choices=MODELS, default=d.model, action=Given)
    p.add_argument("--width", type=int_arg("width"), default=d.width, action=Given,
                   help="features D (1..16384)")
    if batch:
        p.add_argument("--batch", type=int_arg("batch"), default=d.batch, action=Given,
                       help="examples B; 0 = the seed's single vector x: (width,) (mlp only)")
    p.add_argument("--seq", type=int_arg("seq"), default=d.seq, action=Given,
                   help="sequence length N (seq_mixer, transformer: 1..4096; llm 2..32768)")
    p.add_argument("--heads", type=int_arg("heads"), default=d.heads, action=Given,
                   help="attention heads (transformer, llm; must divide width unless --head-dim)")
    p.add_argument("--depth", type=int_arg("depth"), default=d.depth, action=Given,
                   help="remat'd blocks (1..16; llm 1..128)")
    p.add_argument("--stack", choices=STACKS, default=d.stack, action=Given,
                   help="depth > 1: scan over stacked layers (default) or an unrolled Python loop")
    p.add_argument("--dtype", choices=DTYPES, default=d.dtype, action=Given,
                   help="the compute dtype (an llm preset or llm --step train: bfloat16, with float32 "
                        "weights and moments; each dtype flag replaces its own field only)")
    add_user_block_args(p)


def add_user_block_args(p: argparse.ArgumentParser, instead: str = "--model", batch: str = "") -> None:
    """``--model-module`` and ``--input-shape`` (read by ``user_block_fields``); ``instead`` names the
    flag the block replaces, ``batch`` says more of the input's first axis."""
    p.add_argument("--model-module", default="", metavar="MODULE:FACTORY",
                   help=f"your own NNX block instead of {instead} (local only): mypkg.blocks:make_block "
                        "or path/to/file.py:make_block, a factory make_block(rngs) -> nnx.Module")
    p.add_argument("--input-shape", dest="user_input_shape", default="", metavar="B,N,D",
                   help="--model-module: the block's input, the first axis the batch (default: the "
                        f"module's example_input_shape){batch}")


def add_config_args(p: argparse.ArgumentParser) -> None:
    """Every field of one configuration, and the flags of a run (run, explain, compare)."""
    d = RunConfig()
    add_shape_args(p)
    p.add_argument("--policy", choices=list(POLICIES), default=DEFAULT_POLICY, metavar="POLICY",
                   help=f"one of: {', '.join(POLICIES)}")
    p.add_argument("--save-names", type=names_arg, default=(), metavar="A,B",
                   help="policy custom: checkpoint names saved on the device (see `policies --model`)")
    p.add_argument("--offload-names", type=names_arg, default=(), metavar="A,B",
                   help="policy custom: checkpoint names offloaded to pinned host memory")
    p.add_argument("--remat-layers", type=int_arg("remat_layers"), default=d.remat_layers, metavar="N",
                   help="remat only the first N of the depth blocks, the rest saved whole (default 0: all)")
    p.add_argument("--objective", choices=OBJECTIVES, default=d.objective)
    add_llm_args(p)
    add_mesh_args(p)
    p.add_argument("--repeats", type=int_arg("repeats"), default=d.repeats)
    p.add_argument("--warmup", type=int_arg("warmup"), default=d.warmup)
    p.add_argument("--seed", type=int_arg("seed"), default=d.seed)
    p.add_argument("--memory-budget", default=None,
                   help="refuse configurations estimated above this (e.g. 2G); "
                        "default: half the backend's memory, or $REMAT_LAB_MEMORY_BUDGET")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--code", action="store_true",
                   help="print self-contained Flax code for this configuration and exit")
    p.add_argument("--no-cache", action="store_true", help="disable the persistent compile cache")


def add_llm_args(p: argparse.ArgumentParser) -> None:
    """The decoder LM's settings, the training step, microbatches, presets and compile-only."""
    d = RunConfig()
    p.add_argument("--vocab", type=int_arg("vocab"), default=d.vocab, action=Given,
                   help="llm: vocabulary size")
    p.add_argument("--kv-heads", type=int_arg("kv_heads"), default=d.kv_heads, action=Given,
                   help="llm: key/value heads (grouped-query attention; 0 = heads)")
    p.add_argument("--head-dim", type=int_arg("head_dim"), default=d.head_dim, action=Given,
                   help="llm: attention head size (0 = width / heads)")
    p.add_argument("--mlp-dim", type=int_arg("mlp_dim"), default=d.mlp_dim, action=Given,
                   help="llm: the gated MLP's hidden size (0 = 4 x width)")
    add_moe_args(p, d, int_arg, Given)
    p.add_argument("--tie-embeddings", action=GivenBool, default=d.tie_embeddings,
                   help="llm: the vocabulary projection is the embedding's transpose")
    p.add_argument("--param-dtype", choices=DTYPES, default=d.param_dtype or None, action=Given,
                   help="llm: the master weights and their gradients (default: --dtype; a preset's: float32)")
    p.add_argument("--optimizer-dtype", choices=DTYPES, default=d.optimizer_dtype or None,
                   action=Given, help="step train: AdamW's two moments (default: --param-dtype)")
    p.add_argument("--step", choices=STEPS, default=d.step,
                   help="grad: the objective's gradients; train: value_and_grad + adamw update, "
                        "parameters and optimizer state donated")
    p.add_argument("--microbatches", type=int_arg("microbatches"), default=d.microbatches,
                   help="accumulate the gradient over this many slices of the batch (must divide it)")
    p.add_argument("--attention", choices=CHOICES["attention"], default=d.attention,
                   help="llm: full (seq x seq scores), chunked (blockwise online softmax, plain JAX) "
                        "or flash (the target's fused kernel: cuDNN, Pallas; else chunked, said so)")
    p.add_argument("--attention-block", type=int_arg("attention_block"), default=d.attention_block,
                   metavar="N", help="llm: chunked attention's query and key block, tokens")
    p.add_argument("--loss-chunks", type=int_arg("loss_chunks"), default=d.loss_chunks, action=Given,
                   metavar="N", help="llm: the vocabulary loss over N slices of the sequence, one "
                                     "slice's logits live at a time (presets: 8, gpt2-small 1)")
    p.add_argument("--preset", choices=list(PRESETS), default=None, metavar="NAME",
                   help=f"a published llm shape ({', '.join(PRESETS)}); other flags override it")
    p.add_argument("--model-config", default=None, metavar="FILE",
                   help="an llm's shape from its published config: a Hugging Face config.json or a "
                        "MaxText model YAML; other flags override it (not with --preset)")
    p.add_argument("--compile-only", action="store_true",
                   help="compile with abstract parameters and inputs: nothing allocated, nothing run")
    p.add_argument("--optimizer-offload", action="store_true",
                   help="step train on a --target: AdamW's state in pinned host memory, brought to "
                        "the device for the update (MaxText's optimizer_memory_host_offload)")


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The model's settings without batch and policy (the advisor searches those)."""
    d = RunConfig()
    add_shape_args(p, batch=False)
    p.add_argument("--objective", choices=OBJECTIVES, default=d.objective)
    p.add_argument("--repeats", type=int_arg("repeats"), default=d.repeats,
                   help="at most this many interleaved timing rounds (fewer when steps are slow)")
    p.add_argument("--seed", type=int_arg("seed"), default=d.seed)
    p.add_argument("--save-names", type=names_arg, default=(), metavar="A,B",
                   help="policy custom (in --policies): checkpoint names saved on the device")
    p.add_argument("--offload-names", type=names_arg, default=(), metavar="A,B",
                   help="policy custom (in --policies): checkpoint names offloaded to the host")


def add_target_args(p: argparse.ArgumentParser, target_help: str = "compile for this accelerator "
                    "without it (see `targets`); default: local, run",
                    mesh_help: str = "shard the step over a device mesh (any subset of the axes; "
                                     "on a named target dcn_data, dcn_fsdp, dcn_tensor repeat an "
                                     "axis over slices or hosts, MaxText's dcn_*_parallelism: "
                                     "dcn_data=2,fsdp=8 is 16 devices; default: one device)") -> None:
    """``--mesh``, ``--target`` and ``--target-devices`` (run, advise, synthesize)."""
    p.add_argument("--mesh", default="", metavar="[dcn_data=S,]data=D,fsdp=F,tensor=T", help=mesh_help)
    p.add_argument("--target", choices=TARGET_NAMES, default="local", metavar="TARGET", help=target_help)
    p.add_argument("--target-devices", type=count_arg("target devices", MAX_TARGET_DEVICES), default=1,
                   metavar="N", help="devices of the target the program is placed on (a --mesh over all)")
    p.add_argument("--network", default="", metavar="NAME", help="the host network pricing collectives "
                   "across hosts (h100: a3-mega, default; a3-high; dgx-h100; see `targets`)")
    p.add_argument("--collective-overlap", default="", choices=tuple(COLLECTIVE_OVERLAPS), help="a TPU's "
                   "collectives beside its kernels: all-gathers only, or none (default: every one)")


def add_mesh_args(p: argparse.ArgumentParser) -> None:
    """The device mesh and where its devices come from (sharding.py, distributed.py)."""
    add_target_args(p)
    p.add_argument("--host-devices", type=count_arg("host devices", 512), default=None, metavar="N",
                   help="emulate N CPU devices (default: $REMAT_LAB_HOST_DEVICES); GPU/TPU use their own")
    p.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                   help="multi-process run: jax.distributed coordinator (process 0's address)")
    p.add_argument("--num-processes", type=count_arg("num processes", 1024), default=None, metavar="P")
    p.add_argument("--process-id", type=count_arg("process id", 1023, lo=0), default=None, metavar="I",
                   help="this process's index, 0..P-1; process 0 prints the result")


def config_from(args: argparse.Namespace) -> RunConfig:
    """The ``RunConfig`` that run, explain and compare's flags describe (raises ConfigError)."""
    keys = ("model", "width", "batch", "seq", "depth", "stack", "dtype", "policy", "objective",
            "repeats", "warmup", "seed")
    values = dict({k: getattr(args, k) for k in keys}, heads=args.heads,
                  save_names=args.save_names, offload_names=args.offload_names,
                  mesh=getattr(args, "mesh", ""), target=getattr(args, "target", "local"),
                  target_devices=getattr(args, "target_devices", 1), network=getattr(args, "network", ""),
                  collective_overlap=getattr(args, "collective_overlap", ""))
    llm = ("vocab", "kv_heads", "head_dim", "mlp_dim", "tie_embeddings", "step", "microbatches",
           "compile_only", "attention", "attention_block", "loss_chunks", "remat_layers",
           "optimizer_offload", "experts", "experts_per_token", "expert_mlp_dim", "shared_experts",
           "router_gating", "capacity_factor", "load_balance_loss_weight")
    values.update({k: getattr(args, k) for k in llm if hasattr(args, k)})
    values.update({k: getattr(args, k) for k in ("param_dtype", "optimizer_dtype")
                   if getattr(args, k, None)})
    if getattr(args, "model_module", "") or getattr(args, "user_input_shape", ""):
        values.update(user_block_fields(args))
    preset, chosen = getattr(args, "preset", None), given(args)
    if getattr(args, "model_config", None):
        return _from_model_config(args.model_config, values, chosen, preset)
    if not preset:  # an llm training step: the recipe, as a preset's; a dtype flag replaces its field only
        train = values["model"] == "llm" and values.get("step") == "train"
        return RunConfig(**{**values, **({**RECIPE, **{k: values[k] for k in RECIPE if k in chosen}}
                                         if train else {})})
    return RunConfig.from_preset(preset, **{k: v for k, v in values.items()  # where no flag set them
                                            if k not in (*PRESET_FIELDS, "model", *RECIPE)
                                            or k in chosen})


def _from_model_config(path: str, values: dict, chosen: set, preset: str | None) -> RunConfig:
    """``--model-config FILE``: the file's llm shape, the flags given on top (as a preset's); what
    the lab does not reproduce of it is said on stderr, one line each."""
    from remat_lab.config.model_config import load_model_config

    if preset:
        raise ConfigError("--preset and --model-config both give the llm's shape; give one.")
    if "model" in chosen and values["model"] != "llm":
        raise ConfigError(f"--model-config is an llm's shape; leave out --model {values['model']} "
                          "(or give --model llm).")
    read = load_model_config(path)
    config = read.config(**{k: v for k, v in values.items()
                            if k not in (*PRESET_FIELDS, "model", *RECIPE) or k in chosen})
    for line in read.notes(seq_given="seq" in chosen):
        print(f"remat_lab: note: {path}, {read.source}: {line}", file=sys.stderr)
    return config


def user_block_fields(args: argparse.Namespace) -> dict:
    """``--model-module`` and ``--input-shape`` as fields: model user, its factory, its input (the
    module's ``example_input_shape`` when not given) and the batch, its first axis."""
    from remat_lab.config.userblock import parse_input_shape

    if not args.model_module:
        raise ConfigError("--input-shape is the input of your own block: give --model-module too.")
    if "model" in given(args) or getattr(args, "preset", None) or getattr(args, "model_config", None):
        raise ConfigError("--model-module is your own block instead of --model, --preset or "
                          "--model-config; give one.")
    shape = parse_input_shape(args.user_input_shape)
    if not shape:
        from remat_lab.model.user_block import example_input_shape  # lazy: it loads JAX
        shape = parse_input_shape(example_input_shape(args.model_module) or ())
        shape = (args.batch, *shape[1:]) if shape and "batch" in given(args) else shape  # at --batch
    elif "batch" in given(args) and args.batch != shape[0]:  # was dropped without a word
        raise ConfigError(f"--batch {args.batch} differs from --input-shape's first axis ({shape[0]}), "
                          "the block's batch; give one, or the same number.")
    return {"model": "user", "model_module": args.model_module, "input_shape": shape,
            "batch": shape[0] if shape else 1}


def record(doc: dict, kind: str) -> None:
    """Store a finished run in the history; a history that cannot be used is said, not fatal."""
    from remat_lab.store import history

    problem = history.try_record(doc, kind=kind, source="cli")
    if problem:
        print(f"remat_lab: warning: not recorded in the history: {problem}", file=sys.stderr)
