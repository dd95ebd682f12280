# Sourced by the chip's scripts: the VM's Python (the one with its JAX and libtpu), the rest of what
# the lab imports installed into /tmp/site after that JAX on PYTHONPATH; sets $py and PYTHONPATH.
# PIP_INDEX_URL (default: the lent chip's local index) says from where.
index=${PIP_INDEX_URL:-file:///opt/pypi/simple}
extra=()  # the lent chip's second local index, where it has one
[ -z "${PIP_INDEX_URL:-}" ] && [ -d /opt/pypi-more/simple ] && extra=(--extra-index-url file:///opt/pypi-more/simple)
# the Python that has the VM's JAX (a TPU VM may have several; a bare python3 may be another one)
py=python3
for candidate in python3.11 python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import jax' 2>/dev/null; then py=$candidate; break; fi
done
site=/tmp/site
if [ ! -d "$site/flax" ]; then
  PIP_CONFIG_FILE=/dev/null "$py" -m pip install --isolated -q --only-binary=:all: \
    --index-url "$index" "${extra[@]}" --target "$site" flax optax pandas rich pyyaml streamlit plotly \
    2> >(grep -v "^WARNING: Location" >&2)
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD/src:$site"
export PYTHONUNBUFFERED=1
"$py" -c 'import jax, sys; print(sys.version, jax.__version__, jax.devices())'
