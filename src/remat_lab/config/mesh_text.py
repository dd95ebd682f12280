"""A device mesh as text (``data=2,fsdp=4``): its axes, parsing, the canonical form and its size; no JAX."""

from __future__ import annotations

from .errors import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")  # the device mesh's axes, in mesh order (program/mesh.py)
MAX_MESH_DEVICES = 4096


def _show(value: object, limit: int = 40) -> str:
    """``value`` for a one-line message: a string's repr cut to ``limit`` characters, never raising."""
    try:
        text = repr(str(value)[:limit] if isinstance(value, str) else value)
    except ValueError:  # an int too long to print (sys.get_int_max_str_digits)
        return "a number with too many digits"
    return text if len(text) <= limit + 2 else text[:limit] + "..."



def parse_mesh(text: object) -> dict[str, int]:
    """``'data=2,tensor=2'`` -> ``{'data': 2, 'tensor': 2}`` in ``MESH_AXES`` order; size-1 axes
    dropped, ``''`` (one device) -> ``{}``. No JAX: whether the devices exist is checked when the
    mesh is built (``sharding.build_mesh``)."""
    if not isinstance(text, str):
        raise ConfigError(f"mesh must be text like data=2,fsdp=2, not {_show(text)}.")
    sizes: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, eq, size = (s.strip() for s in part.partition("="))
        if name not in MESH_AXES:
            raise ConfigError(f"unknown mesh axis {_show(name)}; use {', '.join(MESH_AXES)} "
                              "as axis=size, e.g. data=2,tensor=2.")
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
    return {a: sizes[a] for a in MESH_AXES if sizes.get(a, 1) > 1}


def format_mesh(sizes: dict[str, int]) -> str:
    """``{'data': 2, 'tensor': 2}`` -> ``'data=2,tensor=2'`` (the canonical ``RunConfig.mesh``)."""
    return ",".join(f"{a}={sizes[a]}" for a in MESH_AXES if sizes.get(a, 1) > 1)


def mesh_devices(mesh: str) -> int:
    """How many devices ``mesh`` uses (1 for ``''``)."""
    total = 1
    for n in parse_mesh(mesh).values():
        total *= n
    return total
