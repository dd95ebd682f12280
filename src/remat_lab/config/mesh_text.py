"""A device mesh as text (``data=2,fsdp=4``): its axes, parsing, the canonical form and its size; no JAX."""

from __future__ import annotations

from .errors import ConfigError

MESH_AXES = ("data", "fsdp", "tensor", "expert")  # the device mesh's axes, in mesh order (program/mesh.py)
# The axes a batch is split over (MaxText's activation_batch): expert too, outside a mixture of experts.
BATCH_AXES = ("data", "fsdp", "expert")
# MaxText's cross-slice axes (``dcn_*_parallelism``): ``dcn_fsdp=2,fsdp=4`` is one logical fsdp axis
# of 2 x 4 devices, 2 slices (TPU) or hosts (GPU) of 4, the slower (dcn) part outermost.
DCN_AXES = tuple(f"dcn_{a}" for a in MESH_AXES)
TEXT_AXES = DCN_AXES + MESH_AXES  # the canonical text's order
MAX_MESH_DEVICES = 4096


def _show(value: object, limit: int = 40) -> str:
    """``value`` for a one-line message: a string's repr cut to ``limit`` characters, never raising."""
    try:
        text = repr(str(value)[:limit] if isinstance(value, str) else value)
    except ValueError:  # an int too long to print (sys.get_int_max_str_digits)
        return "a number with too many digits"
    return text if len(text) <= limit + 2 else text[:limit] + "..."



def mesh_parts(text: object) -> tuple[dict[str, int], dict[str, int]]:
    """``'dcn_data=2,fsdp=4'`` -> ``({'fsdp': 4}, {'data': 2})``: the in-slice (ICI / NVLink) and the
    cross-slice (``dcn_*``: data-centre network, or the network between GPU hosts) size of each
    logical axis, keyed by ``MESH_AXES``, size-1 parts dropped. ``ConfigError`` for unknown axes,
    sizes that are not whole numbers, an axis given twice or more than ``MAX_MESH_DEVICES``."""
    if not isinstance(text, str):
        raise ConfigError(f"mesh must be text like data=2,fsdp=2, not {_show(text)}.")
    sizes: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, eq, size = (s.strip() for s in part.partition("="))
        if name not in TEXT_AXES:
            raise ConfigError(f"unknown mesh axis {_show(name)}; use {', '.join(MESH_AXES)} (within a "
                              f"slice or host) or {', '.join(DCN_AXES)} (across slices or hosts) as "
                              "axis=size, e.g. data=2,tensor=2 or dcn_data=2,fsdp=8.")
        if not eq or not (size.isascii() and size.isdigit()) or len(size) > 5 or int(size) < 1:
            raise ConfigError(f"mesh axis {name} needs a whole number of devices, e.g. {name}=2; "
                              f"got {_show(part)}.")
        if name in sizes:
            raise ConfigError(f"mesh axis {name} is given twice.")
        sizes[name] = int(size)
    total = 1
    for n in sizes.values():
        total *= n
    if total > MAX_MESH_DEVICES:
        raise ConfigError(f"mesh {_show(text)} asks for {total} devices; at most {MAX_MESH_DEVICES}.")
    ici = {a: sizes[a] for a in MESH_AXES if sizes.get(a, 1) > 1}
    dcn = {a: sizes[f"dcn_{a}"] for a in MESH_AXES if sizes.get(f"dcn_{a}", 1) > 1}
    return ici, dcn


def parse_mesh(text: object) -> dict[str, int]:
    """``'data=2,tensor=2'`` -> ``{'data': 2, 'tensor': 2}`` in ``MESH_AXES`` order: each logical
    axis's size, in-slice x cross-slice (``'dcn_fsdp=2,fsdp=4'`` -> ``{'fsdp': 8}``, as MaxText
    multiplies ``ici_*`` and ``dcn_*``); size-1 axes dropped, ``''`` (one device) -> ``{}``. No JAX:
    whether the devices exist is checked when the mesh is built (``sharding.build_mesh``)."""
    ici, dcn = mesh_parts(text)
    sizes = {a: ici.get(a, 1) * dcn.get(a, 1) for a in MESH_AXES}
    return {a: n for a, n in sizes.items() if n > 1}


def batch_rows(sizes: dict[str, int]) -> int:
    """How many ways a batch is split on a mesh of logical ``sizes``: data x fsdp x expert."""
    rows = 1
    for a in BATCH_AXES:
        rows *= sizes.get(a, 1)
    return rows


def batch_axes_text(sizes: dict[str, int]) -> str:
    """``'data x fsdp'``: the batch axes, as a message names them (expert only where present)."""
    return " x ".join(a for a in BATCH_AXES if a != "expert" or a in sizes)


def mesh_dcn(text: object) -> dict[str, int]:
    """The cross-slice part of each logical axis of ``text`` (``{}``: one slice or host)."""
    return mesh_parts(text)[1]


def mesh_slices(text: object) -> int:
    """How many slices (TPU) or hosts (GPU) the mesh spans: the product of its dcn axes."""
    total = 1
    for n in mesh_dcn(text).values():
        total *= n
    return total


def format_mesh(sizes: dict[str, int], dcn: dict[str, int] | None = None) -> str:
    """``{'data': 2, 'tensor': 2}`` -> ``'data=2,tensor=2'`` (the canonical ``RunConfig.mesh``);
    with ``dcn`` (the cross-slice part of each logical size in ``sizes``) the dcn axes come first:
    ``({'fsdp': 8}, {'fsdp': 2})`` -> ``'dcn_fsdp=2,fsdp=4'``. ``ConfigError`` when a dcn part does
    not divide its axis."""
    dcn = {a: n for a, n in (dcn or {}).items() if n > 1}
    parts = []
    for a in MESH_AXES:
        if a in dcn:
            if sizes.get(a, 1) % dcn[a]:
                raise ConfigError(f"mesh axis {a} of {sizes.get(a, 1)} devices cannot span "
                                  f"dcn_{a}={dcn[a]} slices; use a multiple of {dcn[a]}.")
            parts.append(f"dcn_{a}={dcn[a]}")
    parts += [f"{a}={sizes[a] // dcn.get(a, 1)}" for a in MESH_AXES
              if sizes.get(a, 1) // dcn.get(a, 1) > 1]
    return ",".join(parts)


def canonical_mesh(text: object) -> str:
    """``text`` in canonical form (``'fsdp=4,dcn_data=2'`` -> ``'dcn_data=2,fsdp=4'``)."""
    return format_mesh(parse_mesh(text), mesh_dcn(text))


def mesh_devices(mesh: str) -> int:
    """How many devices ``mesh`` uses (1 for ``''``)."""
    total = 1
    for n in parse_mesh(mesh).values():
        total *= n
    return total
