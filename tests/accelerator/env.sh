# Source ON the TPU machine after setup.sh: jaxwise from this checkout first, the image's JAX
# next, the installed peers last (so that a JAX a peer brought along never hides the image's).
# The image's JAX is installed for its Python 3.11; the checkout's .python-version (3.12) would
# make pyenv's python3 another Python, so pick the 3.11 that pyenv has.
for v in $(pyenv versions --bare 2>/dev/null); do case $v in 3.11*) export PYENV_VERSION=$v ;; esac; done
SITE=${SITE:-/tmp/site}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}:$SITE"
export PATH="$SITE/bin:$PATH"
export MPLBACKEND=Agg
jaxwise() { python3 -c 'import sys; from jaxwise.cli import main; sys.exit(main())' "$@"; }
