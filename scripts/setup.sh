#!/usr/bin/env bash
# Installs everything episodestream needs on a fresh Debian/Ubuntu machine; safe to run again.
#   bash scripts/setup.sh          # the library, its decoders and FFmpeg's shared libraries
#   bash scripts/setup.sh --test   # the same plus what the test command needs (pytest, ruff, mypy, ...)
#   bash scripts/setup.sh --lerobot  # the same plus LeRobot (`episodestream lerobot-train`), the
#                                    # '.[lerobot]' extra: LeRobot needs Python >= 3.12, so .venv is made
#                                    # from $PYTHON, python3 or the newest python3.1x >= 3.12 on PATH;
#                                    # without one, it prints the line to run and installs nothing
# Everything goes into the virtual environment .venv in the checkout (made on the first run), so
# .venv/bin/python is the interpreter to run afterwards, wherever setup.sh was started from:
# a distribution's Python refuses pip installs outside a venv (PEP 668, Debian's "externally
# managed" /usr/bin/python3), and one command for every case keeps the README true.
# PYTHON picks the interpreter the venv is made from (default: python3). The venv sees that
# interpreter's packages (--system-site-packages), and those of the venv or conda env setup.sh runs
# in, if any: a torch that is already installed is kept, so GPU clusters keep their own CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE_PYTHON=${PYTHON:-python3}
VENV=.venv
TEST=0
LEROBOT=0
for arg in "$@"; do
    case "$arg" in
        --test) TEST=1 ;;
        --lerobot) LEROBOT=1 ;;
        *) echo "setup: unknown option $arg (options: --test, --lerobot)" >&2; exit 2 ;;
    esac
done
EXTRAS=""
[ "$TEST" = 1 ] && EXTRAS="test"
[ "$LEROBOT" = 1 ] && EXTRAS="${EXTRAS:+$EXTRAS,}lerobot"
EXTRAS=${EXTRAS:+[$EXTRAS]}

# LeRobot needs Python >= 3.12: checked before anything is installed, and said in one line to run.
at_least_312() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; }
python_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo "not found"; }
if [ "$LEROBOT" = 1 ]; then
    if [ -x "$VENV/bin/python" ]; then
        if ! at_least_312 "$VENV/bin/python"; then
            echo "setup: LeRobot needs Python >= 3.12; $VENV is Python $(python_version "$VENV/bin/python"). Make it" \
                 "again from a newer one: rm -rf $VENV && PYTHON=python3.12 bash scripts/setup.sh --lerobot" >&2
            exit 1
        fi
    elif ! at_least_312 "$BASE_PYTHON"; then
        if [ -z "${PYTHON:-}" ]; then  # python3 is older: a newer interpreter on PATH, newest first
            for candidate in python3.14 python3.13 python3.12; do
                if at_least_312 "$candidate"; then BASE_PYTHON=$candidate; break; fi
            done
        fi
        if ! at_least_312 "$BASE_PYTHON"; then
            echo "setup: LeRobot needs Python >= 3.12; $BASE_PYTHON is $(python_version "$BASE_PYTHON") and no" \
                 "python3.12 or newer is on PATH. Install one (your distribution's python3.12 package, or" \
                 "'uv python install 3.12'), then run: PYTHON=python3.12 bash scripts/setup.sh --lerobot" >&2
            exit 1
        fi
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
# CUDA build. 2.13.0 is the CPU wheel this project is tested with. With --lerobot, the extra picks
# torch and torchcodec within LeRobot's bounds (it needs torch < 2.12) unless a torch is installed.
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
# A torch already installed stays (GPU clusters keep theirs); with --lerobot there may be none yet.
TORCH_PIN=$("$PYTHON" -c "import torch; print('torch==' + torch.__version__.split('+')[0])" 2>/dev/null || true)
pip_install -e ".${EXTRAS}" ${TORCH_PIN:+"$TORCH_PIN"}
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
    "$PYTHON" -c "import lerobot" && echo "setup: LeRobot installed: $VENV/bin/python -m episodestream lerobot-train" \
        "--help lists its options" >&2
fi
echo "setup: done; run with $VENV/bin/python (e.g. $VENV/bin/python -m episodestream demo)" >&2
