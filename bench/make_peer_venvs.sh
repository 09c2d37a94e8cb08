#!/usr/bin/env bash
# Creates the benchmark peers' virtual environments, one per peer, so that
# neither is ever installed beside keras_vit (keras-hub needs tensorflow-text,
# which pulls the full `tensorflow` next to our `tensorflow-cpu`; timm needs
# torch):
#
#   bench/make_peer_venvs.sh FOLDER [kerashub|torch ...]
#
# makes FOLDER/kerashub (keras-hub + tensorflow-text + tensorflow) and
# FOLDER/torch (torch 2.14.1 CPU wheels + timm); with names, only those.
# A venv whose peer already imports is left as it is. bench/peers.py finds
# them with --venvs FOLDER.
set -euo pipefail

if [[ $# -lt 1 || "$1" == -* ]]; then
    echo "usage: $0 FOLDER [kerashub|torch ...]" >&2
    exit 2
fi
folder="$1"
shift
peers=("$@")
[[ ${#peers[@]} -eq 0 ]] && peers=(kerashub torch)
python="${PYTHON:-python3}"
mkdir -p "$folder"

make_venv() {  # name, import check, pip arguments...
    local name="$1" check="$2"
    shift 2
    local venv="$folder/$name"
    if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "$check" 2>/dev/null; then
        echo "$name: already there ($venv)"
        return
    fi
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet "$@"
    "$venv/bin/python" -c "$check"
    echo "$name: made ($venv)"
}

for peer in "${peers[@]}"; do
    case "$peer" in
    kerashub)
        # tensorflow-text pins the matching full tensorflow.
        make_venv kerashub "import keras_hub, tensorflow_text" \
            "keras-hub" "tensorflow-text" "tensorflow"
        ;;
    torch)
        # From the default index (CUDA libraries included on Linux, unused
        # on a CPU machine); TORCH_INDEX=https://download.pytorch.org/whl/cpu
        # takes the much smaller CPU-only wheels where that host is reachable.
        make_venv torch "import torch, timm" \
            ${TORCH_INDEX:+--index-url "$TORCH_INDEX" --extra-index-url https://pypi.org/simple} \
            "torch==2.14.1" "timm"
        ;;
    *)
        echo "unknown peer '$peer'; valid peers are kerashub, torch" >&2
        exit 2
        ;;
    esac
done
