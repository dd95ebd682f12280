"""Property-based input fuzzing of every surface that takes user input.

Surfaces: the command line (``remat_lab.cli.main`` in-process), the engine's configuration
constructors (``RunConfig(**kw)``, ``coerce_config``) and the app's URL query parameters (AppTest).
Every case must end in a valid run or a clear one-line message: never a traceback, never an
uncaught exception, never a hang (hypothesis' examples are bounded; AppTest has a timeout).

Speed: the CLI's engine call and the app's run are stubbed (the CLI stub still applies the real
memory guard and returns a real result of a tiny configuration, so formatting and JSON output run
for real). The URL reaches the engine only as the ``RunConfig`` the page hands to
``_running.run_one``; the stub records it and the test checks it, so 200 AppTest examples fit in
well under a minute. The real run path behind a URL is covered in test_reliability.py.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from remat_lab.cli import main
from remat_lab.config import (
    BOOL_FIELDS,
    CHOICES,
    LIMITS,
    LLM_LIMITS,
    ConfigError,
    RunConfig,
    check_budget,
    coerce_config,
    resolve_budget,
)
from remat_lab.config.moe_config import FLOAT_LIMITS
from remat_lab.program import backend
from remat_lab.studies import experiment

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

NASTY = [
    "", " ", "-", "--", "-1", "0", "-0", "--5", "+7", "007", "1e3", "2.5", "1_000", "0x10", "nan",
    "inf", "-inf", "9" * 30, "9" * 5000, "١٢", "１２", "²", "$(rm -rf /)", "; ls -la", "`id`",
    "| cat /etc/passwd", "&& reboot", "<script>alert(1)</script>", "<img src=x onerror=alert(1)>",
    "&amp;&lt;", "'\"", "../../etc/passwd", "%s%n%(x)s", "{0}{1}", "\x00", "\n", "a\nb", "\r\n",
    "\u2028", "é", "💥", "ﷺ", "__import__('os').system('id')", "__class__", "None", "True",
    "no_remat ", "NO_REMAT", "checkpoint_dots", "save_anything_except_these_names",
]
nasty = st.sampled_from(NASTY)
any_text = st.one_of(nasty, st.text(max_size=24))
number_text = st.one_of(st.integers(-(2**70), 2**70).map(str),
                        st.floats(allow_nan=True, allow_infinity=True).map(str))


def _valid_text(name: str):
    if name in LIMITS:
        lo, hi = LIMITS[name]
        return st.integers(lo, min(hi, 64)).map(str)
    if name in FLOAT_LIMITS:  # a mixture of experts' fractional fields
        return st.sampled_from(["0", "1.25", "2", "0.5"])
    if name in ("save_names", "offload_names"):  # the custom policy's checkpoint names
        return st.sampled_from(["l1", "l1,l2", "query_proj", "context,mlpwo", "scores"])
    if name in BOOL_FIELDS:  # yes/no fields, as a URL or form writes them
        return st.sampled_from(["true", "false"])
    if name == "model_module":  # the user's own block is code: the fuzz never names a real one
        return st.sampled_from(["", "no/such/file.py:make_block", "nosuchpkg.blocks:make"])
    if name == "input_shape":  # the user block's input (built-in models derive it)
        return st.sampled_from(["", "4,16,64", "2,8"])
    if name == "mesh":  # the device mesh (sharding.py); the stubbed engine builds none
        return st.sampled_from(["", "data=1", "fsdp=2", "data=2,tensor=2"])
    if name == "network":  # a GPU target's host network (targets.json): only with a named target
        return st.sampled_from(["", "a3-high", "a3-mega", "dgx-h100"])
    if name == "collective_overlap":  # a TPU target's collectives beside its kernels
        return st.sampled_from(["", "all-gathers", "none"])
    return st.sampled_from(CHOICES[name])


def _value_text(name: str):
    return st.one_of(_valid_text(name), _valid_text(name), any_text, number_text)


# ---------------------------------------------------------------- the command line

CONFIG_FIELDS = [f.name for f in fields(RunConfig)]


@st.composite
def cli_argv(draw) -> list[str]:
    valid = draw(st.booleans())  # half the cases are well-formed, so real runs are exercised too
    if valid:
        argv = [draw(st.sampled_from(["run", "explain"]))]
        for _ in range(draw(st.integers(0, 5))):
            name = draw(st.sampled_from(CONFIG_FIELDS))
            argv += [f"--{name}", draw(_valid_text(name))]
        argv += draw(st.lists(st.sampled_from(["--json", "--no-cache", "--memory-budget=2G"]),
                              max_size=2, unique=True))
        if argv[0] == "explain":
            argv.append("--no-jaxpr")
        return argv
    command = draw(st.one_of(st.sampled_from(["run", "explain", "explain", "policies"]), any_text))
    argv = [command]
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.integers(0, 9))
        if kind <= 5:
            name = draw(st.sampled_from(CONFIG_FIELDS))
            argv += [f"--{name}", draw(_value_text(name))]
        elif kind == 6:
            argv += ["--memory-budget", draw(st.one_of(
                st.sampled_from(["512M", "2G", "1.5GiB", "1K", "1e-300", "0", "-1G", "lots"]),
                any_text, number_text))]
        elif kind == 7:
            argv.append(draw(st.sampled_from(["--json", "--no-jaxpr", "--no-cache", "--frob", "-x"])))
        elif kind == 8:
            argv.append(f"--{draw(st.sampled_from(CONFIG_FIELDS))}={draw(any_text)}")
        else:
            argv.append(draw(any_text))
    if command == "explain" and draw(st.booleans()):
        argv.append("--no-jaxpr")
    return argv


@pytest.fixture(scope="module")
def tiny_result():
    """A real result of a tiny configuration, for the stubbed engine calls."""
    return experiment.run_experiment(RunConfig(width=8, batch=1, repeats=1, warmup=0))


@pytest.fixture(scope="module")
def stub_engine(tiny_result):
    """run_experiment -> the real memory guard, then a copy of the tiny result."""
    calls = []

    def fake_run(config, *, budget=None, timing=True, progress=None):
        check_budget(config, resolve_budget(budget, None))
        calls.append(config)
        result = copy.deepcopy(tiny_result)
        result["config"] = config.as_dict()
        if not timing:
            result["step_time_s"] = None
        return result

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(experiment, "run_experiment", fake_run)
        mp.setattr(backend, "enable_compilation_cache", lambda path=None: "/nonexistent")
        mp.delenv("REMAT_LAB_MEMORY_BUDGET", raising=False)
        yield calls


@FUZZ
@given(argv=cli_argv())
def test_cli_fuzz_ends_in_a_run_or_one_clear_line(stub_engine, argv):
    assume(argv[0] != "bench")  # the benchmarks are not an input surface (and take minutes)
    out, err = io.StringIO(), io.StringIO()
    before = len(stub_engine)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    out, err = out.getvalue(), err.getvalue()
    assert "Traceback" not in out + err
    assert code in (0, 2), (argv, code, err)
    event(f"exit {code}")
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("remat_lab: error: "), (argv, err)
        assert len(lines[0]) < 600
        return
    # a long command (advise) reports its progress on stderr, one "[  t s] ..." line a step; nothing else
    assert not [line for line in err.strip().splitlines() if not line.startswith("[")], err
    assert out.strip()
    if argv[0] in ("run", "explain") and not {"-h", "--help"} & set(argv):
        assert len(stub_engine) == before + 1
        if "--json" in argv:
            doc = json.loads(out)
            assert doc["config"] == json.loads(json.dumps(stub_engine[-1].as_dict()))  # tuples: lists


# ---------------------------------------------------------------- the configuration constructors

any_value = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**80), 2**80), st.just(10**5000),
    st.floats(allow_nan=True, allow_infinity=True), any_text, st.binary(max_size=8),
    st.lists(st.integers(0, 9), max_size=3), st.text(min_size=100, max_size=3000),
    st.sampled_from([c for choices in CHOICES.values() for c in choices]),
    st.integers(0, 64),
)


def _check_valid(cfg: RunConfig) -> None:
    limits = {**LIMITS, **(LLM_LIMITS if cfg.model == "llm" else {})}  # the llm's seq and depth
    for name, (lo, hi) in limits.items():
        value = getattr(cfg, name)
        assert type(value) is int and lo <= value <= hi
    for name, allowed in CHOICES.items():
        assert getattr(cfg, name) in allowed
    assert not (cfg.model != "mlp" and cfg.batch == 0)


def _check_message(err: Exception) -> None:
    text = str(err)
    assert type(err) in (ConfigError,) or isinstance(err, ConfigError)
    # One line; long enough to list every allowed value (18 policies), never unbounded.
    assert text and "\n" not in text and len(text) < 600, text


@FUZZ
@given(kw=st.dictionaries(st.sampled_from(CONFIG_FIELDS), any_value, max_size=6))
# found by the fuzz: an int too long to print raised ValueError in the message's repr
@example(kw={"capacity_factor": 10 ** 5000})
def test_runconfig_fuzz_is_valid_or_refused_with_a_sentence(kw):
    try:
        cfg = RunConfig(**kw)
    except ConfigError as err:
        _check_message(err)
    else:
        _check_valid(cfg)


@FUZZ
@given(raw=st.dictionaries(
    st.one_of(st.sampled_from(CONFIG_FIELDS), st.sampled_from(CONFIG_FIELDS), any_text,
              st.integers(-3, 3)),
    st.one_of(any_text, number_text, any_value,
              st.sampled_from(CONFIG_FIELDS).flatmap(_valid_text)), max_size=6))
def test_coerce_config_fuzz_is_valid_or_refused_with_a_sentence(raw):
    try:
        cfg = coerce_config(raw)
    except ConfigError as err:
        _check_message(err)
    else:
        _check_valid(cfg)
        for name, value in raw.items():  # strings are read as plain whole numbers only
            if name in LIMITS and isinstance(value, str):
                assert getattr(cfg, name) == int(value.strip())


# ---------------------------------------------------------------- URL query parameters


@pytest.fixture(scope="module")
def page_runs():
    """The configurations the Explore page asks to run (the run itself is stubbed)."""
    from pages import _running

    seen = []

    def fake_run_one(cfg, keep_texts=True, button_key="run_now"):
        seen.append(cfg)
        return None

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_running, "run_one", fake_run_one)
        yield seen


def _expected(key: str, raw: str):
    """The value the app should take from ``?key=raw``, or None when it must warn instead."""
    try:
        return getattr(coerce_config({key: raw, "model": "mlp"} if key == "batch" else {key: raw}),
                       key)
    except ConfigError:
        return None


URL_KEYS = ("model", "width", "batch", "seq", "depth", "dtype", "policy", "objective", "repeats")
url_value = st.one_of(*(_value_text(k) for k in ("width", "batch", "policy", "model")), any_text)


@FUZZ
@given(params=st.dictionaries(
    st.one_of(st.sampled_from(URL_KEYS), st.sampled_from(URL_KEYS),
              st.text(max_size=8).filter(lambda k: not k.startswith("embed"))),
    st.one_of(st.sampled_from(URL_KEYS).flatmap(_valid_text), url_value,
              st.lists(url_value, min_size=1, max_size=3)), max_size=8))
@example(params={"model": "transformer", "batch": "0"})  # found by the fuzz: batch 1 without a word
@example(params={"preset": "llama3.2-1b", "batch": "0"})  # a preset alone makes the model the llm
def test_url_query_fuzz_ends_in_a_valid_config_or_a_warning(page_runs, params):
    from streamlit.testing.v1 import AppTest

    from pages import _sidebar, _url

    at = AppTest.from_file(str(ROOT / "pages" / "explore.py"), default_timeout=30)
    for key, value in params.items():
        at.query_params[key] = value
    before = len(page_runs)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(page_runs) == before + 1, "the page did not reach the run step"
    cfg = page_runs[-1]
    _check_valid(cfg)
    # The only red box a URL can cause is the sidebar's over-budget flag, exactly when it is over.
    errors = [e.value for e in at.error]
    assert all("cannot run here" in e for e in errors), errors
    assert bool(errors) == bool(_sidebar.over_budget(cfg)), (errors, cfg)
    warnings = [w.value for w in at.warning]
    seq_batch0 = False
    model_raw = params.get("model", "")
    asked_llm = "llm" in (cfg.model, model_raw[-1] if isinstance(model_raw, list) else model_raw)
    for key in URL_KEYS:
        if key not in params:
            continue
        raw = params[key][-1] if isinstance(params[key], list) else params[key]
        want = _expected(key, raw)
        if want is None and cfg.model == "llm" and key in LLM_LIMITS:  # the llm's longer ranges
            lo, hi = LLM_LIMITS[key]
            text = str(raw).strip()
            if text.isascii() and text.isdigit() and len(text) < 7 and lo <= int(text) <= hi:
                want = int(text)
        if want is None:
            assert any(f"`{key}`" in w for w in warnings), (key, raw, warnings)
            continue
        if key == "batch" and want == 0 and cfg.model != "mlp":
            seq_batch0 = True
            continue
        if asked_llm and getattr(cfg, key) != want:  # the llm's fields must fit together (heads
            assert any(f"`{key}`" in w for w in warnings), (key, raw, warnings)  # divide width...)
            continue
        assert getattr(cfg, key) == want, (key, raw, cfg)
    if seq_batch0:
        assert any("only for the mlp model" in w for w in warnings), warnings
    # The address bar is rewritten to exactly the configuration in use.
    want = {k: str(getattr(cfg, k)) for k in _sidebar.CONTROL_KEYS
            if k != "heads" or cfg.model in ("transformer", "llm")}  # heads only where they apply
    if cfg.model == "llm":  # the decoder LM's own fields (and its preset, when one is chosen)
        want.update({k: str(getattr(cfg, k)) for k in _url.LLM_KEYS if k != "preset" or cfg.preset})
    want.update({k: ",".join(getattr(cfg, k)) for k in ("save_names", "offload_names")
                 if getattr(cfg, k)})
    assert {k: at.query_params[k] for k in at.query_params} == want
