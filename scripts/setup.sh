#!/usr/bin/env bash
# Installs everything episodestream needs on a fresh Debian/Ubuntu machine; safe to run again.
#   bash scripts/setup.sh          # the library, its decoders and FFmpeg's shared libraries
#   bash scripts/setup.sh --test   # the same plus what the test command needs (pytest, ruff, mypy, ...)
#   bash scripts/setup.sh --lerobot  # the same plus LeRobot (`episodestream lerobot-train`), the
#                                    # '.[lerobot]' extra. LeRobot 0.6 needs Python >= 3.12 (its code uses
#                                    # 3.12-only syntax): .venv is made from $PYTHON, else the first
#                                    # Python >= 3.12 found (python3, python3.12-3.14 on PATH, pyenv's,
#                                    # uv's); without one, it says how to get one and changes nothing.
#                                    # Without an NVIDIA GPU it installs PyTorch's CPU build of torch
#                                    # (PyPI's default Linux build bundles CUDA: of such a 5.5 GB venv,
#                                    # 4.5 GB are torch, triton and the nvidia-* packages).
#   bash scripts/setup.sh --lerobot --venv .venv-lerobot  # into another folder: an existing .venv on
#                                    # an older Python stays as it is, beside it
# Everything goes into the virtual environment .venv in the checkout (made on the first run; --venv DIR
# names another), so .venv/bin/python is the interpreter to run afterwards, wherever setup.sh was
# started from: a distribution's Python refuses pip installs outside a venv (PEP 668, Debian's
# "externally managed" /usr/bin/python3), and one command for every case keeps the README true.
# PYTHON picks the interpreter the venv is made from (default: python3). The venv sees that
# interpreter's packages (--system-site-packages), and those of the venv or conda env setup.sh runs
# in, if any: a torch that is already installed is kept, so GPU clusters keep their own CUDA build.
# TORCH_INDEX_URL: where --lerobot gets the CPU build (default: PyTorch's CPU index).
# setup.sh never removes a venv it did not just make: what it cannot do, it says before changing anything.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_PYTHON=${PYTHON:-python3}
VENV=.venv
TEST=0
LEROBOT=0
while [ $# -gt 0 ]; do
    case "$1" in
        --test) TEST=1 ;;
        --lerobot) LEROBOT=1 ;;
        --venv=*) VENV=${1#--venv=} ;;
        --venv)
            if [ $# -lt 2 ]; then echo "setup: --venv needs a folder, e.g. --venv .venv-lerobot" >&2; exit 2; fi
            VENV=$2
            shift ;;
        *) echo "setup: unknown option $1 (options: --test, --lerobot, --venv DIR)" >&2; exit 2 ;;
    esac
    shift
done
if [ -z "$VENV" ]; then echo "setup: --venv needs a folder, e.g. --venv .venv-lerobot" >&2; exit 2; fi
EXTRAS=""
[ "$TEST" = 1 ] && EXTRAS="test"
[ "$LEROBOT" = 1 ] && EXTRAS="${EXTRAS:+$EXTRAS,}lerobot"
EXTRAS=${EXTRAS:+[$EXTRAS]}

# A folder that holds something but no venv is the user's: never made into (or removed as) a venv.
if [ ! -x "$VENV/bin/python" ] && [ -e "$VENV" ] && [ -n "$(ls -A "$VENV" 2>/dev/null || echo file)" ]; then
    echo "setup: $VENV is not a virtual environment (it holds other files): nothing was changed. Name another" \
         "folder with --venv DIR, or move it away." >&2
    exit 1
fi

# LeRobot needs Python >= 3.12: checked before anything is installed or made.
at_least_312() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; }
python_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo "not found"; }
# The first Python >= 3.12 here: python3, python3.12..3.14 on PATH, then pyenv's and uv's installed ones.
find_python_312() {
    local candidate
    for candidate in python3 python3.12 python3.13 python3.14; do
        if at_least_312 "$candidate"; then command -v "$candidate"; return 0; fi
    done
    for candidate in "${PYENV_ROOT:-${HOME:-/nonexistent}/.pyenv}"/versions/3.1[2-9]*/bin/python3; do
        if [ -x "$candidate" ] && at_least_312 "$candidate"; then echo "$candidate"; return 0; fi
    done
    if command -v uv >/dev/null 2>&1; then
        candidate=$(uv python find '>=3.12' 2>/dev/null || true)
        if [ -n "$candidate" ] && at_least_312 "$candidate"; then echo "$candidate"; return 0; fi
    fi
    return 0
}
how_to_get_312() {
    local uv_install="pipx install uv (or: curl -LsSf https://astral.sh/uv/install.sh | sh)" uv=uv
    if [ -x "$VENV/bin/python" ]; then  # the existing venv can hold uv: no root, nothing else changed
        uv_install="$VENV/bin/python -m pip install uv"
        uv="$VENV/bin/uv"
    fi
    {
        echo "setup: to get a Python >= 3.12 (any one of these), then run the command below with it:"
        echo "  uv, no root: $uv_install; $uv python install 3.12; then PYTHON=\$($uv python find 3.12)"
        echo "  pyenv: pyenv install 3.12 (setup.sh finds pyenv's Pythons by itself)"
        echo "  Ubuntu 22.04: sudo add-apt-repository ppa:deadsnakes/ppa && sudo apt-get install python3.12-venv"
        echo "  (Ubuntu 24.04's and Debian 13's python3 are new enough; Debian 12 has none: uv, pyenv or conda)"
        echo "  conda: conda create -n py312 python=3.12; then PYTHON=\$(conda run -n py312 which python)"
    } >&2
}
AGAIN="--lerobot"  # this run's options, for the commands it suggests
[ "$TEST" = 1 ] && AGAIN="--test --lerobot"
if [ "$LEROBOT" = 1 ]; then
    if [ -x "$VENV/bin/python" ]; then
        if ! at_least_312 "$VENV/bin/python"; then
            # Said before anything changes: the working venv stays, and a command to run comes with an
            # interpreter that exists (a bare 'rm -rf .venv' first left a user with no venv at all).
            FOUND=$(find_python_312)
            if [ -n "${PYTHON:-}" ] && at_least_312 "$PYTHON"; then FOUND=$PYTHON; fi
            echo "setup: LeRobot needs Python >= 3.12; $VENV is Python $(python_version "$VENV/bin/python"), so it" \
                 "cannot take LeRobot. Nothing was changed: $VENV is as it was." >&2
            if [ -n "$FOUND" ]; then
                echo "setup: $FOUND is Python $(python_version "$FOUND"). Make LeRobot's venv beside $VENV (nothing" \
                     "is removed; then run .venv-lerobot/bin/python -m episodestream lerobot-train ...):" >&2
                echo "  PYTHON=$FOUND bash scripts/setup.sh $AGAIN --venv .venv-lerobot" >&2
                echo "setup: or replace $VENV by one on Python $(python_version "$FOUND") (removing it first):" \
                     "rm -rf $VENV && PYTHON=$FOUND bash scripts/setup.sh $AGAIN" >&2
            else
                echo "setup: no Python >= 3.12 was found (python3, python3.12-3.14 on PATH, pyenv's, uv's)." >&2
                how_to_get_312
                echo "  PYTHON=/path/to/python3.12 bash scripts/setup.sh $AGAIN --venv .venv-lerobot  # beside $VENV" >&2
            fi
            exit 1
        fi
    elif ! at_least_312 "$BASE_PYTHON"; then
        FOUND=$(find_python_312)
        if [ -n "${PYTHON:-}" ] || [ -z "$FOUND" ]; then
            if [ -n "${PYTHON:-}" ]; then
                echo "setup: LeRobot needs Python >= 3.12; PYTHON=$PYTHON is Python $(python_version "$PYTHON")." \
                     "Nothing was installed." >&2
            else
                echo "setup: LeRobot needs Python >= 3.12; $BASE_PYTHON is $(python_version "$BASE_PYTHON") and no" \
                     "Python >= 3.12 was found (python3.12-3.14 on PATH, pyenv's, uv's). Nothing was installed." >&2
            fi
            if [ -n "$FOUND" ]; then
                echo "setup: $FOUND is Python $(python_version "$FOUND"):" >&2
                echo "  PYTHON=$FOUND bash scripts/setup.sh $AGAIN" >&2
            else
                how_to_get_312
                echo "  PYTHON=/path/to/python3.12 bash scripts/setup.sh $AGAIN" >&2
            fi
            exit 1
        fi
        echo "setup: LeRobot needs Python >= 3.12; $BASE_PYTHON is $(python_version "$BASE_PYTHON"), so $VENV is made" \
             "from $FOUND (Python $(python_version "$FOUND"))" >&2
        BASE_PYTHON=$FOUND
    fi
fi

# torchcodec loads the system's FFmpeg libraries; the ffmpeg package brings them (and ffprobe).
# The tests also lint the SLURM scripts (shellcheck) and run their job body under POSIX sh (dash).
APT_PACKAGES=""
command -v ffprobe >/dev/null 2>&1 || APT_PACKAGES="ffmpeg"
if [ "$TEST" = 1 ]; then
    command -v shellcheck >/dev/null 2>&1 || APT_PACKAGES="$APT_PACKAGES shellcheck"
    command -v dash >/dev/null 2>&1 || APT_PACKAGES="$APT_PACKAGES dash"
fi
if [ -n "$APT_PACKAGES" ]; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "setup: installing $APT_PACKAGES (apt-get)" >&2
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086  # a list of package names
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $APT_PACKAGES >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating the virtual environment $VENV (from $("$BASE_PYTHON" -c 'import sys; print(sys.executable)'))" >&2
    if ! "$BASE_PYTHON" -m venv --system-site-packages "$VENV" 2>/dev/null; then
        # Debian/Ubuntu ship venv's ensurepip separately.
        SUDO=""
        [ "$(id -u)" -ne 0 ] && SUDO="sudo"
        VERSION=$("$BASE_PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
        echo "setup: installing python${VERSION}-venv (apt-get), which python -m venv needs" >&2
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "python${VERSION}-venv" >/dev/null
        rm -rf "$VENV"
        "$BASE_PYTHON" -m venv --system-site-packages "$VENV"
    fi
    # Run from inside a venv, the new one sees the base interpreter's packages but not that venv's
    # (a conda env is its own base, so --system-site-packages covers it): a .pth file adds them.
    OUTER_SITE=$("$BASE_PYTHON" -c 'import sys, sysconfig; print(sysconfig.get_path("purelib") if sys.prefix != sys.base_prefix else "")')
    if [ -n "$OUTER_SITE" ]; then
        "$VENV/bin/python" -c 'import sys, sysconfig, pathlib; pathlib.Path(sysconfig.get_path("purelib"), "_setup_outer_env.pth").write_text(sys.argv[1] + "\n")' "$OUTER_SITE"
    fi
fi
PYTHON="$VENV/bin/python"

pip_install() { "$PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore "$@"; }

# Install torch first, pinned: an unpinned install (or a dependency's) would fetch a multi-GB
# CUDA build. 2.13.0 is the CPU wheel this project is tested with. With --lerobot, torch, torchvision
# and torchcodec come within LeRobot's bounds (it needs torch < 2.12), below, unless a torch is installed.
if [ "$LEROBOT" = 0 ] && ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    echo "setup: installing torch==2.13.0" >&2
    pip_install "torch==2.13.0"
fi
# torchcodec must match torch: 0.13.0 is the newest CPU build for torch 2.13 (newer ones need CUDA).
if [ "$LEROBOT" = 0 ] && ! "$PYTHON" -c "import torchcodec.decoders" >/dev/null 2>&1; then
    if "$PYTHON" -c "import torch, sys; sys.exit(not torch.__version__.startswith('2.13.'))"; then
        pip_install "torchcodec==0.13.0"
    else
        pip_install torchcodec
    fi
fi
# With --lerobot and no torch yet: without an NVIDIA GPU, PyTorch's CPU build of torch and torchvision
# within LeRobot 0.6's bounds (its own requirements), before the extra; PyPI's default Linux build
# bundles CUDA (~4 GB more). Where that index cannot be reached, pip's default build is installed,
# said so (it runs on the CPU too).
has_nvidia_gpu() { [ -e /proc/driver/nvidia/version ] || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; }
if [ "$LEROBOT" = 1 ] && ! "$PYTHON" -c "import torch" >/dev/null 2>&1 && [ "$(uname -s)" = Linux ] && ! has_nvidia_gpu; then
    TORCH_CPU_INDEX=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
    echo "setup: no NVIDIA GPU here: installing PyTorch's CPU build of torch and torchvision (from $TORCH_CPU_INDEX)" >&2
    if ! pip_install --retries 1 --timeout 30 --index-url "$TORCH_CPU_INDEX" "torch>=2.7,<2.12" "torchvision>=0.22,<0.27"; then
        echo "setup: the CPU build could not be installed from $TORCH_CPU_INDEX (pip says why above); installing the" \
             "default build from your package index instead: it runs on the CPU too, but bundles CUDA (~4 GB more)." \
             "TORCH_INDEX_URL=URL names another copy of PyTorch's CPU index." >&2
    fi
fi
# A torch already installed stays (GPU clusters keep theirs), and the torchvision beside it.
TORCH_PIN=$("$PYTHON" -c "import torch; print('torch==' + torch.__version__.split('+')[0])" 2>/dev/null || true)
VISION_PIN=""
if [ "$LEROBOT" = 1 ]; then
    VISION_PIN=$("$PYTHON" -c "import torchvision; print('torchvision==' + torchvision.__version__.split('+')[0])" \
                 2>/dev/null || true)
fi
pip_install -e ".${EXTRAS}" ${TORCH_PIN:+"$TORCH_PIN"} ${VISION_PIN:+"$VISION_PIN"}
if [ "$TEST" = 1 ]; then
    # An unpinned s3fs can resolve to an ancient release; its versions track fsspec's.
    FSSPEC_VERSION=$("$PYTHON" -c "import fsspec; print(fsspec.__version__)")
    # A botocore already installed stays, as torch does: what installed it may pin it (a base
    # interpreter's awscli pins botocore==X), and the newest aiobotocore would replace it, leaving pip's
    # "dependency resolver ... awscli requires botocore==X" ERROR. pip then picks an aiobotocore that
    # takes it; where none does (a botocore too old for this s3fs), the newest is installed as before.
    BOTOCORE_PIN=$("$PYTHON" -c "import botocore; print('botocore==' + botocore.__version__)" 2>/dev/null || true)
    if [ -z "$BOTOCORE_PIN" ] || ! pip_install "s3fs==${FSSPEC_VERSION}" "fsspec==${FSSPEC_VERSION}" "$BOTOCORE_PIN" 2>/dev/null; then
        pip_install "s3fs==${FSSPEC_VERSION}" "fsspec==${FSSPEC_VERSION}"
    fi
fi
# The compiled frame writer (episodestream/_sample/_chw_kernel.c) is built only where pip finds a C compiler
# and Python's headers; without it numpy writes the frames, bit for bit the same but slower.
if ! "$PYTHON" -c "import episodestream._sample._chw_kernel" >/dev/null 2>&1; then
    echo "setup: episodestream's compiled frame writer was not built (pip's build_ext warning says why; usually" \
         "no C compiler or no Python headers): frames are written by numpy, bit for bit the same, ~0.1 ms more" \
         "per float32 frame. Install gcc and python3-dev, then rerun." >&2
fi
if [ "$LEROBOT" = 1 ]; then
    TORCH_BUILD=$("$PYTHON" -c 'import torch; print(torch.__version__, "CUDA " + torch.version.cuda if torch.version.cuda else "CPU build")')
    "$PYTHON" -c "import lerobot" && echo "setup: LeRobot installed (torch $TORCH_BUILD, $(du -sh "$VENV" | cut -f1) in" \
        "$VENV): $VENV/bin/python -m episodestream lerobot-train --help lists its options" >&2
fi
echo "setup: done; run with $VENV/bin/python (e.g. $VENV/bin/python -m episodestream demo)" >&2
